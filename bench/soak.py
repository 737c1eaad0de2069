"""The soak: a runner under steady mixed load, killed with SIGKILL every minute, for ten minutes.

    python -m bench.soak [--minutes M] [--kill-every-s S] [--retention N] [--seed N] [--figure PATH] [--quick]

The load is the kill trials' (tests/faults/kill_load.py): calls started and stopped, host
messages, records the agent sends the host, agent-socket conversations, followers of the
events stream (half follow across each kill, half are resumed from a saved cursor). Every
``--kill-every-s`` the runner gets SIGKILL and is started again on the same journal; each
restart is checked as a kill trial is. Once a second it samples the runner's RSS and the
sizes of the journal file and its WAL. Prints records acknowledged, lost and duplicated,
and each minute's RSS and WAL; writes ``bench/results/soak-<UTC>.json`` (+ ``soak-latest.json``)
and a plot of RSS and file sizes over time (``--figure``, default beside the results).
Exits 1 if anything was lost, duplicated or broken.
"""

from __future__ import annotations

import argparse
import math
import sqlite3
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import trio

from tests.faults.kill_load import KillTrials, Load
from tests.runner_process import RunnerProcess

from ._common import RESULTS_DIR, fmt, machine_info, print_table, say, utc_stamp, write_results
from .kill import TALLY, add_load_arguments, load_of, print_tally

MIB = 1024 * 1024
RETENTION = 10_000  # a minute's records fit (each restart is checked from the last), ten minutes' do not
FLAT_WITHIN = 1.5  # a figure stays flat when its last minute's peak is at most this times its first's


def _rss_bytes(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


async def _sample(
    runner: RunnerProcess, journal: Path, began: float, samples: list[dict[str, float]]
) -> None:
    """Once a second until the runner is gone: its RSS, the journal's and the WAL's sizes."""
    wal = Path(f"{journal}-wal")
    while runner.process.returncode is None:
        rss = _rss_bytes(runner.process.pid)
        if rss is None:
            return
        samples.append(
            {
                "t_s": round(time.perf_counter() - began, 2),
                "rss_mib": rss / MIB,
                "wal_mib": _size(wal) / MIB,
                "db_mib": _size(journal) / MIB,
            }
        )
        await trio.sleep(1)


def _tables(journal: Path) -> dict[str, Any]:
    """What the journal file holds at the end: each table's rows and KiB (indexes included)."""
    conn = sqlite3.connect(f"file:{journal}?mode=ro", uri=True)
    try:
        kib = {
            name: size // 1024
            for name, size in conn.execute(
                "SELECT coalesce(m.tbl_name, s.name), sum(s.pgsize) FROM dbstat AS s"
                " LEFT JOIN sqlite_master AS m ON m.name = s.name GROUP BY 1 ORDER BY 2 DESC"
            )
        }
        rows = {name: conn.execute(f'SELECT count(*) FROM "{name}"').fetchone()[0] for name in kib}
        closed = conn.execute("SELECT count(*) FROM producers WHERE closed = 1").fetchone()[0]
    finally:
        conn.close()
    return {"kib": kib, "rows": rows, "closed_producers": closed}


def _peak(samples: list[dict[str, float]], key: str, start: float, end: float) -> float | None:
    values = [s[key] for s in samples if start <= s["t_s"] < end]
    return max(values) if values else None


async def soak(
    journal: Path, *, minutes: float, kill_every_s: float, seed: int, load: Load, retention: int = RETENTION
) -> dict[str, Any]:
    samples: list[dict[str, float]] = []
    kills: list[float] = []
    per_kill: list[dict[str, Any]] = []
    began = time.perf_counter()
    deadline = began + minutes * 60
    async with KillTrials(journal, seed=seed, load=load, retention=retention).open() as harness:
        tally = harness.tally
        while time.perf_counter() < deadline:
            before = tally.summary()
            left = deadline - time.perf_counter()
            await harness.trial(
                min(kill_every_s, max(left, 1.0)), beside=lambda r: _sample(r, journal, began, samples)
            )
            kills.append(round(time.perf_counter() - began, 2))
            after = tally.summary()
            per_kill.append({key: after[key] - before[key] for key in TALLY})
            say(
                f"kill {tally.trials} at {kills[-1]:.0f} s: {after['records']} records,"
                f" {after['acknowledged']} acknowledged, lost {after['lost']},"
                f" duplicated {after['duplicated']}, broken {after['broken']};"
                f" RSS {fmt(samples[-1]['rss_mib'] if samples else None)} MiB,"
                f" WAL {fmt(samples[-1]['wal_mib'] if samples else None)} MiB"
            )
        summary = tally.summary()
    minutes_seen = max(1, math.ceil((kills[-1] if kills else 0) / 60))
    by_minute = [
        {
            "minute": m + 1,
            "rss_peak_mib": _peak(samples, "rss_mib", m * 60, (m + 1) * 60),
            "wal_peak_mib": _peak(samples, "wal_mib", m * 60, (m + 1) * 60),
            "db_peak_mib": _peak(samples, "db_mib", m * 60, (m + 1) * 60),
        }
        for m in range(minutes_seen)
        if any(m * 60 <= s["t_s"] < (m + 1) * 60 for s in samples)
    ]
    flat = {}
    for key in ("rss_peak_mib", "wal_peak_mib"):
        peaks = [m[key] for m in by_minute if m[key]]
        growth = peaks[-1] / peaks[0] if len(peaks) >= 2 else None
        flat[key] = {
            "first": peaks[0] if peaks else None,
            "last": peaks[-1] if peaks else None,
            "growth": growth,
        }
    # The journal file grows while the retention window fills; after that it should not.
    files = [m["db_peak_mib"] for m in by_minute if m["db_peak_mib"]]
    half = len(files) // 2
    late_growth = (files[-1] - files[half]) / (len(files) - 1 - half) if len(files) >= 3 else None
    return {
        **summary,
        "kills_at_s": kills,
        "db_growth_mib_per_minute": late_growth,
        "per_kill": per_kill,
        "samples": samples,
        "by_minute": by_minute,
        "flat": flat,
        "flat_within": FLAT_WITHIN,
        "retention": retention,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="how long (default 10)")
    parser.add_argument("--kill-every-s", type=float, default=60.0, help="seconds between kills (default 60)")
    parser.add_argument("--figure", type=Path, default=None, help="where to write the plot (PNG)")
    parser.add_argument("--quick", action="store_true", help="half a minute, a kill every 10 s")
    parser.add_argument(
        "--retention",
        type=int,
        default=RETENTION,
        help=f"the runner's --retention (default {RETENTION}); the records between two kills must fit",
    )
    add_load_arguments(parser)
    args = parser.parse_args(argv)
    minutes, kill_every_s = (0.5, 10.0) if args.quick else (args.minutes, args.kill_every_s)
    seed, load, said = load_of(args)
    say(f"bench.soak: {minutes:g} min, a kill every {kill_every_s:g} s, seed {seed}")
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-soak-") as scratch:
        found = trio.run(
            lambda: soak(
                Path(scratch) / "j.db",
                minutes=minutes,
                kill_every_s=kill_every_s,
                seed=seed,
                load=load,
                retention=args.retention,
            )
        )
        found["tables"] = _tables(Path(scratch) / "j.db")
    results = {
        "benchmark": "soak",
        "command": "python -m bench.soak " + " ".join(sys.argv[1:] if argv is None else argv),
        "seed": seed,
        "minutes": minutes,
        "kill_every_s": kill_every_s,
        "seconds": time.perf_counter() - began,
        "load": said,
        "machine": machine_info(),
        **found,
    }
    path = write_results("soak", results)
    print_tally({"minutes": f"{minutes:g}", "kills": str(found["trials"])}, found)
    print()
    print_table(
        ("minute", "runner RSS peak, MiB", "WAL peak, MiB", "journal file peak, MiB"),
        [
            [str(m["minute"]), fmt(m["rss_peak_mib"]), fmt(m["wal_peak_mib"]), fmt(m["db_peak_mib"])]
            for m in found["by_minute"]
        ],
    )
    for key, label in (("rss_peak_mib", "RSS"), ("wal_peak_mib", "WAL")):
        f = found["flat"][key]
        if f["growth"] is not None:
            verdict = "flat" if f["growth"] <= FLAT_WITHIN else "NOT flat"
            print(
                f"{label}: {fmt(f['first'])} MiB in the first minute, {fmt(f['last'])} MiB in the last"
                f" (x{f['growth']:.2f}): {verdict} (flat = no more than x{FLAT_WITHIN})"
            )
    tables = found["tables"]
    print()
    print_table(
        ("at the end: table", "rows", "KiB"),
        [[name, str(tables["rows"][name]), str(size)] for name, size in tables["kib"].items() if size > 4],
    )
    print(f"producers: {tables['rows']['producers']}, {tables['closed_producers']} of them closed")
    files = [m["db_peak_mib"] for m in found["by_minute"]]
    if found["db_growth_mib_per_minute"] is not None:
        print(
            f"journal file: {fmt(files[len(files) // 2])} MiB in minute {len(files) // 2 + 1},"
            f" {fmt(files[-1])} MiB in the last: {found['db_growth_mib_per_minute']:+.3f} MiB a minute"
            " in the second half (the retention window fills in the first)"
        )
    try:
        from .report import soak_figure

        figure = args.figure or RESULTS_DIR / f"soak-{utc_stamp()}.png"
        soak_figure(results, figure)
        print(f"figure: {figure}")
    except ImportError as error:
        print(f"(no figure: {error}; pip install -e '.[bench]')")
    print(f"seed {seed}; results: {path}")
    return 0 if not (found["lost"] or found["duplicated"] or found["broken"]) else 1


if __name__ == "__main__":
    sys.exit(main())
