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

import trio

from tests.faults.kill_load import KillTrials, Load, run_trials

from ._common import machine_info, print_table, say, write_results


def main(argv: Sequence[str] | None = None) -> int:
    default = Load()
    parser = argparse.ArgumentParser(prog="python -m bench.kill", description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200, help="kills (default 200)")
    parser.add_argument("--seed", type=int, default=None, help="repeat a run (default: a new seed)")
    parser.add_argument("--quick", action="store_true", help="10 trials")
    parser.add_argument(
        "--hosts", type=int, default=default.hosts, help="host tasks placing calls and messages"
    )
    parser.add_argument("--followers", type=int, default=default.followers, help="events-stream followers")
    parser.add_argument(
        "--sockets", type=int, default=default.sockets, help="agent-socket conversations at once"
    )
    args = parser.parse_args(argv)
    trials = 10 if args.quick else args.trials
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    load = Load(hosts=args.hosts, followers=args.followers, sockets=args.sockets)
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
        "load": {"hosts": load.hosts, "followers": load.followers, "sockets": load.sockets},
        "machine": machine_info(),
        **summary,
    }
    path = write_results("kill", results)
    print_table(
        ("trials", "records", "acknowledged", "lost", "duplicated", "broken", "calls closed as crashed"),
        [
            [
                str(summary["trials"]),
                str(summary["records"]),
                str(summary["acknowledged"]),
                str(summary["lost"]),
                str(summary["duplicated"]),
                str(summary["broken"]),
                str(summary["crashed_calls"]),
            ]
        ],
    )
    for example in summary["examples"]:
        print(f"  {example}")
    print(f"seed {seed}; results: {path}")
    return 0 if tally.ok else 1


if __name__ == "__main__":
    sys.exit(main())
