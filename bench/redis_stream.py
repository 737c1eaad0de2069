"""The events stream's baseline: Redis Streams on a ``redis-server`` this script starts on loopback.

    python -m bench.redis_stream [--quick]

The same two trials as ``bench.journal`` runs against ``GET /v1/runner/events``, with the
same parameters (its ``QUICK``/``FULL`` profile):

1. Throughput: F followers (1, 10), each on its own connection, block in ``XREAD`` from the
   last id they saw while 100 concurrent appenders ``XADD`` M records (``MAXLEN ~`` the
   journal's retention window). Figure: lines/s per follower.
2. Append-to-client latency: paced ``XADD`` at the journal trial's rate, each body stamped
   with ``time.monotonic_ns()``; each follower notes when the entry arrived.

Redis runs in memory (no AOF, no RDB snapshots): it does not fsync, the journal does. The
client is ``redis.asyncio`` in this process (one event loop for appenders and followers,
as the runner's trial shares one Trio loop). If ``redis-server`` or the ``redis`` package
is missing the results say ``skipped`` with the reason and how to install it.

Results go to ``bench/results/redis_stream-<UTC>.json`` and ``redis_stream-latest.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ._common import fmt, machine_info, median, print_table, say, summarize, thin, write_results

INSTALL_HINT = "apt-get install -y redis-server   (and: pip install redis, or pip install -e '.[bench]')"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RedisServer:
    """A ``redis-server`` child on 127.0.0.1 and a free port, in memory, stopped by its pid."""

    def __init__(self, executable: str, workdir: Path) -> None:
        self.port = _free_port()
        self.workdir = workdir
        self.process = subprocess.Popen(
            [
                executable,
                "--bind",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "no",
                "--dir",
                str(workdir),
                "--logfile",
                str(workdir / "redis.log"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def wait_ready(self, seconds: float = 10.0) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.process.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(64).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not answer PING within 10 s")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()  # our own child, by its pid
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


def _body(i: int, **extra: Any) -> bytes:
    # The journal benchmark's record body, so both sides carry the same payload.
    return json.dumps({"type": "event", "name": "bench.tick", "payload": {"i": i}, **extra}).encode()


async def _stream_trial(
    redis_mod: Any, port: int, key: str, *, followers: int, records: int, appenders: int, retention: int
) -> dict[str, Any]:
    pool = redis_mod.Redis(host="127.0.0.1", port=port, max_connections=appenders)
    readers = [redis_mod.Redis(host="127.0.0.1", port=port, max_connections=1) for _ in range(followers)]
    seen = [0] * followers
    finished = [math.nan] * followers

    async def follower(i: int) -> None:
        last = b"0-0"
        while seen[i] < records:
            got = await readers[i].xread({key: last}, count=4096, block=1000)
            for _, entries in got:
                if entries:
                    seen[i] += len(entries)
                    last = entries[-1][0]
        finished[i] = time.perf_counter()

    async def append_some(k: int, count: int) -> None:
        for i in range(count):
            await pool.xadd(key, {"body": _body(i)}, maxlen=retention, approximate=True)

    per_task = [records // appenders + (1 if k < records % appenders else 0) for k in range(appenders)]
    async with asyncio.timeout(60):
        tasks = [asyncio.create_task(follower(i)) for i in range(followers)]
        await asyncio.sleep(0.05)  # every follower is blocked in XREAD
        started = time.perf_counter()
        await asyncio.gather(*(append_some(k, c) for k, c in enumerate(per_task)))
        appended_at = time.perf_counter()
        await asyncio.gather(*tasks)
    for client in (pool, *readers):
        await client.aclose()
    rates = [n / (t - started) for n, t in zip(seen, finished, strict=True)]
    return {
        "followers": followers,
        "records": records,
        "received": seen,
        "complete": all(n >= records for n in seen),
        "append_records_per_s": records / (appended_at - started),
        "median_lines_per_s": median(rates),
        "slowest_lines_per_s": min(rates),
    }


async def _latency_trial(
    redis_mod: Any, port: int, key: str, *, followers: int, total: int, rate: int, retention: int
) -> dict[str, Any]:
    pool = redis_mod.Redis(
        connection_pool=redis_mod.BlockingConnectionPool(
            host="127.0.0.1", port=port, max_connections=64, timeout=30
        )
    )
    readers = [redis_mod.Redis(host="127.0.0.1", port=port, max_connections=1) for _ in range(followers)]
    latencies: list[list[int]] = [[] for _ in range(followers)]
    append_latencies: list[int] = []

    async def follower(i: int) -> None:
        last = b"0-0"
        while len(latencies[i]) < total:
            got = await readers[i].xread({key: last}, count=4096, block=1000)
            arrived = time.monotonic_ns()
            for _, entries in got:
                for entry_id, fields in entries:
                    latencies[i].append(arrived - json.loads(fields[b"body"])["t"])
                    last = entry_id

    async def append_one(i: int) -> None:
        stamp = time.monotonic_ns()
        await pool.xadd(key, {"body": _body(i, t=stamp)}, maxlen=retention, approximate=True)
        append_latencies.append(time.monotonic_ns() - stamp)

    async with asyncio.timeout(total / rate + 60):
        tasks = [asyncio.create_task(follower(i)) for i in range(followers)]
        await asyncio.sleep(0.05)
        appends = []
        started = time.monotonic()
        issued = 0
        while issued < total:
            due = min(total, int((time.monotonic() - started) * rate) + 1)
            while issued < due:
                appends.append(asyncio.create_task(append_one(issued)))
                issued += 1
            await asyncio.sleep(0.001)
        paced_s = time.monotonic() - started
        await asyncio.gather(*appends)
        await asyncio.gather(*tasks)
    for client in (pool, *readers):
        await client.aclose()
    return {
        "followers": followers,
        "records": total,
        "achieved_rate": total / paced_s,
        "received": [len(per) for per in latencies],
        "delivery_ns": [v for per in latencies for v in per],
        "append_return_ns": append_latencies,
    }


async def _measure(redis_mod: Any, port: int, profile: Any, retention: int) -> dict[str, Any]:
    stream, latency = [], []
    n = 0
    for rep in range(profile.stream_reps):
        for followers in profile.stream_followers:
            n += 1
            got = await _stream_trial(
                redis_mod,
                port,
                f"bench:{n}",
                followers=followers,
                records=profile.stream_records,
                appenders=profile.stream_appenders,
                retention=retention,
            )
            stream.append(got)
            say(
                f"  stream F={followers:<2} rep {rep + 1}: {fmt(got['median_lines_per_s'])} lines/s per follower,"
                f" appends {fmt(got['append_records_per_s'])}/s"
            )
    total = int(profile.latency_rate * profile.latency_seconds / profile.latency_reps)
    for rep in range(profile.latency_reps):
        for followers in profile.stream_followers:
            n += 1
            got = await _latency_trial(
                redis_mod,
                port,
                f"bench:{n}",
                followers=followers,
                total=total,
                rate=profile.latency_rate,
                retention=retention,
            )
            latency.append(got)
            d = summarize(got["delivery_ns"], scale=1e-6)
            say(
                f"  latency F={followers:<2} rep {rep + 1}: p50 {fmt(d.get('p50'))} ms, p99 {fmt(d.get('p99'))} ms"
                f" at {fmt(got['achieved_rate'])}/s"
            )
    return {"stream": stream, "latency": latency}


def _summarize(raw: dict[str, Any], profile: Any) -> dict[str, Any]:
    stream, latency = [], []
    for followers in profile.stream_followers:
        trials = [t for t in raw["stream"] if t["followers"] == followers]
        stream.append(
            {
                "followers": followers,
                "lines_per_s_per_follower": median(t["median_lines_per_s"] for t in trials),
                "slowest_lines_per_s": median(t["slowest_lines_per_s"] for t in trials),
                "append_records_per_s": median(t["append_records_per_s"] for t in trials),
                "all_complete": all(t["complete"] for t in trials),
            }
        )
        trials = [t for t in raw["latency"] if t["followers"] == followers]
        pooled = [v * 1e-6 for t in trials for v in t["delivery_ns"]]
        latency.append(
            {
                "followers": followers,
                "rate": profile.latency_rate,
                "records_per_trial": trials[0]["records"],
                "trials": len(trials),
                "ms": summarize(pooled),
                "samples_ms": thin(pooled),
                "append_return_ms": summarize([v * 1e-6 for t in trials for v in t["append_return_ns"]]),
                "achieved_rate": median(t["achieved_rate"] for t in trials),
                "all_received": all(n >= t["records"] for t in trials for n in t["received"]),
            }
        )
    return {"stream": stream, "latency": latency}


def run(quick: bool) -> dict[str, Any]:
    """Measure (or skip, with the reason) and return the results; the caller writes them."""
    from journal import DEFAULT_RETENTION_RECORDS

    from .journal import FULL, QUICK

    profile = QUICK if quick else FULL
    command = "python -m bench.redis_stream" + (" --quick" if quick else "")
    results: dict[str, Any] = {
        "benchmark": "redis_stream",
        "profile": profile.name,
        "command": command,
        "machine": machine_info(),
        "parameters": {
            "stream_followers": list(profile.stream_followers),
            "stream_records": profile.stream_records,
            "stream_appenders": profile.stream_appenders,
            "stream_reps": profile.stream_reps,
            "latency_rate": profile.latency_rate,
            "latency_seconds": profile.latency_seconds,
            "latency_reps": profile.latency_reps,
            "maxlen_approx": DEFAULT_RETENTION_RECORDS,
        },
        "notes": "redis-server in memory (--save '' --appendonly no): no fsync, unlike the journal;"
        " redis.asyncio client, appenders and followers on one asyncio loop in one process",
    }
    executable = shutil.which("redis-server")
    try:
        import redis.asyncio as redis_mod
    except ImportError:
        redis_mod = None
    if executable is None or redis_mod is None:
        missing = (
            "redis-server is not installed" if executable is None else "the redis package is not installed"
        )
        results["skipped"] = f"{missing}; install with: {INSTALL_HINT}"
        say(f"  skipped: {results['skipped']}")
        return results
    version = subprocess.run(
        [executable, "--version"], capture_output=True, text=True, timeout=10
    ).stdout.strip()
    results["machine"]["redis_server"] = version
    began = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(executable, Path(tmp))
        try:
            server.wait_ready()
            say(f"  redis-server pid {server.process.pid} on 127.0.0.1:{server.port}")
            raw = asyncio.run(_measure(redis_mod, server.port, profile, DEFAULT_RETENTION_RECORDS))
        finally:
            server.stop()
    results["seconds"] = time.perf_counter() - began
    results["finished_at_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    results.update(_summarize(raw, profile))
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.redis_stream", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the journal benchmark's short profile")
    args = parser.parse_args(argv)
    results = run(args.quick)
    path = write_results("redis_stream", results)
    if "skipped" in results:
        print(f"redis_stream skipped: {results['skipped']}")
        print(f"results: {path}")
        return 0
    rows = []
    for row in results["stream"]:
        rows.append(
            [
                f"XREAD, {row['followers']} follower(s), lines/s each",
                fmt(row["lines_per_s_per_follower"]),
                f"XADD {fmt(row['append_records_per_s'])}/s",
            ]
        )
    for row in results["latency"]:
        rows.append(
            [
                f"XADD to XREAD, {row['followers']} follower(s) @{row['rate']}/s, ms",
                f"p50 {fmt(row['ms'].get('p50'))}  p99 {fmt(row['ms'].get('p99'))}",
                f"achieved {fmt(row['achieved_rate'])}/s",
            ]
        )
    print()
    print(
        f"{results['command']} ({results['profile']}, {results['seconds']:.0f} s; {results['machine']['redis_server']})"
    )
    print_table(("figure", "value", "note"), rows)
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
