"""kill -9 trials: a runner killed at random moments of a mixed load loses and repeats nothing.

    python -m bench.kill [--trials N] [--seed S] [--quick]

Each trial loads a real ``runner serve`` (calls started and stopped, host messages, records
the agent sends the host, agent-socket conversations, followers of the events stream),
kills it with SIGKILL at a random moment, restarts it on the same journal and checks what
survived (tests/faults/kill_load.py: the same load and checks as the fault suite's test).
Prints trials, records acknowledged, lost and duplicated; results go to
``bench/results/kill-<UTC>.json`` and ``kill-latest.json``. Exits 1 if anything was lost,
duplicated or broken.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import trio

from tests.faults.kill_load import KillTrials, Load, run_trials

from ._common import machine_info, print_table, say, write_results

TALLY = {  # a tally's figures, and their column headers
    "records": "records",
    "acknowledged": "acknowledged",
    "lost": "lost",
    "duplicated": "duplicated",
    "broken": "broken",
    "crashed_calls": "calls closed as crashed",
}


def add_load_arguments(parser: argparse.ArgumentParser) -> None:
    """The options bench.kill and bench.soak share: the seed and the load."""
    default = Load()
    parser.add_argument("--seed", type=int, default=None, help="repeat a run (default: a new seed)")
    parser.add_argument(
        "--hosts", type=int, default=default.hosts, help="host tasks placing calls and messages"
    )
    parser.add_argument("--followers", type=int, default=default.followers, help="events-stream followers")
    parser.add_argument(
        "--sockets", type=int, default=default.sockets, help="agent-socket conversations at once"
    )


def load_of(args: argparse.Namespace) -> tuple[int, Load, dict[str, int]]:
    """The seed (a new one unless given), the load, and the load as results say it."""
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    said = {"hosts": args.hosts, "followers": args.followers, "sockets": args.sockets}
    return seed, Load(**said), said


def print_tally(first: dict[str, str], summary: dict[str, Any]) -> None:
    """One row: ``first``'s columns, then the tally's; then examples of what broke."""
    print_table((*first, *TALLY.values()), [[*first.values(), *(str(summary[key]) for key in TALLY)]])
    for example in summary["examples"]:
        print(f"  {example}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.kill", description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200, help="kills (default 200)")
    parser.add_argument("--quick", action="store_true", help="10 trials")
    add_load_arguments(parser)
    args = parser.parse_args(argv)
    trials = 10 if args.quick else args.trials
    seed, load, said = load_of(args)
    began = time.perf_counter()

    def progress(harness: KillTrials) -> None:
        t = harness.tally
        say(
            f"trial {t.trials}/{trials}: {t.records} records, {t.acknowledged} acknowledged,"
            f" lost {len(t.lost)}, duplicated {len(t.duplicated)}, broken {len(t.broken)}"
        )

    with tempfile.TemporaryDirectory(prefix="bench-kill-") as scratch:
        say(f"bench.kill: {trials} trials, seed {seed}")
        tally = trio.run(
            lambda: run_trials(Path(scratch) / "j.db", trials=trials, seed=seed, load=load, on_trial=progress)
        )
    summary = tally.summary()
    results = {
        "benchmark": "kill",
        "command": "python -m bench.kill " + " ".join(sys.argv[1:] if argv is None else argv),
        "seed": seed,
        "seconds": time.perf_counter() - began,
        "load": said,
        "machine": machine_info(),
        **summary,
    }
    path = write_results("kill", results)
    print_tally({"trials": str(summary["trials"])}, summary)
    print(f"seed {seed}; results: {path}")
    return 0 if tally.ok else 1


if __name__ == "__main__":
    sys.exit(main())
