"""Spoken turns through a real LiveKit server: the old embedded voice against the new one.

    python -m bench.livekit_voice [--quick]        (root: it makes a network namespace)

The set-up of bench/livekit.py (a real ``livekit-server`` in a private network namespace, a
``runner serve`` process inside it, callers that are ``lk_peer.py`` processes publishing a
microphone), with the two agents of ``bench/_voice_agents.py``:

1. Latency: per turn, from the end of the caller's speech (its last loud sample leaving the
   caller's audio source) to the first loud 20 ms frame of the agent's reply at the caller,
   p50/p99, the agents in the same run. ``new_silence`` ends a turn after 500 ms of
   quiet, ``new`` when Smart Turn judges it over (issue 30, bench/turn_taking.py).
   Each turn is split into stages: the runner logs its moments (``runner.voice.timeline``,
   at debug: the pause found, the decode done, the model's first text, the turn's end, the
   first synthesized audio, the first audio handed to LiveKit) on the same monotonic clock
   as the caller's, and the bench prints each stage's p50 from the end of speech.
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
import re
import sys
import time
import uuid
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import attrs
import trio

from ._common import cpu_report, cpu_sample, machine_info, print_table, say, summarize, write_results
from .livekit import SENTENCE, VOICE, Sentence, livekit_env, say_and_hear, sentence_file

_LK_TESTS = Path(__file__).resolve().parents[1] / "tests" / "livekit"
if str(_LK_TESTS) not in sys.path:
    sys.path.insert(0, str(_LK_TESTS))

from lk_harness import LiveKitEnv  # noqa: E402 - after the sys.path entry that makes tests/livekit's modules importable
from lk_runner import AGENT_IDENTITY, open_runner  # noqa: E402 - after the sys.path entry that makes tests/livekit's modules importable

AGENTS = Path(__file__).with_name("_voice_agents.py")
LEAD_S = 0.5
# The runner's moments of a spoken turn, in the order they happen on the new path.
MOMENTS = (
    "paused",
    "decoding",
    "decoded",
    "model_asked_early",
    "model_first_text_early",
    "tts_first_audio_early",
    "turn_ended",
    "turn_started",
    "early_reply_taken",
    "model_first_text",
    "early_audio_taken",
    "tts_first_audio",
    "published_first_audio",
)
_MARK = re.compile(r"runner\.voice\.timeline \[(?P<session>[^\]]+)\]: (?P<moment>\w+) (?P<at>[\d.]+)$")


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


def _runner_pid(journal: Path) -> str | None:
    """The runner's process: the one whose command line names its journal."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"runner" in cmdline and os.fsencode(journal) in cmdline and not cmdline[0].endswith(b"ip"):
            return entry
    return None


def _rss_mb(journal: Path) -> float | None:
    """The runner's resident memory."""
    pid = _runner_pid(journal)
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines() if pid else ():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def _cpu_s(journal: Path) -> float | None:
    """The CPU time the runner has used (user and system, all its threads), in seconds."""
    pid = _runner_pid(journal)
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split() if pid else None
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK") if fields else None


def stages(
    stderr: list[str], session_id: str, began: float, speech_end: float, heard_at: float
) -> dict[str, float]:
    """One turn's moments from the runner's log, in ms after the end of the caller's speech.

    Each is the moment's last mark of the call between the caller starting to speak and the
    reply reaching it (a pause in mid-sentence is followed by the one that counts); ``received``
    is the reply's first loud frame at the caller.
    """
    out: dict[str, float] = {}
    for line in stderr:
        found = _MARK.search(line)
        if found is None or found["session"] != session_id:
            continue
        at = float(found["at"])
        if began <= at <= heard_at:
            out[found["moment"]] = (at - speech_end) * 1000
    out["received"] = (heard_at - speech_end) * 1000
    return out


@attrs.define
class Turns:
    """What the turns of one agent (or one concurrency level) measured."""

    latencies: list[float] = attrs.Factory(list)
    stages: list[dict[str, float]] = attrs.Factory(list)


async def _call(
    env: LiveKitEnv,
    host: Any,
    sentence: Sentence,
    turns: int,
    into: Turns,
    *,
    in_turns: trio.Event | None = None,
    pace_s: float = 0.0,
    failures: list[str] | None = None,
) -> None:
    """One call of ``turns`` spoken turns; a call that fails is counted in ``failures`` (if given)."""
    try:
        await _call_once(env, host, sentence, turns, into, in_turns=in_turns, pace_s=pace_s)
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
    sentence: Sentence,
    turns: int,
    into: Turns,
    *,
    in_turns: trio.Event | None,
    pace_s: float,
) -> None:
    _, rate, _ = sentence
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
            began = time.monotonic()
            speech_end, heard_at = await say_and_hear(caller, sentence, within=30)
            into.latencies.append(heard_at - speech_end)
            into.stages.append(stages(host.runner.stderr, session_id, began, speech_end, heard_at))
            if turn == 0 and in_turns is not None:
                in_turns.set()
            await caller.request("wait_quiet", after=heard_at, quiet_ms=600, within=30, timeout=35)
        await host.stop_call(session_id)


# The runner logs at debug, so its timeline marks reach its stderr; runners side by side each
# take a free port for their public listener.
_RUNNER_ARGS = ("--log-level", "debug", "--public-address", "127.0.0.1:0")


async def latency(
    env: LiveKitEnv,
    workdir: Path,
    agents: tuple[str, ...],
    profile: Profile,
    sentence: Sentence,
    before: Path | None = None,
) -> dict[str, Turns]:
    """``profile.latency_calls`` calls per agent, each agent on a runner of its own; the agents
    take turns call by call, so a change of the machine's load meets each alike."""
    out = {agent: Turns() for agent in agents}
    async with AsyncExitStack() as stack:
        hosts = {
            agent: await stack.enter_async_context(
                open_runner(
                    env,
                    workdir / f"{agent}.db",
                    *_RUNNER_ARGS,
                    agent=f"{AGENTS}:{agent.removesuffix(BEFORE)}",
                    **({"source": before} if agent.endswith(BEFORE) and before else {}),
                )
            )
            for agent in agents
        }
        with trio.move_on_after(profile.seconds / 2):
            for n in range(profile.latency_calls):
                for agent, host in hosts.items():
                    say(f"{agent}: call {n + 1}/{profile.latency_calls}")
                    failures: list[str] = []
                    await _call(env, host, sentence, profile.latency_turns, out[agent], failures=failures)
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
    env: LiveKitEnv, workdir: Path, profile: Profile, sentence: Sentence, levels: list[dict[str, Any]]
) -> None:
    """Adds each level to ``levels`` as it is measured (a run cut short keeps those done)."""
    journal = workdir / "concurrency.db"
    async with open_runner(
        env, journal, *_RUNNER_ARGS, "--max-sessions", str(max(profile.levels)), agent=f"{AGENTS}:new"
    ) as host:
        idle_mb = _rss_mb(journal)
        base_p50: float | None = None
        for n in profile.levels:
            say(f"concurrency: {n} calls at once")
            out = Turns()
            failures: list[str] = []
            started = [trio.Event() for _ in range(n)]
            rss_during: list[float] = []

            began = time.perf_counter()
            cpu_before = _cpu_s(journal)
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
            cpu_after = _cpu_s(journal)
            wall = time.perf_counter() - began
            stats = summarize(out.latencies, scale=1000)
            level = {
                "calls": n,
                "end_of_speech_to_first_audio_ms": stats,
                "stages_p50_ms": stage_stats(out.stages),
                "runner_rss_mb": rss_during[0] if rss_during else None,
                "runner_rss_idle_mb": idle_mb,
                "memory_per_call_mb": (rss_during[0] - idle_mb) / n if rss_during and idle_mb else None,
                "seconds": wall,
                # The runner's CPU use while the level ran, in cores (of its own process alone).
                "runner_cores": (cpu_after - cpu_before) / wall if cpu_after and cpu_before else None,
                "failed_calls": failures,
            }
            levels.append(level)
            if failures:
                say(f"  {len(failures)} of {n} calls failed: {failures[0]}")
                if 2 * len(failures) > n:
                    break  # saturated
            say(f"  p50 {stats.get('p50', 0):.0f} ms, p99 {stats.get('p99', 0):.0f} ms")
            if "p50" not in stats:
                break
            if base_p50 is None:
                base_p50 = float(stats["p50"])
            elif float(stats["p50"]) > 2 * base_p50:
                level["doubled"] = True
                break


def stage_stats(turns: list[dict[str, float]], q: str = "p50") -> dict[str, float]:
    """Each moment's percentile ``q`` over the turns that have it, in ms after the end of speech."""
    out: dict[str, float] = {}
    for moment in (*MOMENTS, "received"):
        values = [t[moment] for t in turns if moment in t]
        if values:
            out[moment] = float(summarize(values)[q])
    return out


AGENT_NAMES = {
    "old": "old (energy VAD, pocketsphinx, espeak)",
    "new": "new (Silero, Whisper at pauses, hibari, Smart Turn)",
    "new_silence": "new, its turns ended by 500 ms of silence",
}
# ``--before PATH`` also times the new agent as the runner checked out at PATH serves it.
BEFORE = "@before"


async def run(
    profile: Profile,
    agents: tuple[str, ...],
    levels: tuple[int, ...],
    before: Path | None = None,
    caller_tts: Any = None,
) -> dict[str, Any]:
    """The figures; ``caller_tts`` speaks the caller's sentence (espeak's ``VOICE`` by default)."""
    began = time.perf_counter()
    result: dict[str, Any] = {agent: Turns() for agent in agents}
    result["concurrency"] = []
    profile = attrs.evolve(profile, levels=levels)
    load_at_start = os.getloadavg()
    async with livekit_env("bench-voice-") as (workdir, env):
        cpu_start = cpu_sample()
        try:
            sentence = await sentence_file(workdir, lead_s=LEAD_S, tts=caller_tts)
            with trio.move_on_after(profile.seconds):
                if agents:
                    result |= await latency(env, workdir, agents, profile, sentence, before)
                if levels:
                    await concurrency(env, workdir, profile, sentence, result["concurrency"])
        finally:
            cpu_end = cpu_sample()
    return {
        "benchmark": "livekit_voice",
        "profile": profile.name,
        "command": "python -m bench.livekit_voice" + (" --quick" if profile.name == "quick" else ""),
        "seconds": time.perf_counter() - began,
        "machine": machine_info(),
        "parameters": attrs.asdict(profile)
        | {
            "sentence": SENTENCE,
            "caller_voice": repr(caller_tts) if caller_tts else VOICE,
            "end_of_turn_ms": "500 (new_silence); Smart Turn (new, old)",
            "agents": list(agents),
        }
        | {"before": str(before) if before else None},
        "load_average_at_start": list(load_at_start),
        "load_average_at_end": list(os.getloadavg()),
        "latency_ms": {agent: summarize(result[agent].latencies, scale=1000) for agent in agents},
        "stages_p50_ms": {agent: stage_stats(result[agent].stages) for agent in agents},
        "stages_p99_ms": {agent: stage_stats(result[agent].stages, "p99") for agent in agents},
        # Turns whose reply, and whose first audio, were the ones made before the turn ended.
        "early_taken": {
            agent: {
                "turns": len(result[agent].stages),
                "reply": sum("early_reply_taken" in t for t in result[agent].stages),
                "audio": sum("early_audio_taken" in t for t in result[agent].stages),
            }
            for agent in agents
        },
        "samples_ms": {agent: [round(v * 1000, 1) for v in result[agent].latencies] for agent in agents},
        "stages_ms": {agent: result[agent].stages for agent in agents},
        "concurrency": result["concurrency"],
        "cpu": cpu_report(cpu_start, cpu_end),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls and levels, at most 5 minutes")
    parser.add_argument(
        "--agents", default=",".join(AGENT_NAMES), help=f"agents to time, of {', '.join(AGENT_NAMES)}"
    )
    parser.add_argument("--levels", help="calls at once to try, e.g. 1,2,4 (0: none); default the profile's")
    parser.add_argument(
        "--before",
        type=Path,
        help="a checkout of an older runner: also time the new agent as it serves it (new@before)",
    )
    args = parser.parse_args()
    profile = QUICK if args.quick else FULL
    agents = tuple(a for a in args.agents.split(",") if a)
    if args.before is not None:
        agents += ("new" + BEFORE,)
        AGENT_NAMES["new" + BEFORE] = f"new, as {args.before} serves it"
    unknown = [a for a in agents if a.removesuffix(BEFORE) not in AGENT_NAMES]
    if unknown:
        parser.error(f"unknown agents {unknown}: choose of {', '.join(AGENT_NAMES)}")
    levels = (
        profile.levels if args.levels is None else tuple(int(n) for n in args.levels.split(",") if int(n))
    )
    result = trio.run(run, profile, agents, levels, args.before)
    path = write_results("livekit_voice", result)
    say(f"load average at start {result['load_average_at_start']}, at end {result['load_average_at_end']}")
    latency_ms = result["latency_ms"]
    rows = [
        [AGENT_NAMES[a], s.get("n", 0), f"{s.get('p50', 0):.0f}", f"{s.get('p99', 0):.0f}"]
        for a, s in latency_ms.items()
    ]
    for baseline in ("old", "new" + BEFORE):
        base = latency_ms.get(baseline, {})
        for agent, s in latency_ms.items():
            if agent not in ("old", baseline) and base.get("p50") and s.get("p50"):
                rows.append(
                    [
                        f"{agent} / {baseline}",
                        "",
                        f"{s['p50'] / base['p50']:.2f}",
                        f"{s['p99'] / base['p99']:.2f}",
                    ]
                )
    print_table(["end of speech -> first audio", "n", "p50 ms", "p99 ms"], rows)
    p50s, p99s = result["stages_p50_ms"], result["stages_p99_ms"]
    print_table(
        ["ms after the end of speech, p50 / p99", *p50s],
        [
            [
                moment,
                *(
                    f"{p50s[a][moment]:.0f} / {p99s[a][moment]:.0f}" if moment in p50s[a] else "-"
                    for a in p50s
                ),
            ]
            for moment in (*MOMENTS, "received")
        ],
    )
    for agent, taken in result["early_taken"].items():
        say(
            f"{agent}: the early reply taken in {taken['reply']} of {taken['turns']} turns, "
            f"its early audio in {taken['audio']}"
        )
    print_table(
        [
            "calls at once",
            "turns",
            "p50 ms",
            "p99 ms",
            "runner RSS MB",
            "MB per call",
            "runner cores",
            "failed calls",
        ],
        [
            [
                level["calls"],
                level["end_of_speech_to_first_audio_ms"].get("n", 0),
                f"{level['end_of_speech_to_first_audio_ms'].get('p50', 0):.0f}",
                f"{level['end_of_speech_to_first_audio_ms'].get('p99', 0):.0f}",
                f"{level['runner_rss_mb']:.0f}" if level["runner_rss_mb"] else "-",
                f"{level['memory_per_call_mb']:.1f}" if level["memory_per_call_mb"] else "-",
                f"{level['runner_cores']:.2f}" if level.get("runner_cores") else "-",
                len(level["failed_calls"]),
            ]
            for level in result["concurrency"]
        ],
    )
    say(f"results: {path}")


if __name__ == "__main__":
    main()
