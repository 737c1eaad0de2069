"""Calls benchmark: how fast a call starts, and how many one runner holds.

    python -m bench.calls [--quick] [--data-dir DIR]

Every figure goes through the real management API (``POST /v1/sessions`` over HTTP) of a
runner started in this process with the loopback transport and no agent
(``conversation_factory=None``), so it measures the runner: HTTP, the checks, the call's
nursery, the loopback join and the journal's ``curb.started`` commit.

1. Start-to-connected latency: the time from sending ``POST /v1/sessions`` to its 202
   (which comes once the call is connected), p50 and p99, one client at a time and with
   10 concurrent clients. Each call is stopped after it started, so the runner holds at
   most a few. Beside it, ``GET /health`` over the same client at the same concurrency:
   the HTTP floor (client and runner share one process, so the client's cost is in both).
2. Held calls: ramp up the calls one runner holds (1, 10, 100, 500, 1000, 2000, ...),
   and at each level measure the process RSS (``VmRSS`` of /proc/self/status; client and
   runner share the process), RSS per call, the start latency of a few more calls and
   ``GET /v1/runner``. The ramp stops at the cap, when memory per call or start latency
   degrade, when the machine runs low on memory, or when its time is up; the last level
   reached without degrading is the figure. Then the drain that ends them all is timed.

Results go to ``bench/results/calls-<UTC>.json`` and ``calls-latest.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio

from runner.calls import Runner
from runner.config import Config
from runner.runtime import serve_runner
from runner.transports.loopback import LoopbackTransport
from runner.wire import StartCallRequest, json_bytes

from ._common import (
    Budget,
    fmt,
    freeze_heap_as_the_runner_does,
    machine_info,
    print_table,
    ratio,
    say,
    summarize,
    write_results,
)

TOKEN = "bench-calls-token"
LATENCY_DEGRADED = 3.0  # a level whose start p50 is this many times level 1's has degraded
MEMORY_DEGRADED = 3.0  # a level whose RSS per added call is this many times the first level's
MEMORY_NOISE_KB = 64.0  # per-call growth below this never counts as degraded (allocator noise)
MIN_AVAILABLE_SHARE = 0.25  # stop ramping while the machine keeps at least this share of its memory


@attrs.frozen(kw_only=True)
class Profile:
    name: str
    sequential_calls: int = 300
    sequential_seconds: float = 6.0
    concurrent_clients: int = 10
    concurrent_calls: int = 1_000
    concurrent_seconds: float = 6.0
    health_requests: int = 300
    levels: tuple[int, ...] = (1, 10, 100, 500, 1_000)
    fill_clients: int = 20
    probe_calls: int = 30  # starts measured at each level, each stopped again
    status_samples: int = 3  # GET /v1/runner at each level; the median counts
    poll_pairs: int = 2  # at the most calls held: probe windows without and with a 1 Hz poller
    poll_window_seconds: float = 4.0
    ramp_seconds: float = 25.0  # every level's fill and probes together
    fill_in_process: bool = False  # fill through Runner.start_call, not HTTP (the probes stay HTTP)
    total_seconds: float = 55.0


QUICK = Profile(name="quick")
FULL = Profile(
    name="full",
    sequential_calls=3_000,
    sequential_seconds=30.0,
    concurrent_calls=10_000,
    concurrent_seconds=30.0,
    health_requests=2_000,
    levels=(1, 10, 100, 500, 1_000, 2_000, 5_000, 10_000, 20_000, 50_000),
    probe_calls=100,
    poll_pairs=4,
    poll_window_seconds=8.0,
    ramp_seconds=480.0,
    total_seconds=660.0,
)


def _meminfo(path: str, *keys: str) -> dict[str, int]:
    """Fields of a /proc file in kB (``VmRSS:  1234 kB``)."""
    found: dict[str, int] = {}
    with open(path, encoding="ascii") as file:
        for line in file:
            key, _, rest = line.partition(":")
            if key in keys:
                found[key] = int(rest.split()[0])
    return found


def rss_kb() -> int:
    return _meminfo("/proc/self/status", "VmRSS")["VmRSS"]


def available_share() -> float:
    info = _meminfo("/proc/meminfo", "MemTotal", "MemAvailable")
    return info["MemAvailable"] / info["MemTotal"]


def _ms(values: Sequence[float]) -> dict[str, float | int]:
    return summarize(values, scale=1000.0)


class Api:
    """The management API as a host drives it, timing each start."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client

    async def start(self, session_id: str) -> float:
        """Start a loopback call; return seconds from request to its 202 (connected)."""
        body = {"sessionId": session_id, "realtimeUrl": "loopback://bench", "realtimeToken": "t"}
        began = time.perf_counter()
        response = await self.client.post("/v1/sessions", json=body)
        took = time.perf_counter() - began
        if response.status_code != 202:
            raise RuntimeError(f"start {session_id}: {response.status_code} {response.text}")
        answer = response.json()
        if not answer["accepted"] or answer["call"]["state"] != "connected":
            raise RuntimeError(f"start {session_id}: {answer}")
        return took

    async def stop(self, session_id: str) -> float:
        began = time.perf_counter()
        response = await self.client.delete(f"/v1/sessions/{session_id}", params={"reason": "bench"})
        took = time.perf_counter() - began
        if response.status_code != 200 or not response.json()["stopped"]:
            raise RuntimeError(f"stop {session_id}: {response.status_code} {response.text}")
        return took

    async def timed_get(self, path: str) -> tuple[float, Any]:
        began = time.perf_counter()
        response = await self.client.get(path)
        took = time.perf_counter() - began
        if response.status_code != 200:
            raise RuntimeError(f"GET {path}: {response.status_code} {response.text}")
        return took, response.json()


@contextlib.asynccontextmanager
async def open_runner(data_dir: Path, name: str, max_sessions: int):
    """An in-process runner on a free loopback port, and an HTTP client for it."""
    with tempfile.TemporaryDirectory(prefix=f"bench-calls-{name}-", dir=data_dir) as tmp:
        config = Config(
            address="127.0.0.1:0",
            journal_path=Path(tmp) / "journal.db",
            max_sessions=max_sessions,
            drain_grace_ms=50,
        )
        async with trio.open_nursery() as nursery:
            with trio.fail_after(30):
                address, runner = await nursery.start(
                    partial(
                        serve_runner,
                        config,
                        token=TOKEN,
                        transports=[LoopbackTransport()],
                        conversation_factory=None,
                        handle_signals=False,
                    )
                )
            limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
            headers = {"Authorization": f"Bearer {TOKEN}"}
            try:
                async with httpx.AsyncClient(
                    base_url=f"http://{address}", headers=headers, timeout=60, limits=limits
                ) as client:
                    yield runner, Api(client)
            finally:
                runner.drain_nowait("drain_request")
                with trio.fail_after(60):
                    await runner.wait_drained()


# -- 1. start-to-connected latency --------------------------------------------------------------


async def measure_latency(profile: Profile, data_dir: Path) -> dict[str, Any]:
    results: dict[str, Any] = {}
    async with open_runner(data_dir, "latency", max_sessions=profile.concurrent_clients + 10) as (
        runner,
        api,
    ):
        # Warm up: imports, the first connections, the journal's first pages.
        for i in range(20):
            await api.start(f"warm-{i}")
            await api.stop(f"warm-{i}")

        health: list[float] = []
        budget = Budget(profile.health_requests, 5.0)
        for _ in range(budget.count):
            if budget.expired():
                break
            took, _ = await api.timed_get("/health")
            health.append(took)
        results["health_ms"] = _ms(health)

        health = []
        budget = Budget(profile.health_requests, 5.0)

        async def health_loop() -> None:
            while len(health) < budget.count and not budget.expired():
                took, _ = await api.timed_get("/health")
                health.append(took)

        async with trio.open_nursery() as nursery:
            for _ in range(profile.concurrent_clients):
                nursery.start_soon(health_loop)
        results["health_concurrent_ms"] = _ms(health)

        starts: list[float] = []
        stops: list[float] = []
        budget = Budget(profile.sequential_calls, profile.sequential_seconds)
        for i in range(budget.count):
            if budget.expired():
                break
            starts.append(await api.start(f"seq-{i}"))
            stops.append(await api.stop(f"seq-{i}"))
        elapsed = time.perf_counter() - budget.started
        results["sequential"] = {
            "clients": 1,
            "calls": len(starts),
            "start_ms": _ms(starts),
            "stop_ms": _ms(stops),
            "calls_per_s": len(starts) / elapsed,
        }
        say(
            f"  sequential: {len(starts)} calls, start p50 {fmt(results['sequential']['start_ms']['p50'])} ms,"
            f" p99 {fmt(results['sequential']['start_ms']['p99'])} ms (health p50 {fmt(results['health_ms']['p50'])} ms)"
        )

        starts = []
        budget = Budget(profile.concurrent_calls, profile.concurrent_seconds)
        per_client = -(-profile.concurrent_calls // profile.concurrent_clients)

        async def client_loop(k: int) -> None:
            for i in range(per_client):
                if budget.expired():
                    return
                starts.append(await api.start(f"conc-{k}-{i}"))
                await api.stop(f"conc-{k}-{i}")

        with trio.fail_after(profile.concurrent_seconds + 30):
            async with trio.open_nursery() as nursery:
                for k in range(profile.concurrent_clients):
                    nursery.start_soon(client_loop, k)
        elapsed = time.perf_counter() - budget.started
        results["concurrent"] = {
            "clients": profile.concurrent_clients,
            "calls": len(starts),
            "start_ms": _ms(starts),
            "calls_per_s": len(starts) / elapsed,
        }
        say(
            f"  {profile.concurrent_clients} clients: {len(starts)} calls, start p50"
            f" {fmt(results['concurrent']['start_ms']['p50'])} ms, p99 {fmt(results['concurrent']['start_ms']['p99'])} ms"
        )
        assert not runner.calls, "every measured call was stopped"
    return results


# -- 2. held calls ------------------------------------------------------------------------------


async def _fill(
    api: Api, runner: Runner, target: int, clients: int, deadline: float, *, in_process: bool = False
) -> int:
    """Start held calls until the runner holds ``target`` (or time is up); return how many it holds."""
    next_id = len(runner.calls)

    async def start(session_id: str) -> None:
        if in_process:
            start = StartCallRequest(
                session_id=session_id, realtime_url="loopback://bench", realtime_token="t"
            )
            await runner.start_call(start)
        else:
            await api.start(session_id)

    async def worker() -> None:
        nonlocal next_id
        while len(runner.calls) < target and time.perf_counter() < deadline:
            i = next_id
            next_id += 1
            if i >= target:
                return
            await start(f"held-{i}")

    async with trio.open_nursery() as nursery:
        for _ in range(clients):
            nursery.start_soon(worker)
    return len(runner.calls)


async def measure_held(profile: Profile, data_dir: Path, deadline: float) -> dict[str, Any]:
    cap = profile.levels[-1]
    ramp_deadline = min(deadline, time.perf_counter() + profile.ramp_seconds)
    levels: list[dict[str, Any]] = []
    stopped_because = "cap"
    async with open_runner(data_dir, "held", max_sessions=cap + profile.probe_calls + 10) as (runner, api):
        for i in range(20):
            await api.start(f"warm-{i}")
            await api.stop(f"warm-{i}")
        gc.collect()
        base_rss = rss_kb()
        say(f"  base RSS {fmt(base_rss / 1024)} MiB")
        previous_level, previous_rss = 0, base_rss
        for level in profile.levels:
            fill_began = time.perf_counter()
            held = await _fill(
                api, runner, level, profile.fill_clients, ramp_deadline, in_process=profile.fill_in_process
            )
            fill_s = time.perf_counter() - fill_began
            if held < level:
                stopped_because = f"time: held {held} of {level} when the ramp's time ran out"
                break
            gc.collect()
            rss = rss_kb()

            async def probe(attempt: int, level: int = level) -> dict[str, float | int]:
                took: list[float] = []
                for i in range(profile.probe_calls):
                    if time.perf_counter() >= ramp_deadline:
                        break
                    took.append(await api.start(f"probe-{level}-{attempt}-{i}"))
                    await api.stop(f"probe-{level}-{attempt}-{i}")
                return _ms(took)

            start_ms = await probe(0)
            status_ms, status_cpu_ms, build_ms, rebuild_ms = [], [], [], []
            for _ in range(profile.status_samples):
                cpu = time.thread_time()
                status_s, status = await api.timed_get("/v1/runner")
                # Client and runner share this thread: CPU time is both, but not other processes'.
                status_cpu_ms.append((time.thread_time() - cpu) * 1000)
                status_ms.append(status_s * 1000)
                assert status["activeSessions"] == level, status["activeSessions"]
                began = time.perf_counter()
                runner.status_json()
                build_ms.append((time.perf_counter() - began) * 1000)
                # The baseline: what the answer cost before (every call's LiveCall built and encoded).
                began = time.perf_counter()
                json_bytes(runner.status())
                rebuild_ms.append((time.perf_counter() - began) * 1000)
            own_process_ms = await _status_from_own_process(api, max(5, profile.status_samples))
            row = {
                "held": level,
                "fill_s": fill_s,
                "fill_calls_per_s": (level - previous_level) / fill_s if fill_s else None,
                "rss_mib": rss / 1024,
                "rss_per_call_kib": (rss - base_rss) / level,
                "rss_per_added_call_kib": (rss - previous_rss) / (level - previous_level),
                "start_ms": start_ms,
                "probe_attempts": 1,
                "runner_status_ms": statistics.median(status_ms),
                # From a process of its own, to the last byte: the runner's answer without the
                # in-process client's reading on the runner's loop.
                "runner_status_own_process_ms": statistics.median(own_process_ms),
                "runner_status_own_process_samples_ms": own_process_ms,
                "loadavg_1min": os.getloadavg()[0],
                "runner_status_cpu_ms": statistics.median(status_cpu_ms),
                "runner_status_build_ms": statistics.median(build_ms),
                "runner_status_rebuild_ms": statistics.median(rebuild_ms),
                "runner_status_bytes": len(runner.status_json()),
                "available_share": available_share(),
            }
            levels.append(row)
            # Latency on a shared machine is noisy: a level degraded only if it stays slow
            # when probed again (noise only ever adds, so the fastest attempt counts).
            degraded = _degraded(levels)
            while degraded and degraded.startswith("start") and row["probe_attempts"] < 3:
                again = await probe(row["probe_attempts"])
                row["probe_attempts"] += 1
                if again.get("p50", float("inf")) < row["start_ms"].get("p50", float("inf")):
                    row["start_ms"] = again
                degraded = _degraded(levels)
            say(
                f"  held {level:>6}: RSS {fmt(row['rss_mib'])} MiB, {fmt(row['rss_per_call_kib'])} KiB/call"
                f" ({fmt(row['rss_per_added_call_kib'])} KiB per added call), start p50"
                f" {fmt(row['start_ms'].get('p50'))} ms p99 {fmt(row['start_ms'].get('p99'))} ms,"
                f" GET /v1/runner {fmt(row['runner_status_own_process_ms'])} ms from its own process"
                f" ({fmt(row['runner_status_ms'])} in-process), filled at {fmt(row['fill_calls_per_s'])} calls/s"
                f" (load {row['loadavg_1min']:.1f})"
            )
            if degraded:
                row["degraded"] = degraded
                stopped_because = f"degraded at {level}: {degraded}"
                break
            if row["available_share"] < MIN_AVAILABLE_SHARE:
                stopped_because = (
                    f"memory: {row['available_share']:.0%} of the machine's memory left at {level}"
                )
                break
            if time.perf_counter() >= ramp_deadline and level != cap:
                stopped_because = f"time: the ramp's time ran out after {level}"
                break
            previous_level, previous_rss = level, rss
        say(f"  a host polling GET /v1/runner every second, at {len(runner.calls)} calls")
        polled = await measure_poll_impact(profile, api, len(runner.calls))
        held_now = len(runner.calls)
        drain_began = time.perf_counter()
        runner.drain_nowait("drain_request")
        with trio.fail_after(120):
            await runner.wait_drained()
        drain_s = time.perf_counter() - drain_began
    good = [row for row in levels if "degraded" not in row]
    return {
        "polled": polled,
        "base_rss_mib": base_rss / 1024,
        "levels": levels,
        "held_max": good[-1]["held"] if good else 0,
        "stopped_because": stopped_because,
        "drain": {"calls": held_now, "seconds": drain_s},
    }


async def _status_from_own_process(api: Api, count: int) -> list[float]:
    """``count`` sequential ``GET /v1/runner`` from ``bench._status_timer``, ms to the last byte each."""
    address = str(api.client.base_url).removeprefix("http://").rstrip("/")
    token = api.client.headers["Authorization"].removeprefix("Bearer ")
    command = [sys.executable, "-m", "bench._status_timer", address, token, str(count)]
    with trio.fail_after(120):
        done = await trio.run_process(command, capture_stdout=True)
    return [float(line.split()[0]) for line in done.stdout.decode().splitlines()]


async def measure_poll_impact(profile: Profile, api: Api, held: int) -> dict[str, Any]:
    """Start latency while a host polls ``GET /v1/runner`` once a second, against none.

    The poller is a process of its own (``bench._status_poller``), as a host is, so the
    runner's loop pays only for answering. Windows alternate (without, with, with, without,
    ...) and each side's latencies are pooled.
    """
    url = str(api.client.base_url)
    token = api.client.headers["Authorization"].removeprefix("Bearer ")
    sides: dict[str, list[float]] = {"without": [], "with": []}
    polls: list[float] = []
    n = 0

    cpu_s: dict[str, float] = {"without": 0.0, "with": 0.0}

    async def probe_window(side: str) -> list[float]:
        nonlocal n
        took: list[float] = []
        cpu = time.thread_time()
        ends = time.perf_counter() + profile.poll_window_seconds
        while time.perf_counter() < ends:
            n += 1
            took.append(await api.start(f"poll-{n}"))
            await api.stop(f"poll-{n}")
        cpu_s[side] += time.thread_time() - cpu
        return took

    order = [("without", "with") if k % 2 == 0 else ("with", "without") for k in range(profile.poll_pairs)]
    for pair in order:
        for side in pair:
            if side == "without":
                sides[side] += await probe_window(side)
                continue
            command = [
                sys.executable,
                "-m",
                "bench._status_poller",
                url,
                token,
                str(profile.poll_window_seconds + 0.5),
            ]
            with trio.fail_after(profile.poll_window_seconds + 30):
                poller = await trio.lowlevel.open_process(command, stdout=subprocess.PIPE)
                try:
                    assert poller.stdout is not None
                    lines = _lines(poller.stdout)
                    assert await lines.__anext__() == "ready"
                    sides[side] += await probe_window(side)
                    async for line in lines:
                        polls.append(float(line.split()[0]))
                finally:
                    if poller.returncode is None:
                        poller.kill()
                    with trio.CancelScope(shield=True):
                        await poller.wait()
    # The loop's CPU beyond what the probes cost without a poller: what answering the polls cost.
    per_probe = cpu_s["without"] / max(1, len(sides["without"]))
    extra_s = cpu_s["with"] - per_probe * len(sides["with"])
    return {
        "held": held,
        "loop_cpu_ms_per_poll": extra_s * 1000 / max(1, len(polls)),
        "loop_cpu_ms_per_probe_without": per_probe * 1000,
        "pairs": profile.poll_pairs,
        "window_seconds": profile.poll_window_seconds,
        "start_ms_without": _ms(sides["without"]),
        "start_ms_with": _ms(sides["with"]),
        "poll_ms": _ms([p / 1000 for p in polls]),
    }


async def _lines(stream: trio.abc.ReceiveStream):
    buffer = b""
    async for chunk in stream:
        buffer += chunk
        *complete, buffer = buffer.split(b"\n")
        for line in complete:
            yield line.decode()


def _degraded(levels: Sequence[dict[str, Any]]) -> str | None:
    """Why the last level degraded against the first ones, or None."""
    last, first = levels[-1], levels[0]
    first_p50 = first["start_ms"].get("p50")
    last_p50 = last["start_ms"].get("p50")
    if first_p50 and last_p50 and last_p50 > LATENCY_DEGRADED * first_p50:
        return f"start p50 {last_p50:.2f} ms is over {LATENCY_DEGRADED}x level {first['held']}'s {first_p50:.2f} ms"
    # Memory per added call against the first level large enough to measure it (100 calls).
    sized = [row for row in levels if row["held"] >= 100]
    if len(sized) >= 2:
        reference = max(sized[0]["rss_per_added_call_kib"], 1.0)
        added = last["rss_per_added_call_kib"]
        if added > MEMORY_NOISE_KB and added > MEMORY_DEGRADED * reference:
            return f"{added:.1f} KiB per added call is over {MEMORY_DEGRADED}x the {reference:.1f} KiB at {sized[0]['held']}"
    return None


# -- report -------------------------------------------------------------------------------------


async def _run(profile: Profile, data_dir: Path) -> dict[str, Any]:
    deadline = time.perf_counter() + profile.total_seconds
    say("1. start-to-connected latency")
    latency = await measure_latency(profile, data_dir)
    say("2. held calls")
    held = await measure_held(profile, data_dir, deadline)
    return {"latency": latency, "held": held}


def _table(got: dict[str, Any]) -> list[list[str]]:
    latency, held = got["latency"], got["held"]
    rows = []
    for key, health in (
        ("sequential", latency["health_ms"]),
        ("concurrent", latency["health_concurrent_ms"]),
    ):
        row = latency[key]
        start = row["start_ms"]
        rows.append(
            [
                f"start to connected, {row['clients']} client{'s' if row['clients'] > 1 else ''}, ms",
                f"p50 {fmt(start['p50'])}  p99 {fmt(start['p99'])}",
                f"{fmt(row['calls_per_s'])} calls/s ({row['calls']} calls)",
                f"{fmt(ratio(start['p50'], health['p50']))}x GET /health p50 at the same concurrency ({fmt(health['p50'])} ms)",
            ]
        )
    stop = latency["sequential"]["stop_ms"]
    rows.append(
        ["stop (DELETE) to ended, 1 client, ms", f"p50 {fmt(stop['p50'])}  p99 {fmt(stop['p99'])}", "", ""]
    )
    for row in held["levels"]:
        start = row["start_ms"]
        rows.append(
            [
                f"held {row['held']}",
                f"RSS {fmt(row['rss_mib'])} MiB, {fmt(row['rss_per_call_kib'])} KiB/call",
                f"start p50 {fmt(start.get('p50'))} p99 {fmt(start.get('p99'))} ms",
                f"GET /v1/runner {fmt(row['runner_status_own_process_ms'])} ms from a process of its own,"
                f" {fmt(row['runner_status_ms'])} in-process (CPU {fmt(row['runner_status_cpu_ms'])},"
                f" runner's join {fmt(row['runner_status_build_ms'])}, against"
                f" {fmt(row['runner_status_rebuild_ms'])} to build and encode every call)"
                + (f"; DEGRADED: {row['degraded']}" if "degraded" in row else ""),
            ]
        )
    rows.append(
        [
            "most calls held without degrading",
            str(held["held_max"]),
            f"stopped: {held['stopped_because']}",
            "",
        ]
    )
    polled = held["polled"]
    without, with_ = polled["start_ms_without"], polled["start_ms_with"]
    rows.append(
        [
            f"start while a host polls GET /v1/runner at 1 Hz, {polled['held']} calls held",
            f"p50 {fmt(with_.get('p50'))}  p99 {fmt(with_.get('p99'))} ms",
            f"without the poller: p50 {fmt(without.get('p50'))}  p99 {fmt(without.get('p99'))} ms",
            f"poll p50 {fmt(polled['poll_ms'].get('p50'))} ms from its own process ({polled['poll_ms'].get('n')} polls);"
            f" the runner's loop spent {fmt(polled['loop_cpu_ms_per_poll'])} ms CPU a poll",
        ]
    )
    drain = held["drain"]
    rows.append(["drain of the held calls", f"{fmt(drain['seconds'])} s", f"{drain['calls']} calls", ""])
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.calls", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the short profile (under a minute)")
    parser.add_argument(
        "--fill-in-process",
        action="store_true",
        help="start the held calls through Runner.start_call rather than HTTP (faster on a loaded machine)",
    )
    parser.add_argument(
        "--levels", help="the held-call levels, comma-separated (default: the profile's)", default=None
    )
    parser.add_argument(
        "--data-dir", type=Path, default=Path(tempfile.gettempdir()), help="where the journals go"
    )
    args = parser.parse_args(argv)
    freeze_heap_as_the_runner_does()
    profile = QUICK if args.quick else FULL
    if args.fill_in_process:
        profile = attrs.evolve(profile, fill_in_process=True)
    if args.levels:
        profile = attrs.evolve(profile, levels=tuple(int(n) for n in args.levels.split(",")))
    data_dir: Path = args.data_dir
    data_dir.mkdir(parents=True, exist_ok=True)
    command = " ".join(["python -m bench.calls", *(argv if argv is not None else sys.argv[1:])])
    machine = machine_info(data_dir)
    say(
        f"{command}: {machine['cores']} cores, Python {machine['python']}, data on {machine['data_filesystem']}"
    )
    began = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):  # the runners' lifecycle lines
        got = trio.run(_run, profile, data_dir)
    elapsed = time.perf_counter() - began
    rows = _table(got)
    results = {
        "benchmark": "calls",
        "profile": profile.name,
        "command": command,
        "finished_at_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "seconds": elapsed,
        "machine": machine,
        "parameters": attrs.asdict(profile),
        "criteria": {
            "latency_degraded_factor": LATENCY_DEGRADED,
            "memory_degraded_factor": MEMORY_DEGRADED,
            "memory_noise_kib": MEMORY_NOISE_KB,
            "min_available_share": MIN_AVAILABLE_SHARE,
        },
        "notes": "in-process runner, loopback transport, no agent; RSS is the whole process (runner and client)",
        **got,
        "table": [dict(zip(("figure", "value", "rate", "note"), row, strict=True)) for row in rows],
    }
    path = write_results("calls", results)
    print()
    print(
        f"{command} ({profile.name}, {elapsed:.0f} s; {machine['cores']} cores, Python {machine['python']},"
        f" data on {machine['data_filesystem']})"
    )
    print_table(("figure", "value", "rate", "note"), rows)
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
