"""Messages benchmark: host messages to agents, and agents' messages to a stream follower.

    python -m bench.messages [--quick] [--data-dir DIR]

Every figure goes through the real management API (HTTP on 127.0.0.1) of a runner started in
this process with the loopback transport and a small agent whose host handlers do nothing
(``ping``) or send one message back to the host (``echo`` calls ``ctx.send.to_host``).

1. Host-message round trip: the time from sending ``POST /v1/sessions/{id}/messages`` to its
   202 (which comes once the agent's handlers ran), p50 and p99, one client at a time, with
   1 call live and with 100 calls live (messages spread over all of them); then, with 100
   calls live, 10 clients at once.
2. Agent-to-host record latency: a follower reads ``GET /v1/runner/events`` over a raw
   socket; the time from sending the POST of an ``echo`` to the arrival of the ``host``
   record its handler sent (journaled, committed, then streamed), with 1 and 100 calls live.
3. Both at a third level, the most calls (``--most-calls``; by default what ``bench.calls``
   last held). Baselines: ``GET /health`` on the same runner and client for the round trip;
   the echo's own POST-to-202 for the record latency.

Client, follower and runner share one process (and its one Trio loop), so the client's own
cost is inside every figure. Results go to ``bench/results/messages-<UTC>.json`` and
``messages-latest.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio

from runner.agent import Agent, Context, conversation_factory
from runner.config import Config
from runner.runtime import serve_runner
from runner.transports.loopback import LoopbackTransport

from ._common import (
    RESULTS_DIR,
    Budget,
    EventsReader,
    fmt,
    freeze_heap_as_the_runner_does,
    machine_info,
    print_table,
    say,
    summarize,
    write_results,
)

TOKEN = "bench-messages-token"
LIVE_CALLS = 100
CONCURRENT_CLIENTS = 10

agent = Agent("bench-messages", instructions="You relay messages.")


@agent.on_message("ping", sender="host")
def _ping(ctx: Context, payload: dict[str, Any]) -> None:
    return None


@agent.on_message("echo", sender="host")
def _echo(ctx: Context, payload: dict[str, Any]) -> None:
    ctx.send.to_host("pong", payload)


@attrs.frozen(kw_only=True)
class Profile:
    name: str
    round_trips: int = 400
    round_trip_seconds: float = 6.0
    echoes: int = 300
    echo_seconds: float = 6.0
    warmup: int = 50


QUICK = Profile(name="quick")
FULL = Profile(
    name="full", round_trips=5_000, round_trip_seconds=40.0, echoes=3_000, echo_seconds=40.0, warmup=200
)


def _ms(values: Sequence[float]) -> dict[str, float | int]:
    return summarize(values, scale=1000.0)


class Host:
    """The management API as a host drives it, timing each message."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client
        self._next = 0

    def next_id(self) -> str:
        self._next += 1
        return f"m-{self._next}"

    async def start(self, session_id: str) -> None:
        body = {"sessionId": session_id, "realtimeUrl": "loopback://bench", "realtimeToken": "t"}
        response = await self.client.post("/v1/sessions", json=body)
        if response.status_code != 202:
            raise RuntimeError(f"start {session_id}: {response.status_code} {response.text}")

    async def send(self, session_id: str, name: str, payload: dict[str, Any]) -> float:
        """POST one message; return seconds from request to its 202."""
        message_id = self.next_id()
        body = {"id": message_id, "name": name, "payload": payload}
        began = time.perf_counter()
        response = await self.client.post(f"/v1/sessions/{session_id}/messages", json=body)
        took = time.perf_counter() - began
        if response.status_code != 202 or response.json() != {"id": message_id, "delivered": True}:
            raise RuntimeError(f"message to {session_id}: {response.status_code} {response.text}")
        return took


class Pongs:
    """Reads the events stream and notes when each ``pong`` host record arrived."""

    def __init__(self, reader: EventsReader) -> None:
        self._reader = reader
        self.arrived_ns: dict[int, int] = {}
        self._waiting: dict[int, trio.Event] = {}

    def expect(self, n: int) -> trio.Event:
        event = trio.Event()
        self._waiting[n] = event
        return event

    async def serve(self) -> None:
        while (got := await self._reader.receive_lines()) is not None:
            arrived, lines = got
            for line in lines:
                if b'"class":"host"' not in line:
                    continue
                body = json.loads(line)["body"]
                if body["name"] == "pong":
                    n = body["payload"]["n"]
                    self.arrived_ns[n] = arrived
                    if (event := self._waiting.pop(n, None)) is not None:
                        event.set()


@contextlib.asynccontextmanager
async def open_runner(data_dir: Path, max_sessions: int) -> AsyncIterator[tuple[str, Host]]:
    """An in-process runner on a free loopback port serving the bench agent, and a host client."""
    with tempfile.TemporaryDirectory(prefix="bench-messages-", dir=data_dir) as tmp:
        config = Config(
            address="127.0.0.1:0",
            journal_path=Path(tmp) / "journal.db",
            max_sessions=max_sessions,
            drain_grace_ms=0,
        )
        returned = trio.Event()

        async def serve(*, task_status: trio.TaskStatus[Any]) -> None:
            try:
                await serve_runner(
                    config,
                    token=TOKEN,
                    transports=[LoopbackTransport()],
                    conversation_factory=conversation_factory(agent, host_connected=True),
                    handle_signals=False,
                    task_status=task_status,
                )
            finally:
                returned.set()

        async with trio.open_nursery() as nursery:
            with trio.fail_after(30):
                address, runner = await nursery.start(serve)
            limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
            headers = {"Authorization": f"Bearer {TOKEN}"}
            try:
                async with httpx.AsyncClient(
                    base_url=f"http://{address}", headers=headers, timeout=60, limits=limits
                ) as client:
                    yield address, Host(client)
            finally:
                # Drain and let the runner return by itself (never cancel it mid-shutdown).
                runner.drain_nowait("drain_request")
                with trio.CancelScope(shield=True), trio.fail_after(60):
                    await returned.wait()


def _figures(clients: int, calls: Sequence[str], took: Sequence[float], elapsed: float) -> dict[str, Any]:
    return {
        "clients": clients,
        "calls_live": len(calls),
        "messages": len(took),
        "per_s": len(took) / elapsed,
        "round_trip_ms": _ms(took),
    }


async def round_trips(host: Host, calls: Sequence[str], count: int, seconds: float) -> dict[str, Any]:
    """One client: ``ping`` messages spread over ``calls``, each POST timed to its 202."""
    took: list[float] = []
    budget = Budget(count, seconds)
    for i in range(budget.count):
        if budget.expired():
            break
        took.append(await host.send(calls[i % len(calls)], "ping", {"i": i}))
    elapsed = time.perf_counter() - budget.started
    return _figures(1, calls, took, elapsed)


async def concurrent_round_trips(
    host: Host, calls: Sequence[str], clients: int, count: int, seconds: float
) -> dict[str, Any]:
    """``clients`` clients at once, each sending ``ping`` messages round-robin over ``calls``."""
    took: list[float] = []
    budget = Budget(count, seconds)
    share = max(1, count // clients)

    async def client(worker: int) -> None:
        for i in range(share):
            if budget.expired():
                return
            took.append(await host.send(calls[(worker + i * clients) % len(calls)], "ping", {"i": i}))

    async with trio.open_nursery() as nursery:
        for worker in range(clients):
            nursery.start_soon(client, worker)
    elapsed = time.perf_counter() - budget.started
    return _figures(clients, calls, took, elapsed)


async def echo_latency(
    host: Host, pongs: Pongs, calls: Sequence[str], first: int, count: int, seconds: float
) -> dict[str, Any]:
    """``echo`` messages one at a time: POST to 202, and POST to the host record on the stream."""
    to_record: list[float] = []
    to_answer: list[float] = []
    budget = Budget(count, seconds)
    for i in range(budget.count):
        if budget.expired():
            break
        n = first + i
        arrived = pongs.expect(n)
        began = time.monotonic_ns()
        to_answer.append(await host.send(calls[i % len(calls)], "echo", {"n": n}))
        with trio.fail_after(10):
            await arrived.wait()
        to_record.append((pongs.arrived_ns[n] - began) / 1e9)
    return {
        "calls_live": len(calls),
        "messages": len(to_record),
        "record_ms": _ms(to_record),
        "round_trip_ms": _ms(to_answer),
    }


async def health_round_trips(host: Host, count: int, seconds: float) -> dict[str, Any]:
    """The baseline: ``GET /health`` one at a time on the same runner, same client."""
    took: list[float] = []
    budget = Budget(count, seconds)
    for _ in range(budget.count):
        if budget.expired():
            break
        began = time.perf_counter()
        response = await host.client.get("/health")
        took.append(time.perf_counter() - began)
        if response.status_code != 200:
            raise RuntimeError(f"GET /health: {response.status_code}")
    return {"requests": len(took), "ms": _ms(took)}


async def _run(profile: Profile, data_dir: Path, levels: Sequence[int]) -> dict[str, Any]:
    results: dict[str, Any] = {"levels": []}
    async with open_runner(data_dir, max_sessions=max(levels) + 10) as (address, host):
        reader = await EventsReader.connect(address, TOKEN)  # follows from now on
        if reader.status != 200:
            raise RuntimeError(f"events stream: {reader.status} {reader.error_body!r}")
        pongs = Pongs(reader)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pongs.serve)
            await host.start("call-0")
            live = ["call-0"]
            for i in range(profile.warmup):  # imports, connections, the journal's first pages
                await host.send("call-0", "ping", {"i": i})
            for n, level in enumerate(levels):
                if level > len(live):
                    say(f"   starting {level - len(live)} more calls")
                    more = [f"call-{i}" for i in range(len(live), level)]
                    limit = trio.CapacityLimiter(20)

                    async def start_one(session_id: str, limit: trio.CapacityLimiter = limit) -> None:
                        async with limit:
                            await host.start(session_id)

                    async def first_message(session_id: str, limit: trio.CapacityLimiter = limit) -> None:
                        async with limit:
                            await host.send(session_id, "ping", {})

                    with trio.fail_after(60 + level / 20):  # bounded even when the runner slows down
                        async with trio.open_nursery() as starting:
                            for session_id in more:
                                starting.start_soon(start_one, session_id)
                        async with (
                            trio.open_nursery() as warming
                        ):  # each call's first message, out of the figures
                            for session_id in more:
                                warming.start_soon(first_message, session_id)
                    live += more
                calls = live[:level]
                say(f"1. host-message round trip, {level} calls live")
                row = {"calls_live": level}
                row["health"] = await health_round_trips(
                    host, profile.round_trips, profile.round_trip_seconds
                )
                row["sequential"] = await round_trips(
                    host, calls, profile.round_trips, profile.round_trip_seconds
                )
                row["concurrent"] = await concurrent_round_trips(
                    host, calls, CONCURRENT_CLIENTS, profile.round_trips, profile.round_trip_seconds
                )
                say(f"2. agent-to-host record latency, {level} calls live")
                row["echo"] = await echo_latency(
                    host, pongs, calls, n * 1_000_000, profile.echoes, profile.echo_seconds
                )
                results["levels"].append(row)
            nursery.cancel_scope.cancel()
        await reader.aclose()
    # The names earlier readers of the results file know.
    by_level = {row["calls_live"]: row for row in results["levels"]}
    if 1 in by_level:
        results["one_call"] = by_level[1]["sequential"]
        results["echo_one_call"] = by_level[1]["echo"]
    if LIVE_CALLS in by_level:
        results["many_calls"] = by_level[LIVE_CALLS]["sequential"]
        results["many_calls_concurrent"] = by_level[LIVE_CALLS]["concurrent"]
        results["echo_many_calls"] = by_level[LIVE_CALLS]["echo"]
    return results


def _table(got: dict[str, Any]) -> list[list[str]]:
    rows = []
    for level in got["levels"]:
        n = level["calls_live"]
        health = level["health"]["ms"]
        for key in ("sequential", "concurrent"):
            row = level[key]
            ms = row["round_trip_ms"]
            rows.append(
                [
                    f"POST message to 202, {n} call{'s' if n > 1 else ''} live,"
                    f" {row['clients']} client{'s' if row['clients'] > 1 else ''}, ms",
                    f"p50 {fmt(ms['p50'])}  p99 {fmt(ms['p99'])}",
                    f"{fmt(row['per_s'])} messages/s ({row['messages']})",
                    f"{fmt(ms['p50'] / health['p50'])}x GET /health p50 ({fmt(health['p50'])} ms, 1 client)"
                    if key == "sequential"
                    else "",
                ]
            )
        row = level["echo"]
        ms = row["record_ms"]
        rows.append(
            [
                f"POST to host record on the stream, {n} call{'s' if n > 1 else ''} live, ms",
                f"p50 {fmt(ms['p50'])}  p99 {fmt(ms['p99'])}",
                f"({row['messages']} messages)",
                f"{fmt(ms['p50'] / row['round_trip_ms']['p50'])}x its POST to 202 p50 ({fmt(row['round_trip_ms']['p50'])} ms)",
            ]
        )
    return rows


def _most_calls_default() -> int:
    """The most calls ``bench.calls`` last held, or 1000."""
    try:
        return int(json.loads((RESULTS_DIR / "calls-latest.json").read_text())["held"]["held_max"])
    except (OSError, ValueError, KeyError, TypeError):
        return 1000


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.messages", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the short profile (well under a minute)")
    parser.add_argument(
        "--data-dir", type=Path, default=Path(tempfile.gettempdir()), help="where the journal goes"
    )
    parser.add_argument(
        "--most-calls",
        type=int,
        default=None,
        help="the third level of live calls (default: the most calls bench.calls last held, or 1000)",
    )
    args = parser.parse_args(argv)
    freeze_heap_as_the_runner_does()
    profile = QUICK if args.quick else FULL
    most = args.most_calls or _most_calls_default()
    levels = sorted({1, LIVE_CALLS, max(1, most)})
    data_dir: Path = args.data_dir
    data_dir.mkdir(parents=True, exist_ok=True)
    command = "python -m bench.messages" + (" --quick" if args.quick else "")
    machine = machine_info(data_dir)
    say(
        f"{command}: {machine['cores']} cores, Python {machine['python']}, data on {machine['data_filesystem']}"
    )
    began = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):  # the runner's lifecycle lines
        got = trio.run(_run, profile, data_dir, levels)
    elapsed = time.perf_counter() - began
    rows = _table(got)
    results = {
        "benchmark": "messages",
        "profile": profile.name,
        "command": command,
        "finished_at_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "seconds": elapsed,
        "machine": machine,
        "parameters": {**attrs.asdict(profile), "levels": levels, "concurrent_clients": CONCURRENT_CLIENTS},
        "notes": "in-process runner, loopback transport, one Trio loop shared by runner, HTTP client and stream follower",
        **got,
        "table": [dict(zip(("figure", "value", "rate", "baseline"), row, strict=True)) for row in rows],
    }
    path = write_results("messages", results)
    print()
    print(
        f"{command} ({profile.name}, {elapsed:.0f} s; {machine['cores']} cores, Python {machine['python']},"
        f" data on {machine['data_filesystem']})"
    )
    print_table(("figure", "value", "rate", "baseline"), rows)
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
