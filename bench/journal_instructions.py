"""Instructions per appended record: the journal against raw sqlite3, and where the difference goes.

    python -m bench.journal_instructions [--producers 50] [--records 10000]

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
record is attributed. Needs valgrind.

Results go to ``bench/results/journal_instructions-<UTC>.json`` and ``...-latest.json``.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import trio

from ._common import freeze_heap_as_the_runner_does, machine_info, say, write_results

TOTALS = re.compile(rb"^totals:\s+(\d+)", re.MULTILINE)
OBJECTS = ("libpython", "libsqlite3", "libc.so")


async def _toggle(state: str) -> None:
    await trio.run_process(["callgrind_control", "-i", state, str(os.getpid())], capture_stdout=True)


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
        await _toggle("on")
        async with trio.open_nursery() as nursery:
            for k in range(producers):
                nursery.start_soon(produce, k, per_producer, 2)
        await _toggle("off")


async def _raw_child(path: Path, producers: int, records: int) -> None:
    from .journal import _raw_trial

    # Warm (imports, the connection's code paths) on a file of its own; measure on a new one.
    _raw_trial(
        path.with_name("warm.db"), batch=producers, producers=producers, records=producers * 2, seconds=60
    )
    await _toggle("on")
    _raw_trial(path, batch=producers, producers=producers, records=records, seconds=3600)
    await _toggle("off")


def _count(side: str, producers: int, records: int, data_dir: Path) -> dict[str, Any]:
    out = data_dir / f"callgrind-journal-{side}-{os.getpid()}.out"
    command = [
        "valgrind",
        "--tool=callgrind",
        "--instr-atstart=no",
        f"--callgrind-out-file={out}",
        sys.executable,
        "-m",
        "bench.journal_instructions",
        "--child",
        side,
        "--producers",
        str(producers),
        "--records",
        str(records),
        "--data-dir",
        str(data_dir),
    ]
    subprocess.run(command, check=True, capture_output=True, timeout=3600)
    try:
        found = TOTALS.search(out.read_bytes())
        assert found, f"no totals in {out}"
        annotated = subprocess.run(
            ["callgrind_annotate", "--threshold=100", str(out)], check=True, capture_output=True, text=True
        ).stdout
    finally:
        out.unlink(missing_ok=True)
    by_object = dict.fromkeys((*OBJECTS, "other"), 0)
    others: dict[str, int] = {}
    for line in annotated.splitlines():
        match = re.match(r"^\s*([\d,]+)\s+\(\s*[\d.]+%\)\s+(.*)$", line)
        if not match or "PROGRAM TOTALS" in line:
            continue
        count = int(match.group(1).replace(",", ""))
        where = match.group(2)
        owner = next((name for name in OBJECTS if name in where), "other")
        if owner == "other" and "/Python-3." in where:
            owner = "libpython"  # the interpreter's inlined functions, shown by source file only
        by_object[owner] += count
        # The rest by its object's file name (a C extension module, the dynamic loader...).
        if owner == "other":
            found_object = re.search(r"\[([^\]]+)\]\s*$", where)
            name = Path(found_object.group(1)).name if found_object else "(unknown object)"
            others[name] = others.get(name, 0) + count
    top = dict(sorted(others.items(), key=lambda item: -item[1])[:8])
    return {"instructions": int(found.group(1)), "by_object": by_object, "other_by_object": top}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.journal_instructions", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--producers", type=int, default=50)
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--data-dir", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--child", choices=("journal", "raw"), default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        freeze_heap_as_the_runner_does()
        with tempfile.TemporaryDirectory(dir=args.data_dir) as tmp:
            child = _journal_child if args.child == "journal" else _raw_child
            trio.run(child, Path(tmp) / "bench.db", args.producers, args.records)
        return 0
    if not (shutil.which("valgrind") and shutil.which("callgrind_control")):
        reason = "valgrind is not installed (apt-get install valgrind)"
        say(reason)
        write_results("journal_instructions", {"benchmark": "journal_instructions", "skipped": reason})
        return 0
    sides = {}
    for side in ("journal", "raw"):
        say(f"  {side}: counting {args.records} appends under callgrind (minutes)")
        got = _count(side, args.producers, args.records, args.data_dir)
        got["per_record"] = got["instructions"] / args.records
        got["per_record_by_object"] = {k: v / args.records for k, v in got["by_object"].items()}
        sides[side] = got
        say(f"  {side}: {got['per_record']:,.0f} instructions per record")
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
    for side in ("journal", "raw"):
        other = sides[side]["other_by_object"]
        print(f"  {side}'s other: " + ", ".join(f"{k} {v / args.records:,.0f}" for k, v in other.items()))
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
