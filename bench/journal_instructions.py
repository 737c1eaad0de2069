"""Instructions per appended record: the journal against raw sqlite3, and where the difference goes.

    python -m bench.journal_instructions [--producers 50] [--records 10000] [--before REV]

Throughput on a shared machine moves with its disk and its other load; instruction counts
do not (an fsync is a system call: its wait is not counted). Each side runs in a process of
its own under ``valgrind --tool=callgrind``, instrumentation switched on only around the
measured appends (after the file is open and warm):

* journal: ``--producers`` tasks append ``--records`` records in all through
  ``Journal.append``, as ``bench.journal`` does (the group size comes out as the producers);
* raw: ``bench.journal``'s raw sqlite3 loop at a batch of ``--producers`` rows, same table,
  WAL and ``synchronous = FULL``.

The figure is instructions per record on each side, split by the object they ran in
(libpython: the interpreter, libsqlite3, libc, the rest), so the journal's extra cost per
record is attributed. With ``--before REV`` the journal side is also counted on the code
of commit ``REV`` (exported with ``git archive``), so a change is shown against the build
before it in the same run. Needs valgrind (``bench/_callgrind.py``).

Results go to ``bench/results/journal_instructions-<UTC>.json`` and ``...-latest.json``.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import trio
import trio.testing

from . import _callgrind
from ._common import freeze_heap_as_the_runner_does, machine_info, say, write_results


async def _journal_child(path: Path, producers: int, records: int) -> None:
    from journal import open_journal

    from .journal import _body

    per_producer = math.ceil(records / producers)
    async with open_journal(path) as journal:

        async def produce(k: int, count: int, base: int) -> None:
            for i in range(count):
                await journal.append(f"p{k}", "conversation", _body(base + i))

        async with trio.open_nursery() as nursery:  # warm: every producer known, the file grown
            for k in range(producers):
                nursery.start_soon(produce, k, 2, 0)
        # The tasks start before the count and end after it: it counts their appends only
        # (raw's loop starts no task).
        go, done, release = trio.Event(), trio.Event(), trio.Event()
        running = producers

        async def produce_when_told(k: int) -> None:
            nonlocal running
            name = f"p{k}"
            await go.wait()
            for i in range(2, 2 + per_producer):  # as produce does, in this frame
                await journal.append(name, "conversation", _body(i))
            running -= 1
            if running == 0:
                done.set()
            await release.wait()

        async with trio.open_nursery() as nursery:
            for k in range(producers):
                nursery.start_soon(produce_when_told, k)
            await trio.testing.wait_all_tasks_blocked()
            async with _callgrind.counting():
                go.set()
                await done.wait()
            release.set()


async def _raw_child(path: Path, producers: int, records: int) -> None:
    from .journal import _raw_trial

    # Warm (imports, the connection's code paths) on a file of its own; measure on a new one.
    _raw_trial(
        path.with_name("warm.db"), batch=producers, producers=producers, records=producers * 2, seconds=60
    )
    async with _callgrind.counting():
        _raw_trial(path, batch=producers, producers=producers, records=records, seconds=3600)


def _count(
    side: str, producers: int, records: int, data_dir: Path, tree: Path | None = None
) -> dict[str, Any]:
    args = [
        "--child",
        side,
        "--producers",
        str(producers),
        "--records",
        str(records),
        "--data-dir",
        str(data_dir),
    ]
    got = _callgrind.count("bench.journal_instructions", args, data_dir, by_object=True, tree=tree)
    got["per_record"] = got["instructions"] / records
    got["per_record_by_object"] = {k: v / records for k, v in got["by_object"].items()}
    return got


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.journal_instructions", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--producers", type=int, default=50)
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--data-dir", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument(
        "--before", metavar="REV", help="also count the journal of this commit (the build before a change)"
    )
    parser.add_argument("--child", choices=("journal", "raw"), default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        freeze_heap_as_the_runner_does()
        with tempfile.TemporaryDirectory(dir=args.data_dir) as tmp:
            child = _journal_child if args.child == "journal" else _raw_child
            trio.run(child, Path(tmp) / "bench.db", args.producers, args.records)
        return 0
    reason = _callgrind.missing()
    if reason:
        say(reason)
        write_results("journal_instructions", {"benchmark": "journal_instructions", "skipped": reason})
        return 0
    sides = {}
    for side in ("journal", "raw"):
        say(f"  {side}: counting {args.records} appends under callgrind (minutes)")
        sides[side] = _count(side, args.producers, args.records, args.data_dir)
        say(f"  {side}: {sides[side]['per_record']:,.0f} instructions per record")
    before = None
    if args.before:
        say(f"  journal at {args.before}: counting {args.records} appends under callgrind")
        with _callgrind.source_tree(args.before) as tree:
            before = _count("journal", args.producers, args.records, args.data_dir, tree)
        before["rev"] = args.before
        say(f"  journal at {args.before}: {before['per_record']:,.0f} instructions per record")
    journal, raw = sides["journal"], sides["raw"]
    extra = {k: journal["per_record_by_object"][k] - raw["per_record_by_object"][k] for k in raw["by_object"]}
    results = {
        "benchmark": "journal_instructions",
        "command": "python -m bench.journal_instructions "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "finished_at_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine_info(args.data_dir),
        "producers": args.producers,
        "records": args.records,
        "sides": sides,
        "ratio": raw["per_record"] / journal["per_record"],
        "journal_extra_per_record_by_object": extra,
        "before": before and {**before, "ratio": raw["per_record"] / before["per_record"]},
        "notes": "callgrind Ir per appended record; an fsync's wait is not an instruction",
    }
    path = write_results("journal_instructions", results)
    print(
        f"instructions per record at {args.producers} producers: journal {journal['per_record']:,.0f},"
        f" raw {raw['per_record']:,.0f} (raw / journal {results['ratio']:.2f})"
    )
    for name, value in extra.items():
        print(
            f"  {name}: journal {journal['per_record_by_object'][name]:,.0f},"
            f" raw {raw['per_record_by_object'][name]:,.0f} ({value:+,.0f})"
        )
    if before:
        print(
            f"  the journal at {before['rev']}, same run: {before['per_record']:,.0f} instructions per record"
            f" (raw / journal {results['before']['ratio']:.2f})"
        )
    for side in ("journal", "raw"):
        other = sides[side]["other_by_object"]
        print(f"  {side}'s other: " + ", ".join(f"{k} {v / args.records:,.0f}" for k, v in other.items()))
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
