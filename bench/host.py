"""Host-client benchmark: ``runner.host`` against the same work done with raw httpx, in one run.

    python -m bench.host [--quick] [--data-dir DIR]

1. Placements per second across 4 runner processes (``runner serve``, loopback transport,
   an agent that writes nothing of its own): C concurrent placers call
   ``RunnerPool.start_call`` (the pool watching every runner: status polls and events
   streams). Baseline: the same starts posted with one ``httpx.AsyncClient`` per runner,
   round-robin, by the same number of placers, with no pool.
2. A follower's catch-up rate: a runner restarted on a journal holding a backlog of K records
   is read from ``from=0`` until K records came, by ``RunnerClient.follow_events`` (every
   record decoded into a ``JournalRecord``, deduplicated, gap-checked). Baseline: the same
   stream read with httpx ``aiter_lines`` and ``json.loads``, which is what a host without
   the follower would write. Goal: at least 0.8 of the baseline.

Rounds alternate (baseline, client, baseline, client, ...); the best of each is kept. Runner
processes run beside this one on the same cores. Results go to
``bench/results/host-<UTC>.json`` and ``host-latest.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio

from journal import open_journal
from runner.agent import Agent
from runner.host import JournalRecord, RunnerClient, RunnerPool, StartCallRequest
from runner.wire import encode

from ._common import fmt, machine_info, print_table, say, write_results

TOKEN = "bench-host-token"
GOAL_CATCH_UP_RATIO = 0.8
RUNNERS = 4
READY = 'curb-hosted {"event":"ready",'

# The runners' agent: it writes nothing but what a call itself writes.
quiet = Agent("quiet", instructions="You answer briefly.")


@attrs.frozen(kw_only=True)
class Profile:
    name: str
    placements: int  # per round
    placers: int
    placement_rounds: int
    backlog: int
    catch_up_rounds: int


QUICK = Profile(
    name="quick", placements=300, placers=16, placement_rounds=2, backlog=40_000, catch_up_rounds=4
)
FULL = Profile(
    name="full", placements=1500, placers=16, placement_rounds=3, backlog=200_000, catch_up_rounds=6
)


@attrs.define
class RunnerProcess:
    process: trio.Process
    address: str = ""

    @property
    def url(self) -> str:
        return f"http://{self.address}"


@asynccontextmanager
async def run_runner(journal: Path, *extra: str) -> AsyncIterator[RunnerProcess]:
    """``runner serve bench.host:quiet`` on a free loopback port, killed (by pid) at the end."""
    argv = [
        sys.executable,
        "-m",
        "runner",
        "serve",
        "bench.host:quiet",
        "--address",
        "127.0.0.1:0",
        "--public-address",
        "127.0.0.1:0",
        "--journal",
        str(journal),
        *extra,
    ]
    env = {**os.environ, "CURB_MANAGEMENT_TOKEN": TOKEN, "PYTHONUNBUFFERED": "1"}
    process = await trio.lowlevel.open_process(
        argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env
    )
    runner = RunnerProcess(process)
    try:
        assert process.stdout is not None
        buffer = b""
        with trio.fail_after(60):
            while not runner.address:
                chunk = await process.stdout.receive_some(65536)
                if not chunk:
                    raise RuntimeError(f"runner exited before ready: {argv}")
                buffer += chunk
                for line in buffer.decode(errors="replace").splitlines():
                    if line.startswith(READY):
                        runner.address = json.loads(line.removeprefix("curb-hosted "))["address"]
        async with trio.open_nursery() as nursery:

            async def drain_stdout() -> None:
                assert process.stdout is not None
                async for _ in process.stdout:
                    pass

            nursery.start_soon(drain_stdout)
            yield runner
            nursery.cancel_scope.cancel()
    finally:
        if process.returncode is None:
            process.kill()
        with trio.CancelScope(shield=True):
            await process.wait()


def _request(session_id: str) -> StartCallRequest:
    return StartCallRequest(session_id=session_id, realtime_url="loopback:", realtime_token="-")


async def _placers(count: int, placers: int, place: Any) -> float:
    """Run ``place(i)`` for i < count on ``placers`` tasks; the wall time taken."""
    next_index = iter(range(count))

    async def worker() -> None:
        for i in next_index:
            await place(i)

    started = time.perf_counter()
    with trio.fail_after(300):
        async with trio.open_nursery() as nursery:
            for _ in range(placers):
                nursery.start_soon(worker)
    return time.perf_counter() - started


async def measure_placements(profile: Profile, runners: Sequence[RunnerProcess]) -> dict[str, Any]:
    urls = [r.url for r in runners]
    raw_rates: list[float] = []
    pool_rates: list[float] = []
    async with AsyncExitStack() as stack:
        clients = [
            await stack.enter_async_context(
                httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
            )
            for url in urls
        ]
        pool = await stack.enter_async_context(RunnerPool(urls, token=TOKEN, watch_interval_s=1.0))
        for n in range(profile.placement_rounds):

            async def raw(i: int, n: int = n) -> None:
                body = encode(_request(f"raw-{n}-{i}"))
                response = await clients[i % len(clients)].post("/v1/sessions", json=body)
                if response.status_code != 202:
                    raise RuntimeError(f"start answered {response.status_code}: {response.text}")

            async def pooled(i: int, n: int = n) -> None:
                placed = await pool.start_call(_request(f"pool-{n}-{i}"))
                assert placed.response.accepted

            took = await _placers(profile.placements, profile.placers, raw)
            raw_rates.append(profile.placements / took)
            took = await _placers(profile.placements, profile.placers, pooled)
            pool_rates.append(profile.placements / took)
            say(f"  placements round {n + 1}: raw httpx {raw_rates[-1]:,.0f}/s, pool {pool_rates[-1]:,.0f}/s")
        spread = {r.url: r.active_sessions for r in pool.runners}
    return {
        "runners": len(runners),
        "placements_per_round": profile.placements,
        "placers": profile.placers,
        "raw_per_s": raw_rates,
        "pool_per_s": pool_rates,
        "raw_best_per_s": max(raw_rates),
        "pool_best_per_s": max(pool_rates),
        "ratio": max(pool_rates) / max(raw_rates),
        "calls_per_runner_seen_by_pool": spread,
    }


async def write_backlog(path: Path, records: int) -> None:
    """A journal holding ``records`` host records of 100 calls, as agents write them."""
    async with open_journal(path, retention_records=records + 10_000) as journal:

        async def producer(p: int) -> None:
            for i in range(p, records, 100):
                await journal.append(
                    f"call-{p}",
                    "host",
                    {
                        "type": "host",
                        "id": f"h-{i}",
                        "name": "order.update",
                        "payload": {"i": i, "status": "ok"},
                        "expectsReply": False,
                    },
                    stamp=True,
                )

        async with trio.open_nursery() as nursery:
            for p in range(100):
                nursery.start_soon(producer, p)


async def _raw_catch_up(url: str, count: int) -> None:
    async with (
        httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60) as http,
        http.stream("GET", "/v1/runner/events", params={"from": "0"}) as response,
    ):
        seen = 0
        async for line in response.aiter_lines():
            if line and "envelope" in json.loads(line):
                seen += 1
                if seen >= count:
                    return


async def _follower_catch_up(url: str, count: int) -> None:
    async with RunnerClient(url, token=TOKEN) as client, client.follow_events(from_=0) as events:
        seen = 0
        async for item in events:
            if not isinstance(item, JournalRecord):
                raise RuntimeError(f"the backlog has a gap: {item}")
            seen += 1
            if seen >= count:
                return


async def _timed(read: Any, url: str, count: int) -> tuple[float, float]:
    """Records per second (wall), and this process's CPU microseconds per record."""
    wall, cpu = time.perf_counter(), time.process_time()
    with trio.fail_after(300):
        await read(url, count)
    return count / (time.perf_counter() - wall), (time.process_time() - cpu) / count * 1e6


async def measure_catch_up(profile: Profile, runner: RunnerProcess, records: int) -> dict[str, Any]:
    raw: list[tuple[float, float]] = []
    follower: list[tuple[float, float]] = []
    for n in range(profile.catch_up_rounds):
        # Pairs in alternating order, so neither reader always comes second.
        pair = [(raw, _raw_catch_up), (follower, _follower_catch_up)]
        for into, read in pair if n % 2 == 0 else pair[::-1]:
            into.append(await _timed(read, runner.url, records))
        say(
            f"  catch-up pair {n + 1}: raw httpx {raw[-1][0]:,.0f}/s ({raw[-1][1]:.2f} us CPU/record),"
            f" follower {follower[-1][0]:,.0f}/s ({follower[-1][1]:.2f} us CPU/record)"
        )
    ratios = sorted(f[0] / r[0] for r, f in zip(raw, follower, strict=True))
    return {
        "records": records,
        "raw_per_s": [r[0] for r in raw],
        "follower_per_s": [f[0] for f in follower],
        "raw_cpu_us_per_record": [r[1] for r in raw],
        "follower_cpu_us_per_record": [f[1] for f in follower],
        "raw_best_per_s": max(r[0] for r in raw),
        "follower_best_per_s": max(f[0] for f in follower),
        "pair_ratios": ratios,
        "ratio": ratios[len(ratios) // 2] if len(ratios) % 2 else sum(ratios[len(ratios) // 2 - 1 :][:2]) / 2,
        "cpu_ratio": min(r[1] for r in raw) / min(f[1] for f in follower),
        "goal_ratio": GOAL_CATCH_UP_RATIO,
    }


async def run(profile: Profile, data_dir: Path) -> dict[str, Any]:
    backlog = data_dir / "backlog.db"
    say(f"writing a backlog of {profile.backlog:,} records")
    await write_backlog(backlog, profile.backlog)
    capacity = str(profile.placements * profile.placement_rounds)
    async with AsyncExitStack() as stack:
        first = await stack.enter_async_context(
            run_runner(backlog, "--retention", str(profile.backlog + 10_000), "--max-sessions", capacity)
        )
        others = [
            await stack.enter_async_context(run_runner(data_dir / f"r{n}.db", "--max-sessions", capacity))
            for n in range(1, RUNNERS)
        ]
        say("follower catch-up from from=0")
        # The backlog, the runner's ready record, and nothing else yet.
        catch_up = await measure_catch_up(profile, first, profile.backlog + 1)
        say(f"placements across {RUNNERS} runners")
        placements = await measure_placements(profile, [first, *others])
    return {"placements": placements, "catch_up": catch_up}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.host", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--data-dir", help="where the journals go (default: a temporary directory)")
    args = parser.parse_args(argv)
    profile = QUICK if args.quick else FULL
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=args.data_dir) as tmp:
        results = trio.run(run, profile, Path(tmp))
        machine = machine_info(Path(tmp))
    data = {
        "benchmark": "host",
        "command": "python -m bench.host" + (" --quick" if args.quick else ""),
        "profile": profile.name,
        "seconds": time.perf_counter() - began,
        "machine": machine,
        **results,
    }
    path = write_results("host", data)
    p, c = results["placements"], results["catch_up"]
    print_table(
        ("figure", "value", "baseline", "ratio"),
        [
            [
                f"placements/s across {p['runners']} runners ({p['placers']} placers)",
                fmt(p["pool_best_per_s"]),
                f"{fmt(p['raw_best_per_s'])} (raw httpx, round-robin)",
                f"{p['ratio']:.2f}x",
            ],
            [
                f"follower catch-up, records/s ({c['records']:,} records; ratio: median of pairs)",
                fmt(c["follower_best_per_s"]),
                f"{fmt(c['raw_best_per_s'])} (httpx aiter_lines + json.loads)",
                f"{c['ratio']:.2f}x (goal >= {GOAL_CATCH_UP_RATIO})",
            ],
            [
                "host CPU per record caught up, us (lower is better)",
                fmt(min(c["follower_cpu_us_per_record"])),
                f"{fmt(min(c['raw_cpu_us_per_record']))} (the same raw reader)",
                f"{c['cpu_ratio']:.2f}x (raw / follower)",
            ],
        ],
    )
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
