"""Journal benchmark: each figure beside its baseline, measured in one run.

    python -m bench.journal [--quick] [--data-dir DIR]

1. Append throughput: P concurrent producers appending through ``Journal.append``,
   against raw ``sqlite3`` inserts into an equivalent table with the same durability
   (WAL, ``synchronous = FULL``, one transaction per batch) at the batch size the
   journal's group commit reached (records / ``Journal.commits``, the transactions
   its writer committed).
2. Stream throughput to 1 and 10 followers of ``GET /v1/runner/events`` on a real
   in-process runner, against followers reading ``Journal.read_lines`` in-process.
3. Append-to-delivery latency (p50, p99) at a paced rate, same two readers.
4. Replay of the full retained window: the stream from ``from=0``, against
   ``runner replay --json`` as a subprocess (and ``read_lines`` in-process).

Results go to ``bench/results/journal-<UTC>.json`` and ``journal-latest.json``.
The raw baseline is the only reason this file imports sqlite3.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import queue
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import trio

from journal import DEFAULT_RETENTION_RECORDS, Journal, now_ms, open_journal
from runner.config import Config
from runner.replay import replay as run_replay
from runner.runtime import serve_runner

from ._callgrind import source_tree
from ._common import (
    ENVELOPE_PREFIX,
    Budget,
    EventsReader,
    cpu_report,
    cpu_sample,
    envelope_of,
    fmt,
    freeze_heap_as_the_runner_does,
    machine_info,
    median,
    print_table,
    ratio,
    say,
    summarize,
    thin,
    write_results,
)

TOKEN = "bench-journal-token"
GOAL_RATIO = 0.5  # the goal: the journal reaches half of raw SQLite at the same batch size
# ... with many concurrent producers. One producer is shown too, but it is latency-bound:
# each of its appends waits for its own commit, two thread hand-offs included.
GOAL_MIN_PRODUCERS = 2
_ROOT = Path(__file__).resolve().parent.parent


@attrs.frozen(kw_only=True)
class Profile:
    name: str
    producers: tuple[int, ...] = (1, 50, 200, 500)
    append_records: int = 8_000  # per trial, for P > 1
    append_records_single: int = 1_000  # per trial, for P = 1 (one fsync per record)
    append_seconds: float = 0.8  # wall-clock cap of one trial
    append_reps: int = 2
    raw_sizes: tuple[int, ...] = (1, 16, 128, 1024)
    raw_size_records: int = 8_000
    raw_size_seconds: float = 0.4
    stream_followers: tuple[int, ...] = (1, 10)
    stream_records: int = 4_000  # <= retention, so no follower can fall out of the window
    stream_appenders: int = 100
    stream_reps: int = 2
    latency_rate: int = 2_000  # records/s, paced
    latency_seconds: float = 1.5  # in all, split over latency_reps trials per configuration
    latency_reps: int = 2
    replay_reps: int = 2
    heartbeat_ms: int = 200  # short, so streams whose reader left notice it between trials


QUICK = Profile(name="quick")
FULL = Profile(
    name="full",
    append_records=40_000,
    append_records_single=4_000,
    append_seconds=4.0,
    append_reps=4,
    raw_size_records=40_000,
    raw_size_seconds=2.0,
    stream_reps=5,
    latency_seconds=5.0,
    latency_reps=5,
    replay_reps=5,
)


def _body(i: int, **extra: Any) -> dict[str, Any]:
    # A small conversation event, the shape most records have.
    return {"type": "event", "name": "bench.tick", "payload": {"i": i}, **extra}


# -- 1. append throughput -----------------------------------------------------------------------


async def _journal_trial(path: Path, *, producers: int, records: int, seconds: float) -> dict[str, Any]:
    """P tasks append ``records`` in all (or until ``seconds`` pass); the journal counts its commits."""
    per_producer = math.ceil(records / producers)
    done = 0
    with trio.fail_after(seconds + 60):
        async with open_journal(path) as journal:
            budget = Budget(records, seconds)

            async def produce(k: int) -> None:
                nonlocal done
                name = f"p{k}"
                for i in range(per_producer):
                    if budget.expired():
                        return
                    await journal.append(name, "conversation", _body(i))
                    done += 1

            async with trio.open_nursery() as nursery:
                for k in range(producers):
                    nursery.start_soon(produce, k)
            elapsed = time.perf_counter() - budget.started
            commits = journal.commits
    return {
        "records": done,
        "seconds": elapsed,
        "records_per_s": done / elapsed,
        "commits": commits,
        "group_size": done / commits if commits else None,
    }


_RAW_SCHEMA = """
CREATE TABLE records (
    envelope INTEGER PRIMARY KEY AUTOINCREMENT,
    producer TEXT NOT NULL,
    seq INTEGER NOT NULL,
    class TEXT NOT NULL,
    at INTEGER NOT NULL,
    body TEXT NOT NULL
);
CREATE UNIQUE INDEX records_producer_seq ON records (producer, seq);
CREATE TABLE producers (producer TEXT PRIMARY KEY, last_seq INTEGER NOT NULL, closed INTEGER NOT NULL DEFAULT 0) WITHOUT ROWID;
"""


def _raw_trial(
    path: Path, *, batch: int, producers: int, records: int, seconds: float, journal_sql: bool = False
) -> dict[str, Any]:
    """Raw sqlite3: one transaction per ``batch`` rows, WAL + synchronous=FULL, rows built in the loop.

    With ``journal_sql`` each transaction also runs the journal's per-batch bookkeeping
    (the producers upsert and the retention delete), to tell SQL cost from Python cost.
    """
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = FULL")
        conn.executescript(_RAW_SCHEMA)
        envelope = done = commits = 0
        seqs = [0] * producers
        retention = DEFAULT_RETENTION_RECORDS
        budget = Budget(records, seconds)
        while done < records and not budget.expired():
            size = min(batch, records - done)
            at = now_ms()
            rows = []
            touched: dict[str, int] = {}
            for _ in range(size):
                envelope += 1
                k = envelope % producers
                seqs[k] += 1
                name = f"p{k}"
                touched[name] = seqs[k]
                rows.append(
                    (
                        envelope,
                        name,
                        seqs[k],
                        "conversation",
                        at,
                        json.dumps(_body(seqs[k]), separators=(",", ":")),
                    )
                )
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(
                "INSERT INTO records (envelope, producer, seq, class, at, body) VALUES (?, ?, ?, ?, ?, ?)",
                rows,
            )
            if journal_sql:
                conn.executemany(
                    "INSERT INTO producers (producer, last_seq) VALUES (?, ?)"
                    " ON CONFLICT (producer) DO UPDATE SET last_seq = excluded.last_seq",
                    list(touched.items()),
                )
                conn.execute("DELETE FROM records WHERE envelope <= ?", (envelope - retention,))
            conn.execute("COMMIT")
            done += size
            commits += 1
        elapsed = time.perf_counter() - budget.started
    finally:
        conn.close()
    return {
        "batch": batch,
        "records": done,
        "seconds": elapsed,
        "records_per_s": done / elapsed,
        "commits": commits,
    }


async def _hand_off_round_trips(count: int) -> list[float]:
    """Trio loop -> a waiting thread -> back (``run_sync_soon``), as each commit pays: µs per round trip."""
    token = trio.lowlevel.current_trio_token()
    requests: queue.SimpleQueue[Any] = queue.SimpleQueue()

    def serve() -> None:
        while (task := requests.get()) is not None:
            token.run_sync_soon(trio.lowlevel.reschedule, task)

    thread = threading.Thread(target=serve, name="bench hand-off")
    thread.start()
    took = []
    try:
        for _ in range(count):
            started = time.perf_counter()
            requests.put(trio.lowlevel.current_task())
            await trio.lowlevel.wait_task_rescheduled(lambda _: trio.lowlevel.Abort.FAILED)
            took.append((time.perf_counter() - started) * 1e6)
    finally:
        requests.put(None)
        thread.join()
    return took


def measure_appends(profile: Profile, data_dir: Path) -> dict[str, Any]:
    rows = []
    for producers in profile.producers:
        records = (
            profile.append_records_single if producers == 1 else max(profile.append_records, 20 * producers)
        )
        trials = []
        for rep in range(profile.append_reps):
            with tempfile.TemporaryDirectory(dir=data_dir) as tmp:
                got = trio.run(
                    partial(
                        _journal_trial,
                        Path(tmp, "journal.db"),
                        producers=producers,
                        records=records,
                        seconds=profile.append_seconds,
                    )
                )
            batch = max(1, round(got["group_size"] or 1))
            with tempfile.TemporaryDirectory(dir=data_dir) as tmp:
                raw = _raw_trial(
                    Path(tmp, "raw.db"),
                    batch=batch,
                    producers=producers,
                    records=got["records"],
                    seconds=profile.append_seconds,
                )
            with tempfile.TemporaryDirectory(dir=data_dir) as tmp:
                raw_sql = _raw_trial(
                    Path(tmp, "raw.db"),
                    batch=batch,
                    producers=producers,
                    records=got["records"],
                    seconds=profile.append_seconds,
                    journal_sql=True,
                )
            trials.append(
                {
                    "journal": got,
                    "raw": raw,
                    "raw_with_journal_sql": raw_sql,
                    "ratio": got["records_per_s"] / raw["records_per_s"],
                }
            )
            say(
                f"  append P={producers:<4} rep {rep + 1}: journal {fmt(got['records_per_s'])}/s"
                f" (group {fmt(got['group_size'])}), raw@{batch} {fmt(raw['records_per_s'])}/s,"
                f" raw+journal SQL {fmt(raw_sql['records_per_s'])}/s"
            )
        row = {
            "producers": producers,
            "group_size": median(t["journal"]["group_size"] for t in trials),
            "journal_records_per_s": median(t["journal"]["records_per_s"] for t in trials),
            "raw_records_per_s": median(t["raw"]["records_per_s"] for t in trials),
            "raw_with_journal_sql_records_per_s": median(
                t["raw_with_journal_sql"]["records_per_s"] for t in trials
            ),
            "ratio": median(t["ratio"] for t in trials),
            "trials": trials,
        }
        row["goal_applies"] = producers >= GOAL_MIN_PRODUCERS
        row["goal_met"] = row["ratio"] >= GOAL_RATIO if row["goal_applies"] else None
        rows.append(row)
    fixed = []
    for batch in profile.raw_sizes:
        with tempfile.TemporaryDirectory(dir=data_dir) as tmp:
            got = _raw_trial(
                Path(tmp, "raw.db"),
                batch=batch,
                producers=50,
                records=profile.raw_size_records,
                seconds=profile.raw_size_seconds,
            )
        say(f"  raw batch {batch}: {fmt(got['records_per_s'])}/s")
        fixed.append(got)
    hand_off = summarize(trio.run(_hand_off_round_trips, 2_000))
    say(
        f"  thread hand-off round trip (the floor one producer pays per append): p50 {fmt(hand_off['p50'])} µs"
    )
    return {"by_producers": rows, "raw_fixed_batches": fixed, "hand_off_round_trip_us": hand_off}


_TRIAL_IN_A_PROCESS = """
import json, sys, trio
from functools import partial
from pathlib import Path
from bench._common import freeze_heap_as_the_runner_does
from bench.journal import _journal_trial
freeze_heap_as_the_runner_does()
path, producers, records, seconds = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
print(json.dumps(trio.run(partial(_journal_trial, path, producers=producers, records=records, seconds=seconds))))
"""


def _journal_trial_in(
    tree: Path, path: Path, *, producers: int, records: int, seconds: float
) -> dict[str, Any]:
    """One append trial in a process of its own, importing the journal from ``tree`` (this trial from here)."""
    done = subprocess.run(
        [sys.executable, "-c", _TRIAL_IN_A_PROCESS, str(path), str(producers), str(records), str(seconds)],
        check=True,
        capture_output=True,
        text=True,
        timeout=seconds + 120,
        cwd=path.parent,  # not this tree, which would come first on the path
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(_ROOT)])},
    )
    got: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return got


def measure_before(profile: Profile, data_dir: Path, rev: str) -> dict[str, Any]:
    """The append trials of this build and of commit ``rev``, paired, each against raw at its group size.

    Both builds run the same trial in a process of their own (so neither is warmer), in
    alternating order, each followed at once by its raw trial.
    """
    rows = []
    with source_tree(rev) as old_tree:
        for producers in [p for p in profile.producers if p >= 50]:
            records = max(profile.append_records, 20 * producers)
            trials = []
            for rep in range(profile.append_reps):
                pair: dict[str, Any] = {}
                builds = [("now", _ROOT), ("before", old_tree)]
                for name, tree in builds if rep % 2 == 0 else builds[::-1]:
                    with tempfile.TemporaryDirectory(dir=data_dir) as tmp:
                        got = _journal_trial_in(
                            tree,
                            Path(tmp, "journal.db"),
                            producers=producers,
                            records=records,
                            seconds=profile.append_seconds,
                        )
                    with tempfile.TemporaryDirectory(dir=data_dir) as tmp:
                        raw = _raw_trial(
                            Path(tmp, "raw.db"),
                            batch=max(1, round(got["group_size"] or 1)),
                            producers=producers,
                            records=got["records"],
                            seconds=profile.append_seconds,
                        )
                    pair[name] = {
                        "journal": got,
                        "raw": raw,
                        "ratio": got["records_per_s"] / raw["records_per_s"],
                    }
                pair["now_over_before"] = (
                    pair["now"]["journal"]["records_per_s"] / pair["before"]["journal"]["records_per_s"]
                )
                trials.append(pair)
                say(
                    f"  append P={producers:<4} rep {rep + 1}: this build {fmt(pair['now']['ratio'])} of raw,"
                    f" {rev} {fmt(pair['before']['ratio'])} of raw (load {os.getloadavg()[0]:.1f})"
                )
            rows.append(
                {
                    "producers": producers,
                    "ratio_now": median(t["now"]["ratio"] for t in trials),
                    "ratio_before": median(t["before"]["ratio"] for t in trials),
                    "now_over_before": median(t["now_over_before"] for t in trials),
                    "trials": trials,
                }
            )
    return {"rev": rev, "by_producers": rows}


# -- 2-4. the stream, on a real runner ----------------------------------------------------------


async def _appenders(journal: Journal, *, records: int, tasks: int) -> float:
    """Append ``records`` from ``tasks`` concurrent tasks; return when the last one returned."""
    per_task = [records // tasks + (1 if k < records % tasks else 0) for k in range(tasks)]

    async def append_some(k: int, count: int) -> None:
        for i in range(count):
            await journal.append(f"bench-{k}", "conversation", _body(i))

    async with trio.open_nursery() as nursery:
        for k, count in enumerate(per_task):
            nursery.start_soon(append_some, k, count)
    return time.perf_counter()


async def _close_readers(readers: Sequence[EventsReader], heartbeat_ms: int) -> None:
    for reader in readers:
        await reader.aclose()
    # A stream learns its reader left only when a write fails: give the pings time.
    await trio.sleep(3 * heartbeat_ms / 1000)


async def _stream_trial(
    journal: Journal, address: str, *, followers: int, via_http: bool, profile: Profile
) -> dict[str, Any]:
    """F followers from the head while appenders write M records: lines/s per follower."""
    records = profile.stream_records
    head = journal.head
    readers = (
        [await EventsReader.connect(address, TOKEN, f"from={head}") for _ in range(followers)]
        if via_http
        else []
    )
    for reader in readers:
        if reader.status != 200:
            raise RuntimeError(f"events stream answered {reader.status}: {reader.error_body!r}")
    seen = [0] * followers
    finished = [math.nan] * followers

    async def http_follower(i: int) -> None:
        reader = readers[i]
        while seen[i] < records:
            got = await reader.receive_lines()
            if got is None:
                break
            seen[i] += sum(1 for line in got[1] if line.startswith(ENVELOPE_PREFIX))
        finished[i] = time.perf_counter()

    async def local_follower(i: int) -> None:
        cursor = head
        while seen[i] < records:
            await journal.wait_past(cursor)
            rows = await journal.read_lines(cursor, 4096)
            if rows:
                cursor = rows[-1][0]
                seen[i] += len(rows)
        finished[i] = time.perf_counter()

    appended_at = math.nan
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            for i in range(followers):
                nursery.start_soon(http_follower if via_http else local_follower, i)
            started = time.perf_counter()
            appended_at = await _appenders(journal, records=records, tasks=profile.stream_appenders)
    if via_http:
        await _close_readers(readers, profile.heartbeat_ms)
    rates = [n / (t - started) for n, t in zip(seen, finished, strict=True)]
    return {
        "followers": followers,
        "via": "http" if via_http else "in_process",
        "records": records,
        "received": seen,
        "complete": all(n >= records for n in seen),
        "append_records_per_s": records / (appended_at - started),
        "per_follower_lines_per_s": rates,
        "median_lines_per_s": median(rates),
        "slowest_lines_per_s": min(rates),
        "total_lines_per_s": sum(seen) / (max(finished) - started),
    }


async def _latency_trial(
    journal: Journal, address: str, *, followers: int, via_http: bool, profile: Profile
) -> dict[str, Any]:
    """Paced appends stamped with monotonic ns; each follower notes when each line arrived."""
    total = int(profile.latency_rate * profile.latency_seconds / profile.latency_reps)
    head = journal.head
    readers = (
        [await EventsReader.connect(address, TOKEN, f"from={head}") for _ in range(followers)]
        if via_http
        else []
    )
    latencies: list[list[int]] = [[] for _ in range(followers)]
    append_latencies: list[int] = []

    async def http_follower(i: int) -> None:
        reader = readers[i]
        while len(latencies[i]) < total:
            got = await reader.receive_lines()
            if got is None:
                break
            arrived, lines = got
            for line in lines:
                if line.startswith(ENVELOPE_PREFIX):
                    latencies[i].append(arrived - json.loads(line)["body"]["t"])

    async def local_follower(i: int) -> None:
        cursor = head
        while len(latencies[i]) < total:
            await journal.wait_past(cursor)
            rows = await journal.read_lines(cursor, 4096)
            arrived = time.monotonic_ns()
            for _, line in rows:
                latencies[i].append(arrived - json.loads(line)["body"]["t"])
            if rows:
                cursor = rows[-1][0]

    async def append_one(i: int) -> None:
        stamp = time.monotonic_ns()
        await journal.append("bench-latency", "conversation", _body(i, t=stamp))
        append_latencies.append(time.monotonic_ns() - stamp)

    # Bounded: a follower still short of its records 15 s after the last append is reported
    # (``received`` below, ``all_received`` in the summary) rather than waited for.
    paced_s = math.nan
    with trio.move_on_after(profile.latency_seconds + 15) as bound:
        async with trio.open_nursery() as nursery:
            for i in range(followers):
                nursery.start_soon(http_follower if via_http else local_follower, i)
            started = time.monotonic()
            issued = 0
            while issued < total:
                due = min(total, int((time.monotonic() - started) * profile.latency_rate) + 1)
                while issued < due:
                    nursery.start_soon(append_one, issued)
                    issued += 1
                await trio.sleep(0.001)
            paced_s = time.monotonic() - started
    if bound.cancelled_caught:
        say(
            f"  latency F={followers} {'http' if via_http else 'in_process'}: followers still short after 15 s,"
            f" received {[len(per) for per in latencies]} of {total}"
        )
    if via_http:
        await _close_readers(readers, profile.heartbeat_ms)
    pooled = [v for per in latencies for v in per]
    return {
        "followers": followers,
        "via": "http" if via_http else "in_process",
        "records": total,
        "achieved_rate": total / paced_s,
        "timed_out": bound.cancelled_caught,
        "received": [len(per) for per in latencies],
        "delivery_ns": pooled,
        "append_return_ns": append_latencies,
    }


async def _replay_trial(journal: Journal, address: str, journal_path: Path) -> dict[str, Any]:
    """The whole retained window: via the stream from 0, in-process, and ``runner replay --json``."""
    head = journal.head
    window = await journal.window()
    expected = head - (window.oldest or head + 1) + 1

    started = time.perf_counter()
    reader = await EventsReader.connect(address, TOKEN, "from=0")
    stream_count = last = 0
    with trio.fail_after(60):
        while last < head:
            got = await reader.receive_lines()
            if got is None:
                break
            for line in got[1]:
                if line.startswith(ENVELOPE_PREFIX):
                    stream_count += 1
                    last = envelope_of(line)
    stream_s = time.perf_counter() - started
    await reader.aclose()

    started = time.perf_counter()
    cursor = local_count = 0
    while cursor < head:
        rows = await journal.read_lines(cursor, 4096)
        if not rows:
            break
        cursor = rows[-1][0]
        local_count += len(rows)
    local_s = time.perf_counter() - started

    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(_ROOT), os.environ.get("PYTHONPATH")])),
    }

    async def replay(after: int) -> tuple[int, float]:
        argv = [
            sys.executable,
            "-m",
            "runner",
            "replay",
            "--journal",
            str(journal_path),
            "--from",
            str(after),
            "--json",
        ]
        begun = time.perf_counter()
        with trio.fail_after(60):
            done = await trio.run_process(
                argv, capture_stdout=True, capture_stderr=True, cwd=_ROOT, env=env, check=False
            )
        if done.returncode != 0:
            tail = done.stderr.decode(errors="replace").strip().splitlines()[-1:]
            raise RuntimeError(f"runner replay exited {done.returncode}: {' '.join(tail)}")
        return done.stdout.count(b"\n"), time.perf_counter() - begun

    # runner replay's own code path without a process start: decode, re-encode, print.
    def replay_here() -> tuple[int, float]:
        out = io.StringIO()
        begun = time.perf_counter()
        run_replay(str(journal_path), after=0, as_json=True, out=out, err=io.StringIO())
        return out.getvalue().count("\n"), time.perf_counter() - begun

    code_count, code_s = await trio.to_thread.run_sync(replay_here)

    try:
        replay_count, replay_s = await replay(0)
        _, startup_s = await replay(head)  # prints nothing: the process's start, imports and open
    except RuntimeError as exc:
        say(f"  {exc}")
        subprocess_result: dict[str, Any] = {"error": str(exc), "records": None}
    else:
        subprocess_result = {
            "records": replay_count,
            "seconds": replay_s,
            "records_per_s": replay_count / replay_s,
            "startup_seconds": startup_s,
        }
    return {
        "window_records": expected,
        "stream": {"records": stream_count, "seconds": stream_s, "records_per_s": stream_count / stream_s},
        "in_process": {"records": local_count, "seconds": local_s, "records_per_s": local_count / local_s},
        "replay_code_in_process": {
            "records": code_count,
            "seconds": code_s,
            "records_per_s": code_count / code_s,
        },
        "replay_subprocess": subprocess_result,
    }


async def _measure_runner(profile: Profile, data_dir: Path) -> dict[str, Any]:
    results: dict[str, Any] = {"stream": [], "latency": [], "replay": []}
    with tempfile.TemporaryDirectory(dir=data_dir) as tmp:
        journal_path = Path(tmp, "runner.db")
        config = Config(journal_path=journal_path, address="127.0.0.1:0", heartbeat_ms=profile.heartbeat_ms)
        async with trio.open_nursery() as nursery:
            with trio.fail_after(30):
                address, runner = await nursery.start(
                    partial(
                        serve_runner,
                        config,
                        token=TOKEN,
                        transports=[],
                        conversation_factory=None,
                        handle_signals=False,
                    )
                )
            try:
                journal: Journal = runner.journal
                for rep in range(profile.stream_reps):
                    for followers in profile.stream_followers:
                        for via_http in (True, False):
                            got = await _stream_trial(
                                journal, address, followers=followers, via_http=via_http, profile=profile
                            )
                            results["stream"].append(got)
                            say(
                                f"  stream F={followers:<2} {got['via']:<10} rep {rep + 1}:"
                                f" {fmt(got['median_lines_per_s'])} lines/s per follower"
                                f" (slowest {fmt(got['slowest_lines_per_s'])}),"
                                f" appends {fmt(got['append_records_per_s'])}/s"
                            )
                for rep in range(profile.latency_reps):
                    for followers in profile.stream_followers:
                        for via_http in (True, False):
                            got = await _latency_trial(
                                journal, address, followers=followers, via_http=via_http, profile=profile
                            )
                            results["latency"].append(got)
                            d = summarize(got["delivery_ns"], scale=1e-6)
                            say(
                                f"  latency F={followers:<2} {got['via']:<10} rep {rep + 1}: p50 {fmt(d.get('p50'))} ms,"
                                f" p99 {fmt(d.get('p99'))} ms at {fmt(got['achieved_rate'])}/s"
                            )
                # The window must be full: top it up if the trials above wrote less.
                missing = journal.retention_records - journal.head
                if missing > 0:
                    await _appenders(journal, records=missing, tasks=50)
                for rep in range(profile.replay_reps):
                    got = await _replay_trial(journal, address, journal_path)
                    results["replay"].append(got)
                    sub = got["replay_subprocess"]
                    say(
                        f"  replay rep {rep + 1}: stream {fmt(got['stream']['records_per_s'])}/s,"
                        f" in-process {fmt(got['in_process']['records_per_s'])}/s,"
                        f" runner replay {fmt(sub.get('records_per_s'))}/s"
                        f" ({fmt(sub.get('startup_seconds'))} s of it start-up),"
                        f" replay code in-process {fmt(got['replay_code_in_process']['records_per_s'])}/s"
                    )
            finally:
                runner.drain_nowait("drain_request")
    return results


# -- summary ------------------------------------------------------------------------------------


def _summarize_runner(raw: dict[str, Any], profile: Profile) -> dict[str, Any]:
    stream = []
    for followers in profile.stream_followers:
        http = [t for t in raw["stream"] if t["followers"] == followers and t["via"] == "http"]
        local = [t for t in raw["stream"] if t["followers"] == followers and t["via"] == "in_process"]
        value = median(t["median_lines_per_s"] for t in http)
        baseline = median(t["median_lines_per_s"] for t in local)
        stream.append(
            {
                "followers": followers,
                "http_lines_per_s_per_follower": value,
                "http_slowest_lines_per_s": median(t["slowest_lines_per_s"] for t in http),
                "in_process_lines_per_s_per_follower": baseline,
                "append_records_per_s_during_http": median(t["append_records_per_s"] for t in http),
                "append_records_per_s_during_in_process": median(t["append_records_per_s"] for t in local),
                "all_complete": all(t["complete"] for t in http + local),
                "ratio": ratio(value, baseline),
            }
        )
    latency = []
    for followers in profile.stream_followers:
        http = [t for t in raw["latency"] if t["followers"] == followers and t["via"] == "http"]
        local = [t for t in raw["latency"] if t["followers"] == followers and t["via"] == "in_process"]
        latency.append(
            {
                "followers": followers,
                "rate": profile.latency_rate,
                "records_per_trial": http[0]["records"],
                "trials": len(http),
                "http_ms": summarize([v for t in http for v in t["delivery_ns"]], scale=1e-6),
                "in_process_ms": summarize([v for t in local for v in t["delivery_ns"]], scale=1e-6),
                "http_samples_ms": thin([v * 1e-6 for t in http for v in t["delivery_ns"]]),
                "append_return_ms": summarize(
                    [v for t in http + local for v in t["append_return_ns"]], scale=1e-6
                ),
                "http_trial_median_ms": {
                    q: median(summarize(t["delivery_ns"], scale=1e-6)[q] for t in http)
                    for q in ("p50", "p99")
                },
                "in_process_trial_median_ms": {
                    q: median(summarize(t["delivery_ns"], scale=1e-6)[q] for t in local)
                    for q in ("p50", "p99")
                },
                "achieved_rate": median(t["achieved_rate"] for t in http + local),
                "all_received": all(n >= t["records"] for t in http + local for n in t["received"]),
            }
        )
    for trial in raw["latency"]:  # the samples are summarized above; keep the file small
        trial["delivery_ms"] = summarize(trial.pop("delivery_ns"), scale=1e-6)
        trial["append_return_ms"] = summarize(trial.pop("append_return_ns"), scale=1e-6)
    trials = raw["replay"]
    ran = [t["replay_subprocess"] for t in trials if "error" not in t["replay_subprocess"]]

    def over_runs(key: str) -> float | None:
        values = [r[key] for r in ran if r.get(key) is not None]
        return median(values) if values else None

    replay = {
        "window_records": trials[0]["window_records"],
        "stream_records_per_s": median(t["stream"]["records_per_s"] for t in trials),
        "stream_seconds": median(t["stream"]["seconds"] for t in trials),
        "in_process_records_per_s": median(t["in_process"]["records_per_s"] for t in trials),
        "replay_records_per_s": over_runs("records_per_s"),
        "replay_seconds": over_runs("seconds"),
        "replay_startup_seconds": over_runs("startup_seconds"),
        "replay_code_in_process_records_per_s": median(
            t["replay_code_in_process"]["records_per_s"] for t in trials
        ),
        "replay_errors": [
            t["replay_subprocess"]["error"] for t in trials if "error" in t["replay_subprocess"]
        ],
        "all_complete": all(
            t["stream"]["records"]
            == t["window_records"]
            == t["replay_subprocess"]["records"]
            == t["replay_code_in_process"]["records"]
            for t in trials
        ),
    }
    return {"stream": stream, "latency": latency, "replay": replay}


def _verdict(row: dict[str, Any]) -> str:
    if not row["goal_applies"]:
        return "(latency-bound)"
    return "PASS" if row["goal_met"] else "FAIL"


def _table(appends: dict[str, Any], runner: dict[str, Any]) -> list[list[str]]:
    rows: list[list[str]] = []
    for row in appends["by_producers"]:
        rows.append(
            [
                f"append, {row['producers']} producers (group {fmt(row['group_size'])}) rec/s",
                fmt(row["journal_records_per_s"]),
                f"{fmt(row['raw_records_per_s'])} (raw sqlite, batch {max(1, round(row['group_size']))})",
                fmt(row["ratio"]),
                _verdict(row),
            ]
        )
    hand_off = appends["hand_off_round_trip_us"]
    rows.append(
        [
            "thread hand-off round trip p50 / p99, µs",
            f"{fmt(hand_off['p50'])} / {fmt(hand_off['p99'])}",
            "-",
            "-",
            "each append pays one",
        ]
    )
    for row in runner["stream"]:
        rows.append(
            [
                f"stream, {row['followers']} follower(s), lines/s each",
                fmt(row["http_lines_per_s_per_follower"]),
                f"{fmt(row['in_process_lines_per_s_per_follower'])} (read_lines in-process)",
                fmt(row["ratio"]),
                "" if row["all_complete"] else "INCOMPLETE",
            ]
        )
    for row in runner["latency"]:
        for q in ("p50", "p99"):
            rows.append(
                [
                    f"latency {q}, {row['followers']} follower(s) @{row['rate']}/s, ms",
                    fmt(row["http_ms"].get(q)),
                    f"{fmt(row['in_process_ms'].get(q))} (read_lines in-process)",
                    fmt(ratio(row["http_ms"].get(q), row["in_process_ms"].get(q))),
                    "" if row["all_received"] else "INCOMPLETE",
                ]
            )
    replay = runner["replay"]
    if not replay:  # --appends-only
        return rows
    rows.append(
        [
            f"replay {replay['window_records']} records via stream, rec/s",
            fmt(replay["stream_records_per_s"]),
            f"{fmt(replay['replay_records_per_s'])} (runner replay --json)",
            fmt(ratio(replay["stream_records_per_s"], replay["replay_records_per_s"])),
            "REPLAY FAILED" if replay["replay_errors"] else "" if replay["all_complete"] else "INCOMPLETE",
        ]
    )
    rows.append(
        [
            "replay's code in-process (no process start), rec/s",
            fmt(replay["replay_code_in_process_records_per_s"]),
            f"{fmt(replay['in_process_records_per_s'])} (read_lines in-process)",
            fmt(ratio(replay["replay_code_in_process_records_per_s"], replay["in_process_records_per_s"])),
            f"process start {fmt(replay['replay_startup_seconds'])} s",
        ]
    )
    return rows


def _load_note(report: dict[str, Any]) -> str:
    others = report.get("others_cores")
    note = f"this benchmark used {fmt(report['own_cores'])} cores"
    if others is not None:
        note += f", other processes {fmt(others)} cores"
        if others > 0.25:
            note += " (a busy machine: the figures are noisy)"
    return note


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.journal", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the short profile (about 30 s)")
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=Path(tempfile.gettempdir()),
        help="where the SQLite files go; it must be a real disk for the fsync figures to mean anything",
    )
    parser.add_argument(
        "--before",
        metavar="REV",
        help="also time the appends of this commit's journal, paired with this build's (50 producers and up)",
    )
    parser.add_argument("--appends-only", action="store_true", help="skip the stream, latency and replay")
    args = parser.parse_args(argv)
    heap = freeze_heap_as_the_runner_does()
    profile = QUICK if args.quick else FULL
    data_dir: Path = args.data_dir
    data_dir.mkdir(parents=True, exist_ok=True)
    command = " ".join(["python -m bench.journal", *(argv if argv is not None else sys.argv[1:])])
    machine = machine_info(data_dir)
    say(
        f"{command}: {machine['cores']} cores, Python {machine['python']}, SQLite {machine['sqlite']},"
        f" data on {machine['data_filesystem']} ({data_dir})"
    )
    say(
        f"heap frozen as runner serve freezes it: a full collection took {fmt(heap['full_collection_ms'])} ms"
        f" over {heap['tracked_objects']:,} objects, {fmt(heap['frozen_full_collection_ms'])} ms once frozen"
    )
    began = time.perf_counter()

    say("1. append throughput (journal vs raw sqlite3 at the journal's group size)")
    first = cpu_sample()
    appends = measure_appends(profile, data_dir)
    second = cpu_sample()
    say("   " + _load_note(cpu_report(first, second)))

    loadavg = [os.getloadavg()]
    before = None
    if args.before:
        say(f"1b. appends of this build and of {args.before}, each in a process of its own")
        before = measure_before(profile, data_dir, args.before)
        loadavg.append(os.getloadavg())
        second = cpu_sample()
    runner_raw: dict[str, Any] = {}
    runner: dict[str, Any] = {"stream": [], "latency": [], "replay": {}}
    if not args.appends_only:
        say("2-4. stream throughput, latency and replay on an in-process runner")
        with contextlib.redirect_stdout(io.StringIO()):  # the runner's lifecycle lines
            runner_raw = trio.run(_measure_runner, profile, data_dir)
        runner = _summarize_runner(runner_raw, profile)
    third = cpu_sample()
    loadavg.append(os.getloadavg())
    if not args.appends_only:
        say("   " + _load_note(cpu_report(second, third)))
    elapsed = time.perf_counter() - began
    load = {
        "append_phase": cpu_report(first, second),
        "runner_phase": cpu_report(second, third),
        "whole_run": cpu_report(first, third),
        "loadavg_1_5_15": loadavg,  # at the start, (after the builds' trials,) at the end
    }

    rows = _table(appends, runner)
    goal_met = all(row["goal_met"] for row in appends["by_producers"] if row["goal_applies"])
    results = {
        "benchmark": "journal",
        "profile": profile.name,
        "command": command,
        "finished_at_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "seconds": elapsed,
        "machine": machine,
        "heap": heap,
        "load": load,
        "parameters": attrs.asdict(profile),
        "goal": {
            "append_ratio_at_least": GOAL_RATIO,
            "for_producer_counts_from": GOAL_MIN_PRODUCERS,
            "met_for_every_such_producer_count": goal_met,
        },
        "append": appends,
        "append_before": before,
        "stream": runner["stream"],
        "latency": runner["latency"],
        "replay": runner["replay"],
        "trials": runner_raw,
        "table": [
            dict(zip(("figure", "value", "baseline", "ratio", "note"), row, strict=True)) for row in rows
        ],
    }
    path = write_results("journal", results)

    print()
    print(
        f"{command} ({profile.name}, {elapsed:.0f} s; {machine['cores']} cores, Python {machine['python']},"
        f" SQLite {machine['sqlite']}, data on {machine['data_filesystem']})"
    )
    print_table(("figure", "value", "baseline", "ratio", "note"), rows)
    print()
    print(
        f"goal (journal >= {GOAL_RATIO:.0%} of raw SQLite at the same batch size, {GOAL_MIN_PRODUCERS}+ producers): "
        + ", ".join(f"P={r['producers']} {_verdict(r)}" for r in appends["by_producers"])
    )
    if before:
        for row in before["by_producers"]:
            print(
                f"append, {row['producers']} producers, each build in a process of its own: this build"
                f" {row['ratio_now']:.2f} of raw, {before['rev']} {row['ratio_before']:.2f};"
                f" this build / {before['rev']} {row['now_over_before']:.2f} (medians of paired trials)"
            )
    print("machine load during the run: " + _load_note(load["whole_run"]))
    print("load average (1 min) at the start and the end: " + ", ".join(f"{la[0]:.1f}" for la in loadavg))
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
