"""Spoken turns through a real LiveKit server: the old embedded voice against the new one.

    python -m bench.livekit_voice [--quick]        (root: it makes a network namespace)

The set-up of bench/livekit.py (a real ``livekit-server`` in a private network namespace, a
``runner serve`` process inside it, callers that are ``lk_peer.py`` processes publishing a
microphone), with the two agents of ``bench/_voice_agents.py``:

1. Latency: per turn, from the end of the caller's speech (its last loud sample leaving the
   caller's audio source) to the first loud 20 ms frame of the agent's reply at the caller,
   p50/p99, old agent and new agent in the same run. Both end a turn after 500 ms of quiet.
2. Concurrency (the new agent): N calls at once on one runner, each caller saying its
   sentence every few seconds, for N = 1, 2, 3, 4, 6, 8, ...; per N, the same latency's
   p50/p99 and the runner's resident memory per call (its RSS with the N calls in their
   turns, less its RSS warm and idle, over N). It stops at the first N whose p50 is more than
   twice the p50 at N = 1 (the curve is in the results), or at the run's bounds.

Every process here (server, runner, callers) shares this machine's cores: the callers' own
CPU counts against the runner's. Results go to ``bench/results/livekit_voice-<UTC>.json``.
"""

from __future__ import annotations

import argparse
import functools
import os
import random
import sys
import tempfile
import time
import uuid
from array import array
from pathlib import Path
from typing import Any

import attrs
import trio

from ._common import cpu_report, cpu_sample, machine_info, print_table, say, summarize, write_results

_LK_TESTS = Path(__file__).resolve().parents[1] / "tests" / "livekit"
if str(_LK_TESTS) not in sys.path:
    sys.path.insert(0, str(_LK_TESTS))

from lk_harness import LiveKitEnv, LiveKitServer, find_livekit_server  # noqa: E402 - after the sys.path entry that makes tests/livekit's modules importable
from lk_runner import AGENT_IDENTITY, open_runner  # noqa: E402 - after the sys.path entry that makes tests/livekit's modules importable

from runner.providers.espeak import EspeakTTS  # noqa: E402 - after the sys.path entry that makes tests/livekit's modules importable

AGENTS = Path(__file__).with_name("_voice_agents.py")
VOICE = "en-us+f2"
SENTENCE = "Thank you very much, my name is John."
LEAD_S = 0.5
TAIL_S = 1.5
SPEECH_LEVEL = 1_000


@attrs.frozen(kw_only=True)
class Profile:
    name: str
    latency_calls: int
    latency_turns: int
    levels: tuple[int, ...]
    turns_per_level: int
    seconds: float


QUICK = Profile(
    name="quick", latency_calls=2, latency_turns=3, levels=(1, 2, 4), turns_per_level=3, seconds=300
)
FULL = Profile(
    name="full",
    latency_calls=3,
    latency_turns=5,
    levels=(1, 2, 3, 4, 6, 8, 10),
    turns_per_level=4,
    seconds=1200,
)


async def sentence_file(directory: Path) -> tuple[Path, int, float]:
    tts = EspeakTTS(VOICE)
    pcm = b"".join([chunk async for chunk in tts.synthesize(SENTENCE)])
    rate = tts.sample_rate_hz
    data = bytes(2 * int(rate * LEAD_S)) + pcm + bytes(2 * int(rate * TAIL_S))
    samples = array("h", data)
    last = max(i for i, x in enumerate(samples) if abs(x) > SPEECH_LEVEL)
    path = directory / "sentence.pcm"
    path.write_bytes(data)
    return path, rate, (len(samples) - 1 - last) / rate


def _rss_mb(journal: Path) -> float | None:
    """The runner's resident memory: the process whose command line names its journal."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            if b"runner" not in cmdline or os.fsencode(journal) not in cmdline or cmdline[0].endswith(b"ip"):
                continue
            for line in Path(f"/proc/{entry}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        except OSError:
            continue
    return None


async def _call(
    env: LiveKitEnv,
    host: Any,
    sentence: tuple[Path, int, float],
    turns: int,
    latencies: list[float],
    *,
    in_turns: trio.Event | None = None,
    pace_s: float = 0.0,
    failures: list[str] | None = None,
) -> None:
    """One call of ``turns`` spoken turns; a call that fails is counted in ``failures`` (if given)."""
    try:
        await _call_once(env, host, sentence, turns, latencies, in_turns=in_turns, pace_s=pace_s)
    except Exception as exc:  # an overloaded call is a figure, not the end of the run
        if failures is None:
            raise
        failures.append(f"{type(exc).__name__}: {str(exc)[:200]}")
    finally:
        if in_turns is not None:
            in_turns.set()


async def _call_once(
    env: LiveKitEnv,
    host: Any,
    sentence: tuple[Path, int, float],
    turns: int,
    latencies: list[float],
    *,
    in_turns: trio.Event | None,
    pace_s: float,
) -> None:
    path, rate, after_speech_s = sentence
    room = env.unique_room("voice")
    session_id = f"voice-{uuid.uuid4().hex[:8]}"
    async with env.peer("caller", room) as caller:
        await caller.request("publish_mic", rate=rate)
        answer = await host.start_call(session_id, room)
        if answer.status != 202:
            raise RuntimeError(f"POST /v1/sessions answered {answer.status}: {answer.body}")
        await caller.request("record", identity=AGENT_IDENTITY)
        await caller.request("wait_speech", within=30, timeout=35)  # the greeting
        await caller.request("wait_quiet", quiet_ms=600, within=30, timeout=35)
        if pace_s:
            await trio.sleep(random.uniform(0, pace_s))  # calls do not talk in lockstep
        for turn in range(turns):
            said = await caller.request("play", path=str(path), rate=rate, timeout=60)
            speech_end = said["ended_at"] - after_speech_s
            reply = await caller.request("wait_speech", after=speech_end, within=30, timeout=35)
            latencies.append(reply["first_loud_at"] - speech_end)
            if turn == 0 and in_turns is not None:
                in_turns.set()
            await caller.request(
                "wait_quiet", after=reply["first_loud_at"], quiet_ms=600, within=30, timeout=35
            )
        await host.stop_call(session_id)


async def latency(env: LiveKitEnv, workdir: Path, agent: str, profile: Profile, sentence: Any) -> list[float]:
    out: list[float] = []
    journal = workdir / f"{agent}.db"
    async with open_runner(env, journal, agent=f"{AGENTS}:{agent}") as host:
        for n in range(profile.latency_calls):
            say(f"{agent}: call {n + 1}/{profile.latency_calls}")
            failures: list[str] = []
            await _call(env, host, sentence, profile.latency_turns, out, failures=failures)
            if failures:
                say(f"{agent}: the call failed: {failures[0]}")
    return out


async def _sample_memory(journal: Path, started: list[trio.Event], into: list[float]) -> None:
    """The runner's RSS once every call has had its first turn answered."""
    for event in started:
        await event.wait()
    rss = _rss_mb(journal)
    if rss is not None:
        into.append(rss)


async def concurrency(
    env: LiveKitEnv, workdir: Path, profile: Profile, sentence: Any, levels: list[dict[str, Any]]
) -> None:
    """Adds each level to ``levels`` as it is measured (a run cut short keeps those done)."""
    journal = workdir / "concurrency.db"
    async with open_runner(
        env, journal, "--max-sessions", str(max(profile.levels)), agent=f"{AGENTS}:new"
    ) as host:
        idle_mb = _rss_mb(journal)
        base_p50: float | None = None
        for n in profile.levels:
            say(f"concurrency: {n} calls at once")
            out: list[float] = []
            failures: list[str] = []
            started = [trio.Event() for _ in range(n)]
            rss_during: list[float] = []

            began = time.perf_counter()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_sample_memory, journal, started, rss_during)
                for i in range(n):
                    nursery.start_soon(
                        functools.partial(
                            _call,
                            env,
                            host,
                            sentence,
                            profile.turns_per_level,
                            out,
                            in_turns=started[i],
                            pace_s=3.0,
                            failures=failures,
                        )
                    )
            stats = summarize(out, scale=1000)
            level = {
                "calls": n,
                "end_of_speech_to_first_audio_ms": stats,
                "runner_rss_mb": rss_during[0] if rss_during else None,
                "runner_rss_idle_mb": idle_mb,
                "memory_per_call_mb": (rss_during[0] - idle_mb) / n if rss_during and idle_mb else None,
                "seconds": time.perf_counter() - began,
                "failed_calls": failures,
            }
            levels.append(level)
            if failures:
                say(f"  {len(failures)} of {n} calls failed: saturated")
                break
            say(f"  p50 {stats.get('p50', 0):.0f} ms, p99 {stats.get('p99', 0):.0f} ms")
            if "p50" not in stats:
                break
            if base_p50 is None:
                base_p50 = float(stats["p50"])
            elif float(stats["p50"]) > 2 * base_p50:
                level["doubled"] = True
                break


async def run(profile: Profile) -> dict[str, Any]:
    binary = find_livekit_server()
    if binary is None:
        raise SystemExit("livekit-server not found: run .ci/install-livekit-server")
    if os.geteuid() != 0:
        raise SystemExit("this benchmark makes a network namespace and must run as root")
    began = time.perf_counter()
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-voice-") as tmp:
        workdir = Path(tmp)
        server = LiveKitServer(binary, workdir / "server")
        await trio.to_thread.run_sync(server.start)
        env = LiveKitEnv(server, workdir)
        cpu_start = cpu_sample()
        try:
            sentence = await sentence_file(workdir)
            with trio.move_on_after(profile.seconds):
                for agent in ("old", "new"):
                    result[agent] = await latency(env, workdir, agent, profile, sentence)
                result["concurrency"] = []
                await concurrency(env, workdir, profile, sentence, result["concurrency"])
        finally:
            cpu_end = cpu_sample()
            await env.aclose()
            await trio.to_thread.run_sync(server.stop)
    return {
        "benchmark": "livekit_voice",
        "profile": profile.name,
        "command": "python -m bench.livekit_voice" + (" --quick" if profile is QUICK else ""),
        "seconds": time.perf_counter() - began,
        "machine": machine_info(),
        "parameters": attrs.asdict(profile)
        | {"sentence": SENTENCE, "caller_voice": VOICE, "end_of_turn_ms": 500},
        "latency_ms": {agent: summarize(result.get(agent, []), scale=1000) for agent in ("old", "new")},
        "samples_ms": {
            agent: [round(v * 1000, 1) for v in result.get(agent, [])] for agent in ("old", "new")
        },
        "concurrency": result.get("concurrency", []),
        "cpu": cpu_report(cpu_start, cpu_end),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls and levels, at most 5 minutes")
    args = parser.parse_args()
    profile = QUICK if args.quick else FULL
    result = trio.run(run, profile)
    path = write_results("livekit_voice", result)
    old, new = result["latency_ms"]["old"], result["latency_ms"]["new"]
    rows = [
        [name, s.get("n", 0), f"{s.get('p50', 0):.0f}", f"{s.get('p99', 0):.0f}"]
        for name, s in (
            ("old (energy VAD, pocketsphinx, espeak)", old),
            ("new (Silero, Whisper, hibari)", new),
        )
    ]
    if old.get("p50") and new.get("p50"):
        rows.append(["new / old", "", f"{new['p50'] / old['p50']:.2f}", f"{new['p99'] / old['p99']:.2f}"])
    print_table(["end of speech -> first audio", "n", "p50 ms", "p99 ms"], rows)
    print_table(
        ["calls at once", "turns", "p50 ms", "p99 ms", "runner RSS MB", "MB per call"],
        [
            [
                level["calls"],
                level["end_of_speech_to_first_audio_ms"].get("n", 0),
                f"{level['end_of_speech_to_first_audio_ms'].get('p50', 0):.0f}",
                f"{level['end_of_speech_to_first_audio_ms'].get('p99', 0):.0f}",
                f"{level['runner_rss_mb']:.0f}" if level["runner_rss_mb"] else "-",
                f"{level['memory_per_call_mb']:.1f}" if level["memory_per_call_mb"] else "-",
            ]
            for level in result["concurrency"]
        ],
    )
    say(f"results: {path}")


if __name__ == "__main__":
    main()
