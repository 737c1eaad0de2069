"""Generated-input benchmark: the checks of tests/fuzz/, for longer, against real runners.

    python -m bench.fuzz [--quick] [--examples N] [--seed S] [--only management|socket|public|wire]

Four ``runner serve`` processes on loopback, as the CI suite uses them: one of
``tests.agents:messenger`` for every route of the management API, one of
``tests.websocket.ino_agents:text_only`` for every client frame of the ino.v2 agent socket,
another of it for every public REST route (ephemeral keys, agent sessions, relations), and
another for the attacks on the HTTP and WebSocket layer below the routes (``tests/fuzz/_wire.py``:
request smuggling shapes, ``HEAD`` on every route, oversized, nested and compressed first
frames before ``auth`` while ``/health`` must keep answering; the runner's peak memory growth
over them is printed).
Each route and each frame gets ``N`` generated examples (valid and mutated, from
``runner/protocol.schema.json`` and ``runner/ino.schema.json``) with Hypothesis, seeded with
``S``; every example is checked as the suite checks it (an answer, never a 500, a documented
code, nothing journaled or stored for a refusal, ``/health`` after it), and each runner must
still start and stop a call / take a turn at the end. A violation is shrunk by Hypothesis and
reported with its smallest example.

Prints how many examples ran per route and frame, how each was answered, and the violations
found (0 is the only passing figure). Results go to ``bench/results/fuzz-<UTC>.json`` and
``fuzz-latest.json``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import trio
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from tests.fuzz import _http, _public, _socket, _wire
from tests.websocket.ino_client import BackgroundRunner

from ._common import machine_info, print_table, say, write_results

QUICK_EXAMPLES = 15
FULL_EXAMPLES = 100


def _explore(
    strategy: st.SearchStrategy[Any], check: Callable[[Any], None], examples: int, at: int
) -> str | None:
    """Run ``check`` on ``examples`` values of ``strategy``; the shrunk violation, if any."""

    @seed(at)
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )
    @given(strategy)
    def run(case: Any) -> None:
        check(case)

    try:
        run()
    except Exception as exc:  # noqa: BLE001 - any failure of a check is a violation to report, with its example
        notes = "\n".join(getattr(exc, "__notes__", []))
        return f"{type(exc).__name__}: {exc}\n{notes}".strip()
    return None


def _storm(
    runner: BackgroundRunner,
    names: Sequence[str],
    strategy_of: Callable[[str], st.SearchStrategy[Any]],
    check: Callable[[Any], None],
    healthy: Callable[[int], None],
    examples: int,
    at: int,
) -> dict[str, str]:
    """Each name's examples, then the runner's health; the violations by name (and the runner's tracebacks)."""
    violations: dict[str, str] = {}
    try:
        for n, name in enumerate(names):
            say(f"fuzz: {name} ({examples} examples)")
            found = _explore(strategy_of(name), check, examples, at)
            if found is None:
                found = _explore(st.just(n), healthy, 1, at)
            if found is not None:
                violations[name] = found
                say(f"fuzz: VIOLATION on {name}:\n{found}")
    finally:
        runner.stop()
    tracebacks = [at for at, line in enumerate(runner.stderr) if "Traceback" in line]
    if tracebacks:
        first = "\n".join(runner.stderr[tracebacks[0] : tracebacks[0] + 40])
        violations[f"runner of {names[0]}..."] = (
            f"{len(tracebacks)} tracebacks on the runner's stderr; the first:\n{first}"
        )
    return violations


def _management(journal: Path, examples: int, at: int) -> dict[str, str]:
    runner = BackgroundRunner(journal, *_http.RUNNER_ARGS, agent=_http.RUNNER_AGENT)
    target = _http.Management(runner.addresses.management)
    trio.run(_http.prepare, target)
    return _storm(
        runner,
        sorted(_http.ROUTES),
        _http.requests,
        lambda case: trio.run(_http.check_request, target, case),
        lambda n: trio.run(_http.check_healthy, target, n),
        examples,
        at,
    )


def _agent_socket(journal: Path, examples: int, at: int) -> dict[str, str]:
    runner = BackgroundRunner(journal, *_socket.RUNNER_ARGS, agent=_socket.RUNNER_AGENT)
    target = _socket.AgentSocket(runner.addresses)
    trio.run(target.mint)
    return _storm(
        runner,
        _socket.FRAMES,
        _socket.frames,
        lambda case: trio.run(_socket.check_frame, target, case),
        lambda _: trio.run(_socket.check_healthy, target),
        examples,
        at,
    )


def _public_routes(journal: Path, examples: int, at: int) -> dict[str, str]:
    runner = BackgroundRunner(journal, *_socket.RUNNER_ARGS, agent=_socket.RUNNER_AGENT)
    target = _public.Public(runner.addresses, journal)
    trio.run(_public.prepare, target)
    return _storm(
        runner,
        sorted(_public.ROUTES),
        _public.requests,
        lambda case: trio.run(_public.check_request, target, case),
        lambda _: trio.run(_public.check_healthy, target),
        examples,
        at,
    )


PEAK: dict[str, float] = {}


def _peak_rss_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:")) / 1024


def _wire_attacks(journal: Path, examples: int, at: int) -> dict[str, str]:
    runner = BackgroundRunner(journal, *_socket.RUNNER_ARGS, agent=_socket.RUNNER_AGENT)
    target = _wire.Wire(runner.addresses)
    pid = runner.process.pid
    PEAK["before"] = _peak_rss_mib(pid)

    def healthy(_: int) -> None:
        trio.run(_wire.check_healthy, target)
        PEAK["after"] = _peak_rss_mib(pid)

    return _storm(
        runner,
        _wire.ATTACKS,
        _wire.attacks,
        lambda case: trio.run(_wire.check_attack, target, case),
        healthy,
        examples,
        at,
    )


def _answers(counter: Any, name: str) -> str:
    got = sorted(((answer, n) for (key, answer), n in counter.items() if key == name), key=lambda a: -a[1])
    return ", ".join(f"{answer} x{n}" for answer, n in got)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fuzz", description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_EXAMPLES} examples per route and frame")
    parser.add_argument(
        "--examples", type=int, help=f"examples per route and frame (default {FULL_EXAMPLES})"
    )
    parser.add_argument("--seed", type=int, default=0, help="Hypothesis' seed (default 0)")
    parser.add_argument(
        "--only", choices=("management", "socket", "public", "wire"), help="one of the four (default: all)"
    )
    args = parser.parse_args(argv)
    examples = args.examples or (QUICK_EXAMPLES if args.quick else FULL_EXAMPLES)
    command = f"python -m bench.fuzz --examples {examples} --seed {args.seed}" + (
        f" --only {args.only}" if args.only else ""
    )
    machine = machine_info()
    say(f"{command}: {machine['cores']} cores, Python {machine['python']}")
    began = time.perf_counter()
    storms = {
        "management": _management,
        "socket": _agent_socket,
        "public": _public_routes,
        "wire": _wire_attacks,
    }
    violations: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="bench-fuzz-") as tmp:
        for name, storm in storms.items():
            if args.only in (None, name):
                violations.update(storm(Path(tmp) / f"{name}.db", examples, args.seed))
    elapsed = time.perf_counter() - began
    rows = (
        [[f"route {r}", _http.TALLY[r], _answers(_http.ANSWERS, r)] for r in sorted(_http.ROUTES)]
        + [[f"frame {verb}", _socket.TALLY[verb], _answers(_socket.ANSWERS, verb)] for verb in _socket.FRAMES]
        + [[f"public {r}", _public.TALLY[r], _answers(_public.ANSWERS, r)] for r in sorted(_public.ROUTES)]
        + [[f"wire {a}", _wire.TALLY[a], _answers(_wire.ANSWERS, a)] for a in _wire.ATTACKS]
    )
    results = {
        "benchmark": "fuzz",
        "profile": "quick" if args.quick else "full",
        "command": command,
        "finished_at_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "seconds": elapsed,
        "machine": machine,
        "parameters": {"examples": examples, "seed": args.seed, "only": args.only},
        "examples": sum(_http.TALLY.values())
        + sum(_socket.TALLY.values())
        + sum(_public.TALLY.values())
        + sum(_wire.TALLY.values()),
        "routes": {
            route: {"examples": _http.TALLY[route], "answers": _answers(_http.ANSWERS, route)}
            for route in _http.ROUTES
        },
        "frames": {
            verb: {"examples": _socket.TALLY[verb], "answers": _answers(_socket.ANSWERS, verb)}
            for verb in _socket.FRAMES
        },
        "public_routes": {
            route: {"examples": _public.TALLY[route], "answers": _answers(_public.ANSWERS, route)}
            for route in _public.ROUTES
        },
        "wire_attacks": {
            attack: {"examples": _wire.TALLY[attack], "answers": _answers(_wire.ANSWERS, attack)}
            for attack in _wire.ATTACKS
        },
        "wire_peak_rss_mib": dict(PEAK),
        "wire_health_ms_during_first_frames": {
            "asked": len(_wire.HEALTH_MS),
            "max": max(_wire.HEALTH_MS, default=None),
            "median": statistics.median(_wire.HEALTH_MS) if _wire.HEALTH_MS else None,
        },
        "violations": len(violations),
        "violation_details": violations,
    }
    path = write_results("fuzz", results)
    print()
    print(f"{command} ({elapsed:.0f} s; {machine['cores']} cores, Python {machine['python']})")
    print_table(("route / frame", "examples run", "answered"), rows)
    if _wire.HEALTH_MS:
        print(
            f"wire: /health asked {len(_wire.HEALTH_MS)} times during first-frame attacks, the slowest"
            f" answer {max(_wire.HEALTH_MS):.0f} ms (median {statistics.median(_wire.HEALTH_MS):.0f} ms)"
        )
    if "after" in PEAK:
        print(
            f"wire: the runner's peak memory {PEAK['before']:.0f} MiB before the attacks,"
            f" {PEAK['after']:.0f} MiB after them (+{PEAK['after'] - PEAK['before']:.0f} MiB)"
        )
    print(f"examples: {results['examples']}; violations: {len(violations)}")
    for where, what in violations.items():
        print(f"\nVIOLATION {where}:\n{what}")
    print(f"results: {path}")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
