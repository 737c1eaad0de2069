"""Telemetry benchmark: what Prometheus metrics and OpenTelemetry tracing cost, on against off.

    python -m bench.telemetry [--quick]

1. A turn: ``AgentRuntime.take_turn`` (the instrumented path: the turn's span and counters,
   a stage around each model request and each sentence's synthesis) with the offline
   providers (the local model, espeak-ng), in three modes: ``off`` (no metrics, no
   tracing: what code outside a runner sees), ``metrics``, and ``metrics+tracing`` (the
   SDK's ``TracerProvider`` with a batch processor and an exporter that drops the spans,
   so what is measured is the runner's side, not an exporter's network).
2. A journal append: concurrent appenders on a real journal file, with the commit hook
   (``curb_journal_appends_total``, ``curb_journal_commit_seconds``) off and on. Tracing
   adds nothing on this path (no span per append), so it has no third mode.

Modes alternate in rounds within one run (the same machine, the same minute), each round
in a fresh task so a mode's context variable does not leak. The figure is the overhead of
each mode against ``off``: median turn time, and appends per second. Goal: under 5%.

Results go to ``bench/results/telemetry-<UTC>.json`` and ``telemetry-latest.json``.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import trio
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from journal import open_journal
from runner.agent import LLM, TTS, Agent, AgentRuntime, Context
from runner.calls import CallContext
from runner.telemetry import Metrics, configure_tracing, stage
from runner.transports.loopback import LoopbackSession

from ._common import (
    Budget,
    fmt,
    freeze_heap_as_the_runner_does,
    machine_info,
    print_table,
    say,
    write_results,
)

GOAL = 0.05
TURN_MODES = ("off", "metrics", "metrics+tracing")
JOURNAL_MODES = ("off", "metrics")
QUESTIONS = ("what is the weather in lisbon", "when is breakfast served", "what is the weather in oslo")


class _Drop(SpanExporter):
    """Takes spans and keeps none (only counts them): the cost measured is the runner's."""

    def __init__(self) -> None:
        self.spans = 0

    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        self.spans += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def _agent() -> Agent:
    agent = Agent(
        "bench",
        instructions="You are the concierge of Hotel Lumen. Breakfast is served from seven to eleven.",
        llm=LLM(provider="local", model="local"),
        tts=TTS(provider="espeak", voice="en"),
    )

    @agent.tool
    def weather(ctx: Context, city: str) -> str:
        """Tell the weather forecast for a city."""
        return f"In {city} it is sunny and 24 degrees."

    return agent


async def _turns(agent: Agent, mode: str, count: int, provider: TracerProvider) -> list[float]:
    """``count`` turns of one call in ``mode``, each timed; run in a task of its own."""
    metrics = Metrics() if mode != "off" else None
    if metrics is not None:
        metrics.use()  # this task's context only
    configure_tracing(provider if mode == "metrics+tracing" else None)
    call = CallContext(session_id=f"bench-{mode}", direction="inbound", client={}, experiments={})
    runtime = AgentRuntime(agent, call, None, host_connected=False)
    session = LoopbackSession("app")
    times: list[float] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(runtime.run, session, session.events)
        await runtime.ready.wait()
        for index in range(count):
            began = time.perf_counter()
            result = await runtime.take_turn(QUESTIONS[index % len(QUESTIONS)])
            times.append(time.perf_counter() - began)
            assert result is not None and not result.interrupted, result
        nursery.cancel_scope.cancel()
    configure_tracing(None)
    return times


async def _appends(path: Path, mode: str, producers: int, seconds: float) -> tuple[float, float]:
    """Appends and commits per second by ``producers`` concurrent appenders for ``seconds``."""
    async with open_journal(path, retention_records=100_000) as journal:
        if mode == "metrics":
            Metrics().watch(journal=journal)
        count = 0
        deadline = trio.current_time() + seconds

        async def produce(index: int) -> None:
            nonlocal count
            body = {"type": "event", "name": "bench", "payload": {"n": index}}
            while trio.current_time() < deadline:
                await journal.append(f"p{index}", "conversation", body)
                count += 1

        began = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for index in range(producers):
                nursery.start_soon(produce, index)
        elapsed = time.perf_counter() - began
        return count / elapsed, journal.commits / elapsed


async def _in_task(fn: Callable[[], Any]) -> Any:
    # A fresh task: the mode's context variables stay in it.
    result: list[Any] = []

    async def run() -> None:
        result.append(await fn())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run)
    return result[0]


async def run(quick: bool) -> dict[str, Any]:
    rounds, turns_per_round = (4, 10) if quick else (10, 20)
    append_rounds, append_seconds = (3, 1.0) if quick else (12, 1.5)
    producers = 32
    provider = TracerProvider()
    dropped = _Drop()
    provider.add_span_processor(BatchSpanProcessor(dropped))
    agent = _agent()
    turn_times: dict[str, list[float]] = {m: [] for m in TURN_MODES}
    budget = Budget(rounds, 120 if quick else 600)
    for mode in TURN_MODES:  # warm: espeak, and what each mode loads on first use
        await _in_task(functools.partial(_turns, agent, mode, 3, provider))
    # Each round runs every mode back to back; a mode's overhead is the median over rounds of
    # its round median against off's (pairs close in time, so the machine's drift cancels).
    turn_ratios: dict[str, list[float]] = {m: [] for m in TURN_MODES}
    for round_ in range(rounds):
        order = TURN_MODES if round_ % 2 == 0 else tuple(reversed(TURN_MODES))
        medians: dict[str, float] = {}
        for mode in order:
            times = await _in_task(functools.partial(_turns, agent, mode, turns_per_round, provider))
            turn_times[mode] += times
            medians[mode] = statistics.median(times)
        for mode in TURN_MODES:
            turn_ratios[mode].append(medians[mode] / medians["off"])
        say(f"turns: round {round_ + 1} of {rounds}")
        if budget.expired():
            break
    rates: dict[str, list[float]] = {m: [] for m in JOURNAL_MODES}
    append_ratios: list[float] = []
    commit_rates: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench-telemetry-") as scratch:
        for round_ in range(append_rounds):
            order = JOURNAL_MODES if round_ % 2 == 0 else tuple(reversed(JOURNAL_MODES))
            for mode in order:
                path = Path(scratch) / f"{mode}-{round_}.db"
                rate, commit_rate = await _appends(path, mode, producers, append_seconds)
                rates[mode].append(rate)
                commit_rates.append(commit_rate)
            append_ratios.append(rates["off"][-1] / rates["metrics"][-1])
            say(f"journal: round {round_ + 1} of {append_rounds}")
    provider.shutdown()
    turn = {
        mode: {
            "turns": len(times),
            "median_ms": statistics.median(times) * 1000,
            "p90_ms": sorted(times)[int(0.9 * (len(times) - 1))] * 1000,
            "overhead": statistics.median(turn_ratios[mode]) - 1,
            "round_spread": [min(turn_ratios[mode]) - 1, max(turn_ratios[mode]) - 1],
        }
        for mode, times in turn_times.items()
    }
    append = {
        mode: {
            "rounds": len(values),
            "appends_per_s": statistics.median(values),
            "overhead": statistics.median(append_ratios) - 1 if mode == "metrics" else 0.0,
            "round_spread": [min(append_ratios) - 1, max(append_ratios) - 1]
            if mode == "metrics"
            else [0.0, 0.0],
        }
        for mode, values in rates.items()
    }
    provider.force_flush()
    return {
        "turn": turn,
        "journal_append": append,
        "spans_per_turn": dropped.spans / (len(turn_times["metrics+tracing"]) + 3),
        "commits_per_s": statistics.median(commit_rates),
        "producers": producers,
        "goal": GOAL,
    }


def _hook_costs() -> dict[str, float]:
    """The instruments alone, in microseconds a call: what the figures above are made of."""
    metrics = Metrics()
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(_Drop()))
    count = 20_000

    def per_call(fn: Callable[[], None]) -> float:
        began = time.perf_counter()
        for _ in range(count):
            fn()
        return (time.perf_counter() - began) / count * 1e6

    llm = LLM(provider="local", model="local")

    def a_stage() -> None:
        with stage("llm", llm) as request:
            request.first()

    costs = {"journal_commit_hook": per_call(lambda: metrics.committed(8, 0.002))}
    costs["stage_off"] = per_call(a_stage)

    async def with_metrics() -> None:
        metrics.use()
        costs["stage_metrics"] = per_call(a_stage)
        configure_tracing(provider)
        costs["stage_metrics_tracing"] = per_call(a_stage)
        configure_tracing(None)

    trio.run(with_metrics)
    provider.shutdown()
    return costs


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.telemetry", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds (well under a minute)")
    args = parser.parse_args(argv)
    heap = freeze_heap_as_the_runner_does()
    results = trio.run(run, args.quick)
    results["hooks_us"] = _hook_costs()

    def spread(r: dict[str, Any]) -> str:
        low, high = r["round_spread"]
        return f"{low * 100:+.1f}% .. {high * 100:+.1f}%"

    rows = [
        [
            f"turn, {mode}",
            fmt(r["median_ms"], "ms"),
            fmt(r["p90_ms"], "ms"),
            f"{r['overhead'] * 100:+.1f}%",
            spread(r),
        ]
        for mode, r in results["turn"].items()
    ]
    rows += [
        [
            f"journal append, {mode}",
            fmt(r["appends_per_s"], "/s"),
            "-",
            f"{r['overhead'] * 100:+.1f}%",
            spread(r),
        ]
        for mode, r in results["journal_append"].items()
    ]
    print_table(["scenario", "median", "p90", "overhead vs off", "rounds from .. to"], rows)
    print()
    print_table(["instrument alone", "per call"], [[k, fmt(v, "us")] for k, v in results["hooks_us"].items()])
    # What the instruments alone bound the overhead to: their cost times how often they run.
    hooks = results["hooks_us"]
    off_ms = results["turn"]["off"]["median_ms"]
    results["bounds"] = {
        "turn_metrics": results["spans_per_turn"] * hooks["stage_metrics"] / 1000 / off_ms,
        "turn_metrics_tracing": results["spans_per_turn"] * hooks["stage_metrics_tracing"] / 1000 / off_ms,
        "journal_metrics": results["commits_per_s"] * hooks["journal_commit_hook"] / 1e6,
    }
    print()
    print(
        f"bounds from the instruments ({results['spans_per_turn']:.1f} spans a turn, "
        f"{results['commits_per_s']:.0f} commits/s):"
    )
    print_table(["", "share"], [[k, f"{v * 100:.2f}%"] for k, v in results["bounds"].items()])
    measured = [r for m, r in results["turn"].items() if m != "off"] + [results["journal_append"]["metrics"]]
    worst = max(r["overhead"] for r in measured)
    noisy = any(r["round_spread"][1] - r["round_spread"][0] > 2 * GOAL for r in measured)
    verdict = "met" if worst < GOAL else "NOT met"
    if noisy:
        verdict += " end to end, but rounds vary by more than the goal on this machine now; see the bounds"
    print(f"goal: overhead under {GOAL * 100:.0f}%: {verdict} (worst {worst * 100:+.1f}%)")
    write_results("telemetry", {"machine": machine_info(), "heap": heap, "quick": args.quick, **results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
