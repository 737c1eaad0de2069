"""Turns benchmark: what the turn engine adds to a turn beyond its providers' own time.

    python -m bench.turns [--quick]

Each turn runs through :class:`runner.voice.engine.Turn` with the offline providers: the
deterministic local model (``LocalLLM``, no delay) and espeak-ng (``EspeakTTS``). Both are
wrapped in timing objects that delegate every call to the real provider and record when
the provider was busy:

* the model: each step of its stream, as the coroutine runs (a checkpoint inside it hands
  the thread to other tasks, and that time is not the model's);
* the voice: each piece of its stream, wall clock (espeak renders in a worker thread).

1. Engine overhead per turn: the turn's total time minus the time some provider was busy
   (the union of the busy intervals, since speech overlaps generation), p50 and p99.
2. First sentence to first audio: from the ``ReplyChunk`` of chunk 0 (the first sentence is
   complete) to the first ``AudioData`` of chunk 0, p50 and p99. This includes espeak's
   rendering of that sentence.
3. Baseline: the same providers called directly in a plain loop (stream the model, run the
   tool, stream again, render each sentence as soon as it ends), with the same figures;
   the ratios engine / baseline are printed.

Two kinds of turn: ``answer`` (one model call, one sentence) and ``tool`` (a tool call, a
second model call, a three-sentence answer).

Results go to ``bench/results/turns-<UTC>.json`` and ``turns-latest.json``.
"""

from __future__ import annotations

import argparse
import gc
import re
import sys
import time
import types
from collections.abc import AsyncGenerator, AsyncIterator, Generator, Sequence
from typing import Any

import attrs
import trio

from runner.providers import ChatMessage, LocalLLM, TextDelta, ToolCall, ToolSpec
from runner.providers.espeak import EspeakTTS
from runner.voice.engine import ToolOutcome, Turn, TurnPlan
from runner.voice.events import AudioData, ReplyChunk, TurnEvent

from ._common import (
    Budget,
    fmt,
    freeze_heap_as_the_runner_does,
    machine_info,
    print_table,
    ratio,
    say,
    summarize,
    write_results,
)

INSTRUCTIONS = (
    "You are the concierge of Hotel Lumen. "
    "Breakfast is served from seven to eleven in the garden room. "
    "Checkout is at noon, and late checkout costs twenty euros."
)
WEATHER = ToolSpec(
    name="weather",
    description="Tell the weather forecast for a city.",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
FORECAST = (
    "In {city} it is sunny and 24 degrees. The wind is light from the west. Tomorrow brings rain after noon."
)
SCENARIOS = {
    "answer": "When is breakfast served?",
    "tool": "What is the weather in Lisbon?",
}
_SENTENCE_END = re.compile(r"[.!?]\s")


@attrs.frozen(kw_only=True)
class Profile:
    name: str
    turns: int
    warmup: int
    seconds: float


FULL = Profile(name="full", turns=300, warmup=10, seconds=180.0)
QUICK = Profile(name="quick", turns=40, warmup=3, seconds=30.0)


# -- timing wrappers around the providers (stand-ins for remote services) ---------------------


class Busy:
    """The intervals (``perf_counter`` seconds) in which some provider was working."""

    def __init__(self) -> None:
        self.intervals: list[tuple[float, float]] = []

    def add(self, start: float, end: float) -> None:
        self.intervals.append((start, end))

    def union_seconds(self, start: float, end: float) -> float:
        """Total length of the union of the intervals, clipped to ``[start, end]``."""
        total = 0.0
        cursor = start
        for a, b in sorted(self.intervals):
            a, b = max(a, cursor), min(b, end)
            if b > a:
                total += b - a
                cursor = b
        return total

    def sum_seconds(self) -> float:
        return sum(b - a for a, b in self.intervals)


@types.coroutine
def _stepped(awaitable: Any, busy: Busy) -> Generator[Any, Any, Any]:
    """Await ``awaitable``, recording only the time its own code runs (not its waits)."""
    send: Any = None
    error: BaseException | None = None
    while True:
        began = time.perf_counter()
        try:
            trap = awaitable.throw(error) if error is not None else awaitable.send(send)
        except StopIteration as done:
            busy.add(began, time.perf_counter())
            return done.value
        except BaseException:
            busy.add(began, time.perf_counter())
            raise
        busy.add(began, time.perf_counter())
        try:
            send, error = (yield trap), None
        except BaseException as exc:  # noqa: BLE001 - a cancel too, delivered into the provider
            send, error = None, exc


class TimedLLM:
    """Delegates to a real model; records the time its stream's own code runs."""

    def __init__(self, inner: LocalLLM, busy: Busy) -> None:
        self.inner = inner
        self.busy = busy
        self.provider = inner.provider
        self.model = inner.model

    async def stream(
        self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec] = ()
    ) -> AsyncGenerator[Any, None]:
        events = self.inner.stream(messages, tools)
        try:
            for _ in range(100_000):
                try:
                    event = await _stepped(events.__anext__(), self.busy)
                except StopAsyncIteration:
                    return
                yield event
        finally:
            await events.aclose()


class TimedTTS:
    """Delegates to a real voice; records, wall clock, each piece of audio it renders."""

    def __init__(self, inner: EspeakTTS, busy: Busy) -> None:
        self.inner = inner
        self.busy = busy
        self.provider = inner.provider
        self.voice = inner.voice
        self.sample_rate_hz = inner.sample_rate_hz

    async def synthesize(self, text: str) -> AsyncIterator[bytes]:
        audio = self.inner.synthesize(text)
        try:
            for _ in range(100_000):
                began = time.perf_counter()
                try:
                    pcm = await audio.__anext__()
                except StopAsyncIteration:
                    self.busy.add(began, time.perf_counter())
                    return
                self.busy.add(began, time.perf_counter())
                yield pcm
        finally:
            await audio.aclose()


async def _run_tool(call: ToolCall) -> ToolOutcome:
    return ToolOutcome(ok=True, result=FORECAST.format(city=call.arguments.get("city", "there")))


# -- one turn, through the engine and through a plain loop -------------------------------------


@attrs.frozen(kw_only=True)
class Sample:
    total_s: float
    provider_s: float  # union of busy intervals
    provider_sum_s: float  # plain sum (counts overlap twice)
    first_sentence_to_audio_s: float
    text: str


async def engine_turn(user: str) -> Sample:
    busy = Busy()
    plan = TurnPlan(
        llm=TimedLLM(LocalLLM(), busy),
        tts=TimedTTS(EspeakTTS("en-us"), busy),
        instructions=lambda: INSTRUCTIONS,
        tools=lambda: [WEATHER],
        run_tool=_run_tool,
        max_tool_rounds=2,
    )
    marks: dict[str, float] = {}

    async def emit(event: TurnEvent) -> None:
        if isinstance(event, ReplyChunk) and event.chunk == 0:
            marks.setdefault("sentence", time.perf_counter())
        elif isinstance(event, AudioData) and event.chunk == 0:
            marks.setdefault("audio", time.perf_counter())

    turn = Turn(plan, [], emit)
    began = time.perf_counter()
    result = await turn.run(user)
    ended = time.perf_counter()
    if result.interrupted or "sentence" not in marks or "audio" not in marks:
        raise RuntimeError(f"the engine's turn did not complete: {result}")
    return Sample(
        total_s=ended - began,
        provider_s=busy.union_seconds(began, ended),
        provider_sum_s=busy.sum_seconds(),
        first_sentence_to_audio_s=marks["audio"] - marks["sentence"],
        text=result.text,
    )


async def baseline_turn(user: str) -> Sample:
    busy = Busy()
    llm = TimedLLM(LocalLLM(), busy)
    tts = TimedTTS(EspeakTTS("en-us"), busy)
    marks: dict[str, float] = {}
    began = time.perf_counter()
    messages = [ChatMessage(role="system", content=INSTRUCTIONS), ChatMessage(role="user", content=user)]
    spoken_text = ""
    buffer = ""

    async def say_sentence(sentence: str) -> None:
        first = not marks
        if first:
            marks["sentence"] = time.perf_counter()
        async for pcm in tts.synthesize(sentence):
            if first and "audio" not in marks and pcm:
                marks["audio"] = time.perf_counter()

    for round_ in range(3):
        calls: list[ToolCall] = []
        async for event in llm.stream(messages, [WEATHER] if round_ < 2 else []):
            if isinstance(event, TextDelta):
                spoken_text += event.text
                buffer += event.text
                while (end := _SENTENCE_END.search(buffer)) is not None:
                    sentence, buffer = buffer[: end.end()].strip(), buffer[end.end() :]
                    await say_sentence(sentence)
            elif isinstance(event, ToolCall):
                calls.append(event)
        if not calls:
            break
        messages.append(ChatMessage(role="assistant", tool_calls=tuple(calls)))
        for call in calls:
            outcome = await _run_tool(call)
            messages.append(ChatMessage(role="tool", content=str(outcome.result), tool_call_id=call.id))
    if buffer.strip():
        await say_sentence(buffer.strip())
    ended = time.perf_counter()
    return Sample(
        total_s=ended - began,
        provider_s=busy.union_seconds(began, ended),
        provider_sum_s=busy.sum_seconds(),
        first_sentence_to_audio_s=marks["audio"] - marks["sentence"],
        text=spoken_text,
    )


# -- the run ----------------------------------------------------------------------------------


def _figures(samples: Sequence[Sample]) -> dict[str, Any]:
    return {
        "total_ms": summarize([s.total_s for s in samples], scale=1000),
        "provider_ms": summarize([s.provider_s for s in samples], scale=1000),
        "provider_sum_ms": summarize([s.provider_sum_s for s in samples], scale=1000),
        "overhead_ms": summarize([s.total_s - s.provider_s for s in samples], scale=1000),
        "first_sentence_to_audio_ms": summarize([s.first_sentence_to_audio_s for s in samples], scale=1000),
    }


async def _measure(profile: Profile) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, user in SCENARIOS.items():
        for _ in range(profile.warmup):
            await engine_turn(user)
            await baseline_turn(user)
        engine: list[Sample] = []
        baseline: list[Sample] = []
        budget = Budget(profile.turns, profile.seconds / len(SCENARIOS))
        gc.collect()
        for i in range(budget.count):
            if budget.expired():
                say(f"{name}: time is up after {i} turns")
                break
            # Interleave, so drift (CPU frequency, caches) hits both alike.
            engine.append(await engine_turn(user))
            baseline.append(await baseline_turn(user))
        if engine[0].text.strip() != baseline[0].text.strip():
            raise RuntimeError(
                f"{name}: engine and baseline said different things: {engine[0].text!r} / {baseline[0].text!r}"
            )
        e, b = _figures(engine), _figures(baseline)
        out[name] = {
            "user": user,
            "reply": engine[0].text,
            "turns": len(engine),
            "engine": e,
            "baseline": b,
            "ratio_p50": {
                key: ratio(e[key]["p50"], b[key]["p50"])
                for key in ("total_ms", "overhead_ms", "first_sentence_to_audio_ms")
            },
        }
    return out


def _table(got: dict[str, Any]) -> list[list[str]]:
    rows = []
    for name, data in got.items():
        e, b, r = data["engine"], data["baseline"], data["ratio_p50"]
        for key, label in (
            ("overhead_ms", "overhead (total - providers)"),
            ("first_sentence_to_audio_ms", "first sentence -> first audio"),
            ("total_ms", "turn total"),
            ("provider_ms", "providers busy"),
        ):
            rows.append(
                [
                    f"{name}: {label}",
                    fmt(e[key]["p50"], "ms"),
                    fmt(e[key]["p99"], "ms"),
                    fmt(b[key]["p50"], "ms"),
                    fmt(b[key]["p99"], "ms"),
                    fmt(r.get(key)) + "x" if r.get(key) is not None else "-",
                ]
            )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.turns", description=(__doc__ or "").splitlines()[0]
    )
    parser.add_argument("--quick", action="store_true", help="the short profile (seconds)")
    args = parser.parse_args(argv)
    freeze_heap_as_the_runner_does()
    profile = QUICK if args.quick else FULL
    command = "python -m bench.turns" + (" --quick" if args.quick else "")
    machine = machine_info()
    say(f"{command}: {machine['cores']} cores, Python {machine['python']}")
    began = time.perf_counter()
    got = trio.run(_measure, profile)
    elapsed = time.perf_counter() - began
    rows = _table(got)
    headers = ("figure", "engine p50", "engine p99", "baseline p50", "baseline p99", "ratio p50")
    results = {
        "benchmark": "turns",
        "profile": profile.name,
        "command": command,
        "finished_at_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "seconds": elapsed,
        "machine": machine,
        "parameters": attrs.asdict(profile),
        "notes": (
            "in process; LocalLLM (no delay) and EspeakTTS('en-us') behind timing wrappers; "
            "overhead = turn total - union of provider busy intervals; the model's busy time counts "
            "only its own steps, the voice's is wall clock (espeak renders in a worker thread)"
        ),
        "scenarios": got,
        "table": [dict(zip(headers, row, strict=True)) for row in rows],
    }
    path = write_results("turns", results)
    print()
    print(
        f"{command} ({profile.name}, {elapsed:.0f} s; {machine['cores']} cores, Python {machine['python']})"
    )
    print_table(headers, rows)
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
