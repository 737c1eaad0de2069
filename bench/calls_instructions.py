"""Instructions per call start while a runner holds 1 call and while it holds many.

    python -m bench.calls_instructions [--held 1000] [--probes 100]

Wall-clock percentiles on a shared machine move with its other load; instruction counts
do not. Each level runs in a process of its own under ``valgrind --tool=callgrind`` with
instrumentation off while the runner starts and fills (in-process runner, loopback
transport, no agent, as ``bench.calls``); it is switched on (``callgrind_control -i on``)
for ``--probes`` sequential start-and-stop round trips over HTTP, then off. The figure is
instructions per round trip (client and runner share the process, as in ``bench.calls``),
and its growth from 1 call held to ``--held``. Needs valgrind (``apt-get install valgrind``).

Results go to ``bench/results/calls_instructions-<UTC>.json`` and ``...-latest.json``.
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import trio

from . import _callgrind
from ._common import freeze_heap_as_the_runner_does, machine_info, say, write_results


async def _probe(level: int, probes: int, data_dir: Path) -> None:
    from .calls import _fill, open_runner

    async with open_runner(data_dir, f"instructions-{level}", level + probes + 50) as (runner, api):
        for i in range(20):
            await api.start(f"warm-{i}")
            await api.stop(f"warm-{i}")
        await _fill(api, runner, level, 20, time.perf_counter() + 3600, in_process=True)
        for i in range(20):  # the probe's own path, warm
            await api.start(f"again-{i}")
            await api.stop(f"again-{i}")
        gc.collect()
        async with _callgrind.counting():
            for i in range(probes):
                await api.start(f"probe-{i}")
                await api.stop(f"probe-{i}")


def _count(level: int, probes: int, data_dir: Path) -> int:
    """Run one level under callgrind; return the instructions it counted while switched on."""
    args = ["--child", str(level), "--probes", str(probes), "--data-dir", str(data_dir)]
    instructions: int = _callgrind.count("bench.calls_instructions", args, data_dir)["instructions"]
    return instructions


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.calls_instructions", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--held", type=int, default=1000, help="the calls held at the second level")
    parser.add_argument("--probes", type=int, default=100, help="start-and-stop round trips counted")
    parser.add_argument("--data-dir", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        freeze_heap_as_the_runner_does()
        trio.run(_probe, args.child, args.probes, args.data_dir)
        return 0
    reason = _callgrind.missing()
    if reason:
        say(reason)
        write_results("calls_instructions", {"benchmark": "calls_instructions", "skipped": reason})
        return 0
    levels: dict[int, Any] = {}
    for level in (1, args.held):
        say(f"  {level} held: counting {args.probes} starts under callgrind (minutes)")
        total = _count(level, args.probes, args.data_dir)
        levels[level] = {"instructions": total, "per_start": total / args.probes}
        say(f"  {level} held: {total / args.probes:,.0f} instructions per start and stop")
    growth = levels[args.held]["per_start"] / levels[1]["per_start"]
    results = {
        "benchmark": "calls_instructions",
        "command": "python -m bench.calls_instructions "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "finished_at_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine_info(args.data_dir),
        "probes": args.probes,
        "levels": {str(k): v for k, v in levels.items()},
        "growth": growth,
        "notes": "instructions (callgrind Ir) per start-and-stop over HTTP, client and runner in one process",
    }
    path = write_results("calls_instructions", results)
    print(
        f"instructions per start and stop: {levels[1]['per_start']:,.0f} at 1 call held,"
        f" {levels[args.held]['per_start']:,.0f} at {args.held} (x{growth:.3f})"
    )
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
