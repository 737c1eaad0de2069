"""LiveKit benchmark: how fast a placed call reaches its room, and how fast the agent answers.

    python -m bench.livekit [--quick]        (root: it makes a network namespace)

It runs what the LiveKit tests run: a real ``livekit-server`` in a private network namespace
(tests/livekit/lk_harness.py), a ``runner serve`` process inside it with the offline test agent
(espeak-ng, pocketsphinx, the local model), and a caller participant (tests/livekit/lk_peer.py)
that publishes a microphone and records the agent's track. The host is this process, over
HTTP, as in the tests.

1. Join: for each call, the time from sending ``POST /v1/sessions`` to its 202 (the runner
   answers once the agent joined the room and published its voice), and to the moment the
   caller's SDK reports the agent as a participant of the room.
2. Answer: per turn, the caller says a sentence (espeak-ng, published as a microphone track);
   the figure is the time from the end of its speech (its last loud sample leaving the
   caller's audio source) to the first loud 20 ms frame of the agent's reply arriving at the
   caller. It includes the agent's end-of-turn silence (500 ms of quiet), recognition,
   the model, synthesis and the media path both ways.

Both are reported as p50/p99 over the calls and turns made within the run's bounds (counts
and a wall-clock budget). Results go to ``bench/results/livekit-<UTC>.json`` and
``livekit-latest.json``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import uuid
from array import array
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import trio

from ._common import (
    Budget,
    cpu_report,
    cpu_sample,
    fmt,
    machine_info,
    print_table,
    say,
    summarize,
    write_results,
)

_LK_TESTS = Path(__file__).resolve().parents[1] / "tests" / "livekit"
if str(_LK_TESTS) not in sys.path:
    sys.path.insert(0, str(_LK_TESTS))

from lk_harness import LiveKitEnv, LiveKitServer, find_livekit_server  # noqa: E402 - after the sys.path entry that makes tests/livekit's modules importable
from lk_runner import AGENT_IDENTITY, open_runner  # noqa: E402 - after the sys.path entry that makes tests/livekit's modules importable

from runner.providers.espeak import EspeakTTS  # noqa: E402 - after the sys.path entry that makes tests/livekit's modules importable

VOICE = "en-us+f2"
SENTENCE = "Thank you very much, my name is John."
LEAD_S = 1.0
TAIL_S = 1.5
SPEECH_LEVEL = 1_000  # |sample| above this is speech, for finding where the sentence ends


@attrs.frozen(kw_only=True)
class Profile:
    name: str
    calls: int
    turns_per_call: int
    seconds: float


QUICK = Profile(name="quick", calls=3, turns_per_call=2, seconds=90.0)
FULL = Profile(name="full", calls=10, turns_per_call=3, seconds=300.0)


#: The caller's sentence as a file: its path, its rate, and the seconds of quiet after its speech.
Sentence = tuple[Path, int, float]


async def sentence_file(directory: Path, *, lead_s: float = LEAD_S, tts: Any = None) -> Sentence:
    """The caller's sentence as PCM with silence around it; and where its speech ends, in s from the end.

    ``tts`` speaks it (espeak's ``VOICE`` by default)."""
    tts = tts or EspeakTTS(VOICE)
    pcm = b"".join([chunk async for chunk in tts.synthesize(SENTENCE)])
    rate = tts.sample_rate_hz
    data = bytes(2 * int(rate * lead_s)) + pcm + bytes(2 * int(rate * TAIL_S))
    samples = array("h", data)
    last = max(i for i, x in enumerate(samples) if abs(x) > SPEECH_LEVEL)
    path = directory / "sentence.pcm"
    path.write_bytes(data)
    return path, rate, (len(samples) - 1 - last) / rate


async def say_and_hear(caller: Any, sentence: Sentence, *, within: float = 20) -> tuple[float, float]:
    """The caller says ``sentence``; when its speech ended and when the agent's reply was first
    heard (``time.monotonic()``, which every process here reads from the same clock)."""
    path, rate, after_speech_s = sentence
    said = await caller.request("play", path=str(path), rate=rate, timeout=60)
    speech_end = float(said["ended_at"]) - after_speech_s
    reply = await caller.request("wait_speech", after=speech_end, within=within, timeout=within + 5)
    return speech_end, float(reply["first_loud_at"])


@asynccontextmanager
async def livekit_env(prefix: str, *, webhooks: bool = False) -> AsyncIterator[tuple[Path, LiveKitEnv]]:
    """A scratch folder and a livekit-server of its own in a private network namespace.

    ``webhooks``: the server posts its webhooks to lk_harness.WEBHOOK_URLS, in the namespace.
    Exits with one line when the server's binary is missing or this is not root.
    """
    binary = find_livekit_server()
    if binary is None:
        raise SystemExit(
            "livekit-server not found: run .ci/install-livekit-server (see docs/livekit-testing.md)"
        )
    if os.geteuid() != 0:
        raise SystemExit("this benchmark makes a network namespace and must run as root")
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        workdir = Path(tmp)
        server = LiveKitServer(binary, workdir / "server", webhooks=webhooks)
        await trio.to_thread.run_sync(server.start)
        env = LiveKitEnv(server, workdir)
        try:
            yield workdir, env
        finally:
            await env.aclose()
            await trio.to_thread.run_sync(server.stop)


async def one_call(
    env: LiveKitEnv,
    host: Any,
    index: int,
    profile: Profile,
    sentence: Sentence,
    out: dict[str, list[float]],
) -> None:
    _, rate, _ = sentence
    room = env.unique_room("bench")
    session_id = f"bench-{index}-{uuid.uuid4().hex[:6]}"
    async with env.peer("caller", room) as caller:
        await caller.request("publish_mic", rate=rate)
        sent_at = time.monotonic()
        answer = await host.start_call(session_id, room)
        answered_at = time.monotonic()
        if answer.status != 202:
            raise RuntimeError(f"POST /v1/sessions answered {answer.status}: {answer.body}")
        seen = await caller.expect("participant_connected", identity=AGENT_IDENTITY, timeout=15)
        out["post_to_202_s"].append(answered_at - sent_at)
        out["post_to_agent_seen_s"].append(seen["at"] - sent_at)
        await caller.request("record", identity=AGENT_IDENTITY)
        await caller.request("wait_speech", within=15, timeout=20)  # the greeting
        for _ in range(profile.turns_per_call):
            speech_end, heard_at = await say_and_hear(caller, sentence)
            out["end_of_speech_to_first_audio_s"].append(heard_at - speech_end)
        stopped = await host.stop_call(session_id)
        if stopped.status != 200:
            raise RuntimeError(f"DELETE answered {stopped.status}: {stopped.body}")


async def run(profile: Profile) -> dict[str, Any]:
    out: dict[str, list[float]] = {
        "post_to_202_s": [],
        "post_to_agent_seen_s": [],
        "end_of_speech_to_first_audio_s": [],
    }
    async with livekit_env("bench-livekit-") as (workdir, env):
        budget = Budget(profile.calls, profile.seconds)
        cpu_start = cpu_sample()
        calls = 0
        try:
            sentence = await sentence_file(workdir)
            async with open_runner(env, workdir / "journal.db") as host:
                with trio.move_on_after(profile.seconds):
                    while calls < profile.calls and not budget.expired():
                        say(f"call {calls + 1}/{profile.calls}")
                        await one_call(env, host, calls, profile, sentence, out)
                        calls += 1
        finally:
            cpu_end = cpu_sample()
    return {
        "benchmark": "livekit",
        "profile": profile.name,
        "command": "python -m bench.livekit" + (" --quick" if profile is QUICK else ""),
        "seconds": time.perf_counter() - budget.started,
        "machine": {**machine_info(), "livekit": _versions()},
        "parameters": attrs.asdict(profile) | {"sentence": SENTENCE, "voice": VOICE},
        "calls": calls,
        "join": {
            "post_to_202_ms": summarize(out["post_to_202_s"], scale=1000),
            "post_to_agent_seen_by_caller_ms": summarize(out["post_to_agent_seen_s"], scale=1000),
        },
        "answer": {
            "end_of_speech_to_first_audio_ms": summarize(out["end_of_speech_to_first_audio_s"], scale=1000)
        },
        "samples_ms": {k: [round(v * 1000, 1) for v in values] for k, values in out.items()},
        "cpu": cpu_report(cpu_start, cpu_end),
    }


def _versions() -> dict[str, str | None]:
    from importlib import metadata

    def version(name: str) -> str | None:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    return {
        "livekit": version("livekit"),
        "livekit-api": version("livekit-api"),
        "server": "v1.13.5 (dev mode)",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 calls of 2 turns, at most 90 s")
    args = parser.parse_args()
    profile = QUICK if args.quick else FULL
    result = trio.run(run, profile)
    path = write_results("livekit", result)
    rows = [
        ["POST /v1/sessions -> 202", *_cells(result["join"]["post_to_202_ms"])],
        ["POST -> agent seen by caller", *_cells(result["join"]["post_to_agent_seen_by_caller_ms"])],
        ["end of speech -> first audio", *_cells(result["answer"]["end_of_speech_to_first_audio_ms"])],
    ]
    print_table(["", "n", "p50 ms", "p99 ms", "max ms"], rows)
    say(f"results: {path}")


def _cells(summary: dict[str, float | int]) -> list[str]:
    return [
        str(summary.get("n", 0)),
        fmt(summary.get("p50")),
        fmt(summary.get("p99")),
        fmt(summary.get("max")),
    ]


if __name__ == "__main__":
    main()
