"""Side by side with livekit-agents and Pipecat: the same models, LiveKit server and caller.

    python -m bench.peers [--quick] [--agents curb,livekit_agents,pipecat] [--caller-voice hibari|espeak]
    (root: a network namespace)

One livekit-server in a private network namespace (tests/livekit/lk_harness.py), one caller
program (tests/livekit/lk_peer.py) saying the same sentence (in hibari's voice, see
``CALLER_VOICES``), and three agents answering it with
the same speech models, the same greeting and instructions, one call at a time:

* ``curb``: ``runner serve`` with bench/_voice_agents.py's ``new`` agent (Silero VAD, Whisper
  tiny.en, hibari, the local model; the end of turn by the end-of-turn model, its default);
  ``curb_silence`` (only when named in ``--agents``): the same with the end of turn after 500 ms
  of quiet, the rule of livekit-agents' default endpointing;
* ``livekit_agents``: livekit-agents 1.8.9's worker and process pool (bench/peer_plugins/
  lk_agents_peer.py), dispatched to each call's room (explicit dispatch);
* ``pipecat``: Pipecat 1.14.0, one bot process per call (bench/peer_plugins/pipecat_peer.py).

The peers run in venvs of their own, built on first use (bench/peers_venv.py); their thin
plugins (bench/peer_plugins/peer_speech.py) load the very models the runner embeds and decode
and voice them as the runner does.

Each agent's processes are pinned to core 0 (every thread, as ``taskset -a -p`` would), and this
process, the server and the callers to the others, so one core's figure is the agent's own.

1. Latency: calls of a few turns, the agents taking turns call by call (so a change in the
   machine's load meets each alike). Per turn, the end of the caller's speech (its last loud
   sample leaving its audio source) to the first loud 20 ms of the reply at the caller; p50,
   p99 (a turn the caller itself played late, short of CPU, is left out and counted), and each
   agent's own stage split (the runner's timeline log; livekit-agents' and
   Pipecat's metrics). CPU per turn: the agent's processes' CPU time over the turns of a call.
2. Calls per core: N calls at once for N in the profile's levels (from 2), the agents taking
   turns level by level; the figure is the most calls whose p50 stayed within twice the agent's
   p50 at one call (the latency phase's; a lower bound when no level doubled). Memory per call: the agent's
   processes' PSS (and RSS) with N calls in their turns, less with none, over N.
3. Words right: the WER of what each agent heard (the runner's journal: its user turns; the
   peers' recognizer plugin: each transcript it returned) against the sentence the caller said.

Results go to ``bench/results/peers-<UTC>.json`` and ``peers-latest.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import sqlite3
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from importlib import metadata
from pathlib import Path
from typing import Any

import attrs
import trio

from runner.providers.hibari import HibariTTS

from . import peers_venv
from ._common import machine_info, print_table, say, summarize, write_results
from .livekit import SENTENCE, VOICE, Sentence, livekit_env, sentence_file
from .livekit_voice import stage_stats, stages

_LK_TESTS = Path(__file__).resolve().parents[1] / "tests" / "livekit"
if str(_LK_TESTS) not in sys.path:
    sys.path.insert(0, str(_LK_TESTS))

from lk_harness import LiveKitEnv, Peer, PeerError  # noqa: E402 - after the sys.path entry that makes tests/livekit's modules importable
from lk_runner import Host, open_runner  # noqa: E402 - after the sys.path entry that makes tests/livekit's modules importable

HERE = Path(__file__).resolve().parent
PLUGINS = HERE / "peer_plugins"
VOICE_AGENTS = HERE / "_voice_agents.py"
AGENTS = ("curb", "livekit_agents", "pipecat")
AGENT_CORE = 0
LEAD_S = 0.5
START_TIMEOUT_S = 180  # a peer's worker registering, its models loaded
CALL_TIMEOUT_S = 60  # a call's agent joining and greeting
LK_AGENT_NAME = "peers-bench"  # bench/peer_plugins/lk_agents_peer.py's, for explicit dispatch


@attrs.frozen(kw_only=True)
class Profile:
    name: str
    latency_calls: int
    latency_turns: int
    levels: tuple[int, ...]
    turns_per_level: int
    seconds: float


# The levels start at 2: one call's p50 is the latency phase's.
QUICK = Profile(name="quick", latency_calls=2, latency_turns=2, levels=(2, 4), turns_per_level=2, seconds=300)
FULL = Profile(
    name="full", latency_calls=3, latency_turns=4, levels=(2, 3, 4, 6, 8), turns_per_level=3, seconds=1500
)


# -- processes: pinning, CPU and memory ---------------------------------------------------------


def tree(roots: list[int]) -> list[int]:
    """``roots`` and their descendants that are alive, without ``ip netns exec`` wrappers."""
    import psutil

    found: list[int] = []
    for root in roots:
        try:
            process = psutil.Process(root)
            family = [process, *process.children(recursive=True)]
        except psutil.Error:
            continue
        for member in family:
            with contextlib.suppress(psutil.Error):
                if member.name() != "ip":
                    found.append(member.pid)
    return found


def pin(pids: list[int], cpus: set[int]) -> None:
    """Every thread of ``pids`` onto ``cpus`` (threads made later inherit it from their maker)."""
    for pid in pids:
        with contextlib.suppress(OSError):
            for tid in os.listdir(f"/proc/{pid}/task"):
                with contextlib.suppress(OSError):
                    os.sched_setaffinity(int(tid), cpus)


def cpu_seconds(pids: list[int]) -> dict[int, float]:
    """Each process's CPU time so far (user and system, all threads)."""
    import psutil

    out: dict[int, float] = {}
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            times = psutil.Process(pid).cpu_times()
            out[pid] = times.user + times.system
    return out


def cpu_spent(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds spent between two samples (a process new in ``after`` counts whole)."""
    return sum(value - before.get(pid, 0.0) for pid, value in after.items())


def memory_mb(pids: list[int]) -> dict[str, float]:
    """The processes' resident memory, summed: RSS (shared pages counted in each) and PSS (each
    shared page split between its sharers, so the sum counts it once), in MiB."""
    import psutil

    rss = pss = 0.0
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            info = psutil.Process(pid).memory_full_info()
            rss += info.rss
            pss += getattr(info, "pss", info.rss)
    return {"rss": rss / 2**20, "pss": pss / 2**20, "processes": len(pids)}


# -- the agents -----------------------------------------------------------------------------------


class Side:
    """One agent under test: how it starts, takes a call, and what it heard."""

    name = ""

    def __init__(self, env: LiveKitEnv, workdir: Path, cpus: set[int] | None) -> None:
        self.env = env
        self.workdir = workdir
        self.cpus = cpus
        self.log = workdir / f"{self.name}.peer.jsonl"

    def roots(self) -> list[int]:
        return []

    def pids(self) -> list[int]:
        """The agent's live processes, each pinned to its cores (again: new ones appear)."""
        pids = tree(self.roots())
        if self.cpus is not None:
            pin(pids, self.cpus)
        return pids

    def pin(self) -> None:
        if self.cpus is not None:
            self.pids()

    async def start(self, stack: AsyncExitStack) -> None:
        pass

    @asynccontextmanager
    async def call(self, room: str, caller: Peer) -> AsyncIterator[None]:
        """The agent is sent to ``room``, where ``caller`` is; the call ends when this exits or
        the caller leaves."""
        yield

    async def settle(self) -> None:
        """Until no call of this agent is left (its processes gone or idle)."""

    def heard(self, room: str) -> list[str]:
        return [n["text"] for n in self.notes() if n["kind"] == "heard" and n.get("room") == room]

    def notes(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines() if line.strip()]

    def stages(self, room: str, began: float, speech_end: float, heard_at: float) -> dict[str, float]:
        return {}

    def diagnose(self) -> str:
        """The tails of this agent's logs (``CURB_PEERS_DEBUG=1``: printed when a call fails)."""
        return "\n".join(
            f"--- {path.name}:\n{path.read_text(errors='replace')[-4000:]}"
            for path in sorted(self.workdir.glob(f"{self.name}*.stderr"))
        )

    def versions(self) -> dict[str, str]:
        return {}

    def peer_env(self) -> dict[str, str]:
        return self.env.env({"CURB_PEER_LOG": str(self.log), "PYTHONUNBUFFERED": "1"})


class Curb(Side):
    name = "curb"
    agent = "new"  # bench/_voice_agents.py's: the embedded defaults
    # Debug: the runner's timeline marks (bench/livekit_voice.py) reach its stderr.
    ARGS = ("--log-level", "debug", "--public-address", "127.0.0.1:0", "--max-sessions", "64")

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.host: Host | None = None
        self.sessions: dict[str, str] = {}

    def roots(self) -> list[int]:
        return [self.host.runner.process.pid] if self.host else []

    async def start(self, stack: AsyncExitStack) -> None:
        self.journal = self.workdir / f"{self.name}.db"
        self.host = await stack.enter_async_context(
            open_runner(self.env, self.journal, *self.ARGS, agent=f"{VOICE_AGENTS}:{self.agent}")
        )
        self.pin()

    @asynccontextmanager
    async def call(self, room: str, caller: Peer) -> AsyncIterator[None]:
        assert self.host is not None
        session = f"peers-{uuid.uuid4().hex[:8]}"
        self.sessions[room] = session
        answer = await self.host.start_call(session, room)
        if answer.status != 202:
            raise RuntimeError(f"POST /v1/sessions answered {answer.status}: {answer.body}")
        try:
            yield
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(15):
                await self.host.stop_call(session)

    def heard(self, room: str) -> list[str]:
        """The call's user turns as the runner journaled them (host protocol 1.0: its
        ``conversation`` records of ``type`` turn and ``role`` user)."""
        session = self.sessions.get(room)
        if session is None:
            return []
        db = sqlite3.connect(f"file:{self.journal}?mode=ro", uri=True, timeout=10)
        try:
            rows = db.execute(
                "SELECT body FROM records WHERE producer = ? ORDER BY seq", (session,)
            ).fetchall()
        finally:
            db.close()
        out = []
        for (body,) in rows:
            record = json.loads(body)
            found = _user_turn(record)
            if found is not None:
                out.append(found)
        return out

    def stages(self, room: str, began: float, speech_end: float, heard_at: float) -> dict[str, float]:
        assert self.host is not None
        return stages(self.host.runner.stderr, self.sessions[room], began, speech_end, heard_at)

    def versions(self) -> dict[str, str]:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE, check=False
        ).stdout.strip()
        return {"curb-runner": metadata.version("curb-runner"), "commit": commit}


class CurbSilence(Curb):
    """The runner with a fixed end of turn (500 ms of quiet), as livekit-agents' endpointing."""

    name = "curb_silence"
    agent = "new_silence"


def _user_turn(record: Any) -> str | None:
    """The user's words in a journaled ``conversation`` record (its body, possibly nested)."""
    if isinstance(record, dict):
        if (
            record.get("type") == "turn"
            and record.get("role") == "user"
            and isinstance(record.get("text"), str)
        ):
            return str(record["text"])
        for value in record.values():
            if isinstance(value, dict):
                found = _user_turn(value)
                if found is not None:
                    return found
    return None


class LiveKitAgents(Side):
    name = "livekit_agents"

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.worker: trio.Process | None = None

    def roots(self) -> list[int]:
        return [self.worker.pid] if self.worker else []

    async def start(self, stack: AsyncExitStack) -> None:
        python = await trio.to_thread.run_sync(peers_venv.ensure, "livekit_agents")
        out = self.workdir / "livekit_agents.stderr"
        sink = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            self.worker = await self.env.open_process(
                [str(python), str(PLUGINS / "lk_agents_peer.py"), "start"],
                stdout=sink,
                stderr=subprocess.STDOUT,
                env=self.peer_env(),
                cwd="/tmp",
            )
        finally:
            os.close(sink)
        stack.push_async_callback(_stop, self.worker)
        self.pin()
        await _wait_for("registered worker", out, self.worker)
        # Its pool's first process loaded its models (the pool keeps it warm for the next job).
        await _wait_for("process initialized", out, self.worker)
        self.pin()

    @asynccontextmanager
    async def call(self, room: str, caller: Peer) -> AsyncIterator[None]:
        """Explicit dispatch (AgentDispatchService), as its docs advise once more than one kind of
        agent shares a server: with automatic dispatch its worker joined the other agents' rooms."""
        await caller.request("create_dispatch", agent_name=LK_AGENT_NAME, room=room)
        yield

    def stages(self, room: str, began: float, speech_end: float, heard_at: float) -> dict[str, float]:
        """livekit-agents' metrics of the turn: end of utterance (from the VAD's end of speech),
        transcription, the model's first token, the voice's first byte, in ms."""
        out: dict[str, float] = {}
        for note in self.notes():
            if note["kind"] != "metrics" or note.get("room") != room or not began <= note["at"] <= heard_at:
                continue
            m = note["metrics"]
            for key in ("end_of_utterance_delay", "transcription_delay", "ttft", "ttfb"):
                if isinstance(m.get(key), (int, float)) and m[key] >= 0:
                    out[f"{m.get('type', '?')}.{key}"] = m[key] * 1000
        out["received"] = (heard_at - speech_end) * 1000
        return out

    def versions(self) -> dict[str, str]:
        return peers_venv.versions("livekit_agents")


class Pipecat(Side):
    name = "pipecat"

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.bots: dict[str, trio.Process] = {}
        self.python: Path | None = None

    def roots(self) -> list[int]:
        return [bot.pid for bot in self.bots.values() if bot.returncode is None]

    async def start(self, stack: AsyncExitStack) -> None:
        self.python = await trio.to_thread.run_sync(peers_venv.ensure, "pipecat")

        async def stop_all() -> None:
            for bot in self.bots.values():
                await _stop(bot)

        stack.push_async_callback(stop_all)

    @asynccontextmanager
    async def call(self, room: str, caller: Peer) -> AsyncIterator[None]:
        assert self.python is not None
        token = self.env.token("agent", room, agent=True)
        argv = [str(self.python), str(PLUGINS / "pipecat_peer.py"), "--url", self.env.url, "--token", token]
        sink = os.open(self.workdir / f"pipecat-{room}.stderr", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            bot = await self.env.open_process(
                [*argv, "--room", room],
                stdout=sink,
                stderr=subprocess.STDOUT,
                env=self.peer_env(),
                cwd="/tmp",
            )
        finally:
            os.close(sink)
        self.bots[room] = bot
        self.pin()
        yield  # the bot leaves when the caller does

    async def settle(self) -> None:
        for bot in self.bots.values():
            with trio.move_on_after(15):
                await bot.wait()
            await _stop(bot)

    def stages(self, room: str, began: float, speech_end: float, heard_at: float) -> dict[str, float]:
        """Pipecat's metrics of the turn: each service's time to first byte and processing, in ms."""
        out: dict[str, float] = {}
        for note in self.notes():
            if note["kind"] != "metrics" or note.get("room") != room or not began <= note["at"] <= heard_at:
                continue
            m = note["metrics"]
            if isinstance(m.get("value"), (int, float)) and m.get("type") in (
                "TTFBMetricsData",
                "ProcessingMetricsData",
            ):
                service = re.sub(r"#\d+$", "", str(m.get("processor", "?")))
                kind = "ttfb" if m["type"] == "TTFBMetricsData" else "processing"
                out[f"{service}.{kind}"] = m["value"] * 1000
        out["received"] = (heard_at - speech_end) * 1000
        return out

    def versions(self) -> dict[str, str]:
        return peers_venv.versions("pipecat")


SIDES: dict[str, type[Side]] = {
    "curb": Curb,
    "curb_silence": CurbSilence,
    "livekit_agents": LiveKitAgents,
    "pipecat": Pipecat,
}


async def _stop(process: trio.Process) -> None:
    with trio.CancelScope(shield=True):
        if process.returncode is None:
            process.terminate()
            with trio.move_on_after(10):
                await process.wait()
        if process.returncode is None:
            process.kill()
            await process.wait()


async def _wait_for(line: str, log: Path, process: trio.Process) -> None:
    """Until ``line`` is in the process's ``log``; bounded."""
    text = ""
    with trio.move_on_after(START_TIMEOUT_S):
        while line not in (text := await trio.Path(log).read_text(errors="replace")):
            if process.returncode is not None:
                raise RuntimeError(f"it exited with {process.returncode}:\n{text[-3000:]}")
            await trio.sleep(0.2)
        return
    raise RuntimeError(f"not ready within {START_TIMEOUT_S} s:\n{text[-3000:]}")


# -- calls ----------------------------------------------------------------------------------------


@attrs.define
class Turns:
    latencies: list[float] = attrs.Factory(list)
    stages: list[dict[str, float]] = attrs.Factory(list)
    cpu_s: float = 0.0
    turns_timed_for_cpu: int = 0
    greeting_s: list[float] = attrs.Factory(list)
    greetings_missed: int = 0
    caller_late: int = 0  # turns left out: the caller's own playout ran late
    calls: list[tuple[str, int]] = attrs.Factory(list)  # (room, turns said)
    failures: list[str] = attrs.Factory(list)


async def one_call(
    side: Side,
    sentence: Sentence,
    turns: int,
    into: Turns,
    *,
    in_turns: trio.Event | None = None,
    pace_s: float = 0.0,
    measure_cpu: bool = False,
) -> None:
    """One call of ``turns`` turns; a failed call is counted in ``into.failures``."""
    try:
        await _call(side, sentence, turns, into, in_turns=in_turns, pace_s=pace_s, measure_cpu=measure_cpu)
    except Exception as exc:  # noqa: BLE001 - an overloaded call is a figure, not the end of the run
        while isinstance(exc, ExceptionGroup) and len(exc.exceptions) == 1:
            exc = exc.exceptions[0]
        into.failures.append(f"{type(exc).__name__}: {str(exc)[:2000]}")
        say(f"  {side.name}: a call failed: {type(exc).__name__}: {str(exc)[:300]}")
        if os.environ.get("CURB_PEERS_DEBUG"):
            say(side.diagnose())
    finally:
        if in_turns is not None:
            in_turns.set()


# A turn whose sentence took the caller this much longer than its length to play is left out:
# the caller (not the agent) was short of CPU, and its end of speech is not where it says.
LATE_PLAYOUT_S = 0.5


async def _turn(caller: Peer, sentence: Sentence) -> tuple[float, float, bool]:
    """The caller says ``sentence``: when its speech ended, when the reply was first heard, and
    whether the caller itself ran late."""
    path, rate, after_speech_s = sentence
    said = await caller.request("play", path=str(path), rate=rate, timeout=60)
    speech_end = float(said["ended_at"]) - after_speech_s
    reply = await caller.request("wait_speech", after=speech_end, within=30, timeout=35)
    length_s = path.stat().st_size / 2 / rate
    late = float(said["ended_at"]) - float(said["started_at"]) > length_s + LATE_PLAYOUT_S
    return speech_end, float(reply["first_loud_at"]), late


async def _call(
    side: Side,
    sentence: Sentence,
    turns: int,
    into: Turns,
    *,
    in_turns: trio.Event | None,
    pace_s: float,
    measure_cpu: bool,
) -> None:
    _, rate, _ = sentence
    room = side.env.unique_room(side.name.replace("_", "-"))
    said = 0
    try:
        async with side.env.peer("caller", room) as caller:
            await caller.request("publish_mic", rate=rate)
            placed = time.monotonic()
            async with side.call(room, caller):
                side.pin()
                await caller.request(
                    "record", identity="*agent", within=CALL_TIMEOUT_S, timeout=CALL_TIMEOUT_S + 5
                )
                try:
                    greeting = await caller.request("wait_speech", within=20, timeout=25)
                    into.greeting_s.append(float(greeting["first_loud_at"]) - placed)
                except PeerError:
                    into.greetings_missed += 1  # said before the recording began: not a figure
                await caller.request("wait_quiet", quiet_ms=600, within=30, timeout=35)
                if pace_s:
                    await trio.sleep(random.uniform(0, pace_s))  # calls do not talk in lockstep
                cpu_before = cpu_seconds(side.pids()) if measure_cpu else {}
                for turn in range(turns):
                    began = time.monotonic()
                    speech_end, heard_at, late = await _turn(caller, sentence)
                    said += 1
                    if late:
                        into.caller_late += 1
                    else:
                        into.latencies.append(heard_at - speech_end)
                        into.stages.append(side.stages(room, began, speech_end, heard_at))
                    if turn == 0 and in_turns is not None:
                        in_turns.set()
                    await caller.request("wait_quiet", after=heard_at, quiet_ms=600, within=30, timeout=35)
                if measure_cpu:
                    into.cpu_s += cpu_spent(cpu_before, cpu_seconds(side.pids()))
                    into.turns_timed_for_cpu += turns
    finally:
        into.calls.append((room, said))


# -- the phases -----------------------------------------------------------------------------------


async def latency(
    sides: list[Side], profile: Profile, sentence: Sentence, deadline: float
) -> dict[str, Turns]:
    out = {side.name: Turns() for side in sides}
    for n in range(profile.latency_calls):
        for side in sides[n % len(sides) :] + sides[: n % len(sides)]:  # each goes first in turn
            if trio.current_time() > deadline:
                return out
            say(f"latency: {side.name}, call {n + 1}/{profile.latency_calls}")
            await one_call(side, sentence, profile.latency_turns, out[side.name], measure_cpu=True)
            await side.settle()
    return out


async def level(side: Side, n: int, profile: Profile, sentence: Sentence) -> dict[str, Any]:
    """``n`` calls at once on ``side``: their latency, and the agent's memory with them in turns."""
    await side.settle()
    await trio.sleep(1.0)
    idle = memory_mb(side.pids())
    out = Turns()
    started = [trio.Event() for _ in range(n)]
    during: list[dict[str, float]] = []

    async def sample() -> None:
        for event in started:
            await event.wait()
        during.append(memory_mb(side.pids()))

    began = time.perf_counter()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(sample)
        for i in range(n):
            nursery.start_soon(
                lambda i=i: one_call(
                    side, sentence, profile.turns_per_level, out, in_turns=started[i], pace_s=3.0
                )
            )
    stats = summarize(out.latencies, scale=1000)
    memory = during[0] if during else None
    return {
        "calls": n,
        "latency_ms": stats,
        "memory_idle_mb": idle,
        "memory_in_turns_mb": memory,
        "memory_per_call_mb": {
            k: (memory[k] - idle[k]) / n for k in ("pss", "rss") if memory is not None and memory[k] > idle[k]
        },
        "seconds": time.perf_counter() - began,
        "failed_calls": out.failures,
        "caller_late": out.caller_late,
        "heard": [(room, said, side.heard(room)) for room, said in out.calls],
    }


async def concurrency(
    sides: list[Side], profile: Profile, sentence: Sentence, deadline: float, base: dict[str, float | None]
) -> dict[str, list[dict[str, Any]]]:
    """The levels, agent after agent at each; an agent drops out once its p50 passed twice its
    ``base`` (its p50 with one call, from the latency phase) or most of its calls failed."""
    out: dict[str, list[dict[str, Any]]] = {side.name: [] for side in sides}
    active = [side for side in sides if base.get(side.name)]
    for n in profile.levels:
        for side in list(active):
            if trio.current_time() > deadline and n != profile.levels[0]:
                return out
            say(f"concurrency: {side.name}, {n} calls at once")
            got = await level(side, n, profile, sentence)
            levels = out[side.name]
            levels.append(got)
            p50 = got["latency_ms"].get("p50")
            one = base[side.name]
            say(
                f"  p50 {p50 or 0:.0f} ms, p99 {got['latency_ms'].get('p99', 0):.0f} ms,"
                f" {len(got['failed_calls'])} failed, memory per call {got['memory_per_call_mb']}"
            )
            if p50 is None and not got["failed_calls"]:
                # Every turn left out: the callers, not the agent, were short of CPU.
                got["unmeasured"] = True
                active.remove(side)
            elif p50 is None or 2 * len(got["failed_calls"]) > n or (one and p50 > 2 * one):
                got["doubled"] = True
                active.remove(side)
    return out


def calls_per_core(levels: list[dict[str, Any]], one_call_p50: float | None) -> tuple[int | None, bool]:
    """The most calls at once whose p50 stayed within twice the p50 at one call (1 when the first
    level tried already doubled), and whether that is only a lower bound (no level doubled; a
    level whose every turn the callers played late measured nothing)."""
    if one_call_p50 is None:
        return None, False
    good = [1] + [lv["calls"] for lv in levels if not lv.get("doubled") and not lv.get("unmeasured")]
    return max(good), not any(lv.get("doubled") for lv in levels)


def _normalise(text: str) -> str:
    return " ".join(re.sub(r"[^a-z' ]+", " ", text.lower().replace("-", " ")).split())


def word_error_rate(calls: list[tuple[str, int, list[str]]]) -> dict[str, Any]:
    """What the agent heard over its calls against what the caller said (SENTENCE per turn)."""
    import jiwer

    references, hypotheses = [], []
    for _, said, heard in calls:
        if said:
            references.append(_normalise(" ".join([SENTENCE] * said)))
            hypotheses.append(_normalise(" ".join(heard)))
    if not references:
        return {"wer": None, "calls": 0}
    return {
        "wer": jiwer.wer(references, hypotheses),
        "calls": len(references),
        "turns": sum(said for _, said, _ in calls),
        "examples": [h for h in hypotheses[:3]],
    }


def _stage_medians(turns: list[dict[str, float]]) -> dict[str, float]:
    keys = sorted({k for t in turns for k in t})
    return {k: statistics.median([t[k] for t in turns if k in t]) for k in keys}


# -- the run --------------------------------------------------------------------------------------


#: Who speaks the caller's sentence. hibari by default: the end-of-turn model, trained on
#: people, rates espeak's flat "... my name is John." unfinished (0.02), so with espeak the
#: runner's default waits its 2 s cap on every turn (docs/speech.md), a voice no caller has.
CALLER_VOICES = ("hibari", "espeak")


async def run(profile: Profile, agents: tuple[str, ...], caller_voice: str = "hibari") -> dict[str, Any]:
    began = time.perf_counter()
    load_at_start = os.getloadavg()
    cores = sorted(os.sched_getaffinity(0))
    agent_cpus = {AGENT_CORE} if len(cores) > 1 else None
    if agent_cpus is not None:
        # This process, the server and the callers (its children) on the other cores.
        os.sched_setaffinity(0, set(cores) - agent_cpus)
    # The peers' venvs first (a first run builds them), outside the timed part.
    for name in agents:
        if name in peers_venv.PEERS:
            say(f"{name}: its venv")
            await trio.to_thread.run_sync(peers_venv.ensure, name)
    results: dict[str, Any] = {}
    async with livekit_env("bench-peers-") as (workdir, env):
        tts = HibariTTS() if caller_voice == "hibari" else None  # espeak's VOICE otherwise
        sentence = await sentence_file(workdir, lead_s=LEAD_S, tts=tts)
        sides = [SIDES[name](env, workdir, agent_cpus) for name in agents]
        async with AsyncExitStack() as stack:
            for side in sides:
                say(f"{side.name}: starting")
                await side.start(stack)
            # The latency phase gets 60% of the run's time; the first level of calls at once is
            # tried for every agent even past the deadline (calls per core needs it).
            began_phases = trio.current_time()
            deadline = began_phases + profile.seconds
            timed = await latency(sides, profile, sentence, began_phases + 0.6 * profile.seconds)
            base = {name: summarize(turns.latencies, scale=1000).get("p50") for name, turns in timed.items()}
            levels = await concurrency(sides, profile, sentence, deadline, base)
            for side in sides:
                await side.settle()
                turns = timed[side.name]
                heard = [(room, said, side.heard(room)) for room, said in turns.calls]
                heard += [h for lv in levels[side.name] for h in lv["heard"]]
                per_core, lower_bound = calls_per_core(levels[side.name], base[side.name])
                measured = [lv for lv in levels[side.name] if lv["memory_per_call_mb"]]
                memory = measured[-1]["memory_per_call_mb"] if measured else {}
                latency_ms = summarize(turns.latencies, scale=1000)
                results[side.name] = {
                    "latency_ms": {"p50": latency_ms.get("p50"), "p99": latency_ms.get("p99")},
                    "latency_summary_ms": latency_ms,
                    "calls_per_core": per_core,
                    "calls_per_core_is_lower_bound": lower_bound,
                    "memory_per_call_mb": memory.get("pss"),
                    "memory_per_call_rss_mb": memory.get("rss"),
                    "memory_measured_at_calls": measured[-1]["calls"] if measured else None,
                    "cpu_ms_per_turn": 1000 * turns.cpu_s / turns.turns_timed_for_cpu
                    if turns.turns_timed_for_cpu
                    else None,
                    "wer": word_error_rate(heard)["wer"],
                    "words": word_error_rate(heard),
                    "versions": side.versions(),
                    "greeting_after_call_placed_ms": summarize(turns.greeting_s, scale=1000),
                    "greetings_missed": turns.greetings_missed,
                    "turns_left_out_caller_late": turns.caller_late
                    + sum(lv["caller_late"] for lv in levels[side.name]),
                    "stages_p50_ms": stage_stats(turns.stages)
                    if isinstance(side, Curb)
                    else _stage_medians(turns.stages),
                    "samples_ms": [round(v * 1000, 1) for v in turns.latencies],
                    "failed_calls": turns.failures,
                    "levels": [{k: v for k, v in lv.items() if k != "heard"} for lv in levels[side.name]],
                }
    return {
        "benchmark": "peers",
        "profile": profile.name,
        "command": "python -m bench.peers" + (" --quick" if profile.name == "quick" else ""),
        "seconds": time.perf_counter() - began,
        "machine": machine_info(),
        "parameters": attrs.asdict(profile)
        | {"sentence": SENTENCE, "caller_voice": caller_voice if caller_voice == "hibari" else VOICE}
        | {"agents": list(agents)}
        | {"agent_cpus": sorted(agent_cpus) if agent_cpus else None, "end_of_turn_ms": 500},
        "load_average_at_start": list(load_at_start),
        "load_average_at_end": list(os.getloadavg()),
        **results,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls and levels (under 8 minutes)")
    parser.add_argument(
        "--agents", default=",".join(AGENTS), help=f"of {', '.join(SIDES)} (default {', '.join(AGENTS)})"
    )
    parser.add_argument(
        "--caller-voice", choices=CALLER_VOICES, default="hibari", help="who speaks the caller's sentence"
    )
    args = parser.parse_args()
    agents = tuple(a for a in args.agents.split(",") if a)
    unknown = [a for a in agents if a not in SIDES]
    if unknown:
        parser.error(f"unknown agents {unknown}: choose of {', '.join(SIDES)}")
    result = trio.run(run, QUICK if args.quick else FULL, agents, args.caller_voice)
    path = write_results("peers", result)
    rows = []
    for name in agents:
        r = result[name]
        rows.append(
            [
                name,
                _f(r["latency_ms"]["p50"]),
                _f(r["latency_ms"]["p99"]),
                f"{r['calls_per_core']}{'+' if r['calls_per_core_is_lower_bound'] else ''}",
                _f(r["memory_per_call_mb"], 1),
                _f(r["memory_per_call_rss_mb"], 1),
                _f(r["cpu_ms_per_turn"]),
                _f(r["wer"], 3),
            ]
        )
    print_table(
        ["agent", "p50 ms", "p99 ms", "calls/core", "MB/call PSS", "MB/call RSS", "CPU ms/turn", "WER"], rows
    )
    say(f"load average at start {result['load_average_at_start']}, at end {result['load_average_at_end']}")
    say(f"results: {path}")


def _f(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


if __name__ == "__main__":
    main()
