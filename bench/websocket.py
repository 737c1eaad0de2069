"""Agent WebSocket benchmark: what the socket adds to a typed turn's first text and first audio.

    python -m bench.websocket [--quick] [--levels 1,10,50]

A typed turn (``user_message``) to an offline agent (the deterministic local model and
espeak-ng, the same reply every time) is timed from the moment it is asked for:

* first ``text.delta``: the first piece of the reply, as the model writes it;
* first audio byte: the first binary frame of the first audio window.

At each level (1, 10, 50, 100, 200 and 500 sockets; ``--quick``: 1, 10 and 50) the same
number of conversations take turns at the same time, each one after another, three ways:

* **socket**: a real ``runner serve`` process (its own process, as deployed), driven by
  trio-websocket clients in one or more processes of their own (``bench._ws_clients``), so
  at 500 sockets the bench's own client is not what is measured;
* **platform**: the same runner path in this process minus the socket: a real Runner,
  journal, agent store and :class:`~runner.platform.Platform` (calls started and journaled,
  messages stored, usage charged) with a participant that takes the conversation's events
  where a socket would turn them into frames. socket / platform is the socket's own cost
  (frames, the send path, HTTP, the kernel, another process);
* **in-process**: :class:`~runner.agent.AgentRuntime.take_turn` alone (no platform,
  no store, no journal): the issue's original baseline. socket / in-process is the whole
  overhead; platform / in-process is the platform's.

The three run one after another at each level, so their ratios are of the same minutes of
this shared machine; its load average is recorded beside each phase.

Results go to ``bench/results/websocket-<UTC>.json`` and ``websocket-latest.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import trio

from runner.agent import LLM, TTS, Agent

from ._common import (
    cpu_report,
    cpu_sample,
    fmt,
    freeze_heap_as_the_runner_does,
    machine_info,
    print_table,
    ratio,
    say,
    summarize,
    write_results,
)

API_KEY = "bench-websocket-key"
PUBLIC_LINE = "runner: public listener on "
QUESTION = "When is breakfast served?"

# The agent both paths talk to (``runner serve bench.websocket:AGENT``).
AGENT = Agent(
    "bench-ws",
    instructions=(
        "You are the concierge of Hotel Lumen. "
        "Breakfast is served from seven to eleven in the garden room. "
        "Checkout is at noon."
    ),
    llm=LLM(provider="local", model="local"),
    tts=TTS(provider="espeak", voice="en-us+f2"),
)


@attrs.frozen(kw_only=True)
class Profile:
    name: str
    levels: tuple[int, ...]
    sequential_turns: int  # at 1 socket
    turns_each: int  # at more
    seconds_per_phase: float
    sockets_per_client_process: int = 125


QUICK = Profile(name="quick", levels=(1, 10, 50), sequential_turns=20, turns_each=3, seconds_per_phase=40)
FULL = Profile(
    name="full", levels=(1, 10, 50, 100, 200, 500), sequential_turns=100, turns_each=6, seconds_per_phase=90
)
PHASES = ("socket", "platform", "in_process")


@attrs.define
class Sample:
    first_text_s: float | None = None
    first_audio_s: float | None = None
    total_s: float | None = None
    pong_s: float | None = None  # through the socket only: a ping's round trip after the turn


def _process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used so far."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _with_runner(report: dict[str, Any], runner_cpu_s: float) -> dict[str, Any]:
    """A cpu report whose ``others_cores`` leaves out the runner process being measured."""
    runner_cores = runner_cpu_s / report["seconds"] if report.get("seconds") else None
    report = {**report, "runner_cores": runner_cores}
    if report.get("others_cores") is not None and runner_cores is not None:
        report["others_cores"] = max(0.0, report["others_cores"] - runner_cores)
    return report


def _summary(samples: list[Sample]) -> dict[str, Any]:
    return {
        "turns": len(samples),
        "first_text_delta_ms": summarize(
            [s.first_text_s for s in samples if s.first_text_s is not None], scale=1000
        ),
        "first_audio_byte_ms": summarize(
            [s.first_audio_s for s in samples if s.first_audio_s is not None], scale=1000
        ),
        "turn_ms": summarize([s.total_s for s in samples if s.total_s is not None], scale=1000),
        "ping_pong_ms": summarize([s.pong_s for s in samples if s.pong_s is not None], scale=1000),
    }


def _turns_at(profile: Profile, sockets: int) -> int:
    return profile.sequential_turns if sockets == 1 else profile.turns_each


# -- Through the socket -----------------------------------------------------------------------


class RunnerProcess:
    """``runner serve bench.websocket:AGENT`` on free loopback ports; stopped by its pid.

    Its stderr goes to a file, never a pipe nobody reads: with hundreds of calls its log
    lines would fill a pipe and stop the runner's loop at its next write.
    """

    def __init__(self, journal: Path, max_sessions: int) -> None:
        argv = [
            sys.executable,
            "-m",
            "runner",
            "serve",
            "bench.websocket:AGENT",
            "--address",
            "127.0.0.1:0",
            "--public-address",
            "127.0.0.1:0",
            "--journal",
            str(journal),
            "--max-sessions",
            str(max_sessions),
        ]
        env = {
            **os.environ,
            "CURB_API_KEY": API_KEY,
            "CURB_MANAGEMENT_TOKEN": "bench",
            "PYTHONUNBUFFERED": "1",
        }
        self.log = journal.with_suffix(".log")
        with self.log.open("w", encoding="utf-8") as log:
            self.process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log, env=env)
        deadline = time.monotonic() + 60
        self.public = ""
        while not self.public and time.monotonic() < deadline and self.process.poll() is None:
            for line in self.log.read_text(encoding="utf-8", errors="replace").splitlines():
                if line.startswith(PUBLIC_LINE):
                    self.public = line.removeprefix(PUBLIC_LINE).strip()
            time.sleep(0.05)
        if not self.public:
            self.stop()
            raise RuntimeError(f"the runner did not start its public listener (its log: {self.log})")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


async def _clients(
    public: str,
    sockets: int,
    turns: int,
    seconds: float,
    prefix: str,
    per_process: int,
    at_go: Callable[[list[int]], Awaitable[None]] | None = None,
) -> tuple[list[Sample], int]:
    """Run ``sockets`` sockets' turns from client processes started together: the samples, and how many."""
    count = math.ceil(sockets / per_process)
    shares = [sockets // count + (1 if i < sockets % count else 0) for i in range(count)]
    processes = [
        await trio.lowlevel.open_process(
            [
                sys.executable,
                "-m",
                "bench._ws_clients",
                json.dumps(
                    {
                        "public": public,
                        "api_key": API_KEY,
                        "sockets": share,
                        "turns": turns,
                        "seconds": seconds,
                        "prefix": f"{prefix}-{i}",
                    }
                ),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        for i, share in enumerate(shares)
    ]
    outputs: list[bytes] = [b""] * count

    async def read(i: int, process: trio.Process) -> None:
        assert process.stdout is not None
        async for chunk in process.stdout:
            outputs[i] += chunk

    try:
        with trio.fail_after(seconds + 600):  # the set-up mints a key and a conversation per socket
            async with trio.open_nursery() as nursery:
                for i, process in enumerate(processes):
                    nursery.start_soon(read, i, process)
                while not all(b"ready\n" in out for out in outputs):
                    if any(p.poll() is not None for p in processes):
                        raise RuntimeError("a client process ended before its sockets were ready")
                    await trio.sleep(0.05)
                if at_go is not None:
                    await at_go([p.pid for p in processes])
                for process in processes:
                    assert process.stdin is not None
                    await process.stdin.send_all(b"go\n")
                for process in processes:
                    await process.wait()
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
    samples: list[Sample] = []
    for out in outputs:
        line = out.split(b"ready\n", 1)[1].strip().splitlines()[-1]
        samples += [Sample(*row) for row in json.loads(line)["samples"]]
    return samples, count


# Counted in the runner process by ``perf stat`` (software events: they need no hardware
# counters, which this machine's virtual CPUs do not offer), where perf is installed.
PERF_EVENTS = ("syscalls:sys_enter_sendto", "syscalls:sys_enter_futex", "context-switches")


async def _open_perf(pid: int) -> trio.Process | None:
    if shutil.which("perf") is None:
        return None
    try:
        process = await trio.lowlevel.open_process(
            ["perf", "stat", "-x,", "-e", ",".join(PERF_EVENTS), "-p", str(pid)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
    except OSError:
        return None
    await trio.sleep(0.5)  # attached before the turns start
    return process


async def _close_perf(process: trio.Process | None, turns: int) -> dict[str, float] | None:
    """Each event's count per turn, or ``None`` when perf could not count."""
    if process is None or process.returncode is not None:
        return None
    process.send_signal(signal.SIGINT)
    assert process.stderr is not None
    text = b""
    with trio.move_on_after(10):
        async for chunk in process.stderr:
            text += chunk
    await process.wait()
    counts: dict[str, float] = {}
    for line in text.decode(errors="replace").splitlines():
        fields = line.split(",")
        if len(fields) > 2 and fields[0].replace(".", "", 1).isdigit():
            counts[fields[2].split(":")[-1].removeprefix("sys_enter_")] = float(fields[0]) / max(turns, 1)
    return counts or None


def _cpu_ms_per_turn(cpu_s: float, turns: int) -> float | None:
    return cpu_s * 1000 / turns if turns else None


def _own_cpu_s() -> float:
    times = os.times()
    return times.user + times.system


async def measure_socket_level(runner: RunnerProcess, profile: Profile, sockets: int) -> dict[str, Any]:
    """One level through the socket; the CPU figures count from the moment the turns start
    (every socket already open and authenticated), not the clients' set-up.
    """
    turns = _turns_at(profile, sockets)
    pid = runner.process.pid
    began: dict[str, Any] = {}

    async def at_go(clients: list[int]) -> None:
        began["perf"] = await _open_perf(pid)
        began["cpu"], began["runner"] = cpu_sample(), _process_cpu_s(pid)
        began["clients"] = sum(_process_cpu_s(c) for c in clients)
        began["children"] = _children_cpu_s()

    samples, processes = await _clients(
        runner.public,
        sockets,
        turns,
        profile.seconds_per_phase,
        f"bench-{sockets}-{time.monotonic_ns()}",
        profile.sockets_per_client_process,
        at_go,
    )
    runner_cpu_s = _process_cpu_s(pid) - began["runner"]
    cpu = _with_runner(cpu_report(began["cpu"], cpu_sample()), runner_cpu_s)
    cpu["ms_per_turn"] = _cpu_ms_per_turn(runner_cpu_s, len(samples))
    cpu["runner_per_turn"] = await _close_perf(began["perf"], len(samples))
    # The clients' CPU while the turns ran: all of theirs (counted once they were reaped)
    # less what they had used by the start.
    client_cpu_s = _children_cpu_s() - began["children"] - began["clients"]
    cpu["client_cores"] = client_cpu_s / cpu["seconds"] if cpu.get("seconds") else None
    return {
        **_summary(samples),
        "sockets": sockets,
        "client_processes": processes,
        "cpu": cpu,
    }


def _children_cpu_s() -> float:
    times = os.times()
    return times.children_user + times.children_system


# -- The platform in this process, minus the socket -------------------------------------------


@attrs.define(eq=False)
class _Participant:
    """Where a socket would stand in a conversation: it takes the events, times them, sends nothing."""

    end_user_id: str
    token_id: str
    app_tools: tuple[str, ...] = ()
    call: Any = None
    sample: Sample | None = None
    began: float = 0.0
    closed: trio.Event = attrs.Factory(trio.Event)

    def deliver(self, event: Any) -> None:
        from runner.platform import TurnClosed
        from runner.voice.events import AudioData, ReplyDelta

        sample = self.sample
        if sample is None:
            return
        if isinstance(event, ReplyDelta) and sample.first_text_s is None:
            sample.first_text_s = time.perf_counter() - self.began
        elif isinstance(event, AudioData) and sample.first_audio_s is None:
            sample.first_audio_s = time.perf_counter() - self.began
        elif isinstance(event, TurnClosed):
            sample.total_s = time.perf_counter() - self.began
            self.closed.set()

    def turn_over(self) -> None:
        pass

    def close_nowait(self, code: int, reason: str | None = None) -> None:
        pass


async def _platform_turns(person: _Participant, turns: int, deadline: float, out: list[Sample]) -> None:
    from runner.platform import TurnRequest

    conversation = person.call.conversation
    for _ in range(turns):
        if time.perf_counter() > deadline:
            break
        person.sample, person.closed = Sample(), trio.Event()
        person.began = time.perf_counter()
        if conversation.request_turn(person, TurnRequest(text=QUESTION)) != "started":
            raise RuntimeError("the platform refused a turn")
        with trio.fail_after(60):
            await person.closed.wait()
        out.append(person.sample)


@asynccontextmanager
async def open_platform(profile: Profile, data_dir: Path) -> AsyncIterator[Any]:
    """A Runner, its journal and the Platform in this process; yields ``level(sockets, turns)``."""
    from journal import open_agent_store, open_journal
    from runner.agent import choose_experiments, conversation_factory
    from runner.calls import Runner
    from runner.config import Config
    from runner.transports.websocket import AgentSocketService, AgentSocketSetup, WebSocketTransport

    directory = Path(tempfile.mkdtemp(prefix="bench-ws-platform-", dir=data_dir))
    config = Config(
        journal_path=directory / "journal.db", max_sessions=max(profile.levels) + 5, drain_grace_ms=0
    )
    async with open_journal(config.journal_path) as journal, open_agent_store(journal.path) as store:
        transport = WebSocketTransport()
        runner = Runner(
            config,
            journal,
            transports=[transport],
            conversation_factory=conversation_factory(AGENT, host_connected=True),
            experiment_chooser=lambda start: choose_experiments(
                AGENT, start.session_id, start.client_context or {}, start.experiments
            ),
        )
        service = AgentSocketService(runner, transport, store, AgentSocketSetup(agent=AGENT, api_key=None))
        made = 0

        async def person() -> _Participant:
            nonlocal made
            made += 1
            name = f"platform-{made}"
            minted = await service.platform.mint_key(end_user_id=name, ttl_seconds=86_400, credit_limit=None)
            row = await service.platform.create_conversation(minted.row)
            participant = _Participant(end_user_id=name, token_id=minted.row.token_id)
            await service.attach(participant, row)
            return participant

        async def level(sockets: int, turns: int) -> list[Sample]:
            people = [await person() for _ in range(sockets)]
            samples: list[Sample] = []
            deadline = time.perf_counter() + profile.seconds_per_phase
            async with trio.open_nursery() as turning:
                for p in people:
                    turning.start_soon(_platform_turns, p, turns, deadline, samples)
            with trio.fail_after(60):
                for p in people:
                    await p.call.detach(p)
            return samples

        async with trio.open_nursery() as nursery:
            await nursery.start(runner.serve)
            await nursery.start(service.serve)
            await level(1, 3)  # warm up
            try:
                yield level
            finally:
                runner.drain_nowait("bench_done")


# -- In process: the runtime alone ------------------------------------------------------------


async def _runtime_turns(index: int, turns: int, deadline: float, out: list[Sample]) -> None:
    from runner.agent import AgentRuntime
    from runner.calls import CallContext
    from runner.transports.loopback import LoopbackSession
    from runner.voice.events import AudioData, ReplyDelta, TurnEvent

    context = CallContext(session_id=f"bench-{index}", direction="inbound", client={}, experiments={})
    runtime = AgentRuntime(AGENT, context, None, host_connected=False)
    session = LoopbackSession("app")
    current: list[Any] = [None, 0.0]

    async def listen(event: TurnEvent) -> None:
        sample, began = current
        if sample is None:
            return
        if isinstance(event, ReplyDelta) and sample.first_text_s is None:
            sample.first_text_s = time.perf_counter() - began
        elif isinstance(event, AudioData) and sample.first_audio_s is None:
            sample.first_audio_s = time.perf_counter() - began

    async def drain_audio() -> None:
        async for _ in session.audio_out:
            pass

    runtime.add_listener(listen)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(runtime.run, session, session.events)
        nursery.start_soon(drain_audio)
        await runtime.ready.wait()
        for _ in range(turns):
            if time.perf_counter() > deadline:
                break
            sample = Sample()
            began = time.perf_counter()
            current[:] = [sample, began]
            await runtime.take_turn(QUESTION)
            sample.total_s = time.perf_counter() - began
            out.append(sample)
        nursery.cancel_scope.cancel()


async def measure_in_process_level(profile: Profile, sockets: int) -> dict[str, Any]:
    samples: list[Sample] = []
    start, own = cpu_sample(), _own_cpu_s()
    deadline = time.perf_counter() + profile.seconds_per_phase
    async with trio.open_nursery() as nursery:
        for index in range(sockets):
            nursery.start_soon(_runtime_turns, index, _turns_at(profile, sockets), deadline, samples)
    cpu = {
        **cpu_report(start, cpu_sample()),
        "ms_per_turn": _cpu_ms_per_turn(_own_cpu_s() - own, len(samples)),
    }
    return {**_summary(samples), "sockets": sockets, "cpu": cpu}


# -- All levels, the three ways in turn -------------------------------------------------------


async def measure(profile: Profile, data_dir: Path, failed: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every level the three ways; a level the socket side could not finish goes to ``failed``."""
    runner = RunnerProcess(data_dir / f"bench-ws-{os.getpid()}.db", max_sessions=max(profile.levels) + 5)
    levels: list[dict[str, Any]] = []
    try:
        # Warm up: the first turns pay for imports and espeak's first voice load.
        await _clients(runner.public, 1, 3, 60, f"warm-{os.getpid()}", 1)
        await _runtime_turns(-1, 3, time.perf_counter() + 60, [])
        async with open_platform(profile, data_dir) as platform_level:
            for sockets in profile.levels:
                say(f"  {sockets} socket(s): socket (load {os.getloadavg()[0]:.1f})")
                try:
                    socket = await measure_socket_level(runner, profile, sockets)
                except (RuntimeError, OSError, trio.TooSlowError) as exc:
                    # Said in the results, and the curve stops there: more sockets fare no better.
                    say(f"  {sockets} socket(s): failed: {exc!r}")
                    failed.append({"sockets": sockets, "error": repr(exc)[:500]})
                    break
                say(f"  {sockets} socket(s): platform (load {os.getloadavg()[0]:.1f})")
                start, own = cpu_sample(), _own_cpu_s()
                samples = await platform_level(sockets, _turns_at(profile, sockets))
                cpu = cpu_report(start, cpu_sample())
                cpu["ms_per_turn"] = _cpu_ms_per_turn(_own_cpu_s() - own, len(samples))
                platform = {**_summary(samples), "sockets": sockets, "cpu": cpu}
                say(f"  {sockets} socket(s): in-process (load {os.getloadavg()[0]:.1f})")
                local = await measure_in_process_level(profile, sockets)
                levels.append(
                    {"sockets": sockets, "socket": socket, "platform": platform, "in_process": local}
                )
    finally:
        runner.stop()
    return levels


# -- Report -----------------------------------------------------------------------------------

METRICS = (("first_text_delta_ms", "text"), ("first_audio_byte_ms", "audio"))
# The goal at 50 sockets: socket / in-process p50.
GOALS = {"first_text_delta_ms": 3.0, "first_audio_byte_ms": 1.3}
BEFORE = {
    "first_text_delta_ms": "15 / 0.23 ms at 50 sockets (66x)",
    "first_audio_byte_ms": "316 / 193 ms at 50 sockets (1.6x)",
}


def _ratios(level: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for metric, _ in METRICS:
        s, p, i = (level[phase][metric].get("p50") for phase in PHASES)
        out[metric] = {
            "socket_over_in_process": ratio(s, i),
            "socket_over_platform": ratio(s, p),
            "platform_over_in_process": ratio(p, i),
        }
    return out


def _per_turn(counts: dict[str, float] | None) -> str:
    if not counts:
        return "-"
    return f"{fmt(counts.get('sendto'))} / {fmt(counts.get('context-switches'))}"


def _table(levels: list[dict[str, Any]]) -> list[list[str]]:
    rows = []
    for level in levels:
        for metric, name in METRICS:
            r = level["ratios"][metric]
            cells = [f"{name}, {level['sockets']}"]
            for phase in PHASES:
                got = level[phase][metric]
                cells.append(f"{fmt(got.get('p50'))} / {fmt(got.get('p99'))}")
            cells += [
                fmt(r["socket_over_in_process"]) + "x",
                fmt(r["socket_over_platform"]) + "x",
                fmt(r["platform_over_in_process"]) + "x",
                fmt(level["socket"]["ping_pong_ms"].get("p50")),
                " / ".join(fmt(level[phase]["cpu"].get("ms_per_turn")) for phase in PHASES),
                _per_turn(level["socket"]["cpu"].get("runner_per_turn")),
                f"{level['socket'][metric].get('n', 0)}",
                "{:.1f}".format(level["socket"]["cpu"]["load_average"][0]),
            ]
            rows.append(cells)
    return rows


HEADERS = (
    "first ..., sockets",
    "socket p50 / p99 ms",
    "platform p50 / p99",
    "in-process p50 / p99",
    "sock/in-proc",
    "sock/platform",
    "platform/in-proc",
    "ping p50 ms",
    "CPU ms/turn s/p/i",
    "runner sendto / cswitch per turn",
    "turns",
    "load",
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.websocket", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1, 10 and 50 sockets, fewer turns")
    parser.add_argument("--levels", help="comma-separated socket counts instead of the profile's")
    parser.add_argument(
        "--data-dir", type=Path, default=Path(tempfile.gettempdir()), help="where the journals go"
    )
    args = parser.parse_args(argv)
    freeze_heap_as_the_runner_does()
    profile = QUICK if args.quick else FULL
    if args.levels:
        profile = attrs.evolve(profile, levels=tuple(int(n) for n in args.levels.split(",")))
    command = "python -m bench.websocket" + (" --quick" if args.quick else "")
    command += f" --levels {args.levels}" if args.levels else ""
    machine = machine_info(args.data_dir)
    say(f"{command}: {machine['cores']} cores, Python {machine['python']}")
    began = time.perf_counter()
    failed: list[dict[str, Any]] = []
    levels = trio.run(measure, profile, args.data_dir, failed)
    elapsed = time.perf_counter() - began
    for level in levels:
        level["ratios"] = _ratios(level)
    rows = _table(levels)
    at_50 = next((lv for lv in levels if lv["sockets"] == 50), None)
    goals = {
        metric: {
            "before": BEFORE[metric],
            "goal_socket_over_in_process": GOALS[metric],
            "now": at_50["ratios"][metric] if at_50 else None,
        }
        for metric, _ in METRICS
    }
    results = {
        "benchmark": "websocket",
        "profile": profile.name,
        "command": command,
        "finished_at_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "seconds": elapsed,
        "machine": machine,
        "parameters": attrs.asdict(profile),
        "turn": {"text": QUESTION, "agent": "local model + espeak-ng en-us+f2, one sentence reply"},
        "notes": (
            "socket: a runner serve process, trio-websocket clients in separate processes, times from sending"
            " user_message to receiving the frame; platform: Runner + journal + Platform in the bench"
            " process, a participant in place of the socket, times from request_turn to the event;"
            " in_process: AgentRuntime.take_turn alone, times to the engine's first ReplyDelta / AudioData"
        ),
        "levels": levels,
        "failed_levels": failed,
        "goals": goals,
        "table": [dict(zip(HEADERS, row, strict=True)) for row in rows],
    }
    path = write_results("websocket", results)
    print()
    print(
        f"{command} ({profile.name}, {elapsed:.0f} s; {machine['cores']} cores, Python {machine['python']})"
    )
    print_table(HEADERS, rows)
    for metric, name in METRICS:
        now = goals[metric]["now"]
        got = fmt(now["socket_over_in_process"]) + "x" if now else "-"
        print(
            f"goal, first {name} at 50 sockets: socket / in-process at most {GOALS[metric]}x;"
            f" before {BEFORE[metric]}; now {got}"
        )
    for level in failed:
        print(f"{level['sockets']} sockets: not measured: {level['error']}")
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
