"""Agent WebSocket benchmark: what the socket adds to a typed turn's first text and first audio.

    python -m bench.websocket [--quick]

A typed turn (``user_message``) to an offline agent (the deterministic local model and
espeak-ng, the same reply every time) is timed from the moment the client sends it:

* first ``text.delta``: the first piece of the reply, as the model writes it;
* first audio byte: the first binary frame of the first audio window.

Through the socket, a real ``runner serve`` process (its own process, as deployed) is
driven by trio-websocket clients in this process: 1 socket taking turns one after another,
then 50 sockets (50 conversations of 50 people) taking turns at the same time. In process,
the same turns run through :class:`~runner.agent._runtime.AgentRuntime` directly (no
socket, no frames, no HTTP, one process), 1 and then 50 at the same time, and the first
``ReplyDelta`` and ``AudioData`` are timed from the call of ``take_turn``. The ratio of the
two p50s is the socket's own overhead. The machine's other load is recorded beside the
figures (``cpu``): they are trustworthy only when ``others_cores`` is near zero.

Results go to ``bench/results/websocket-<UTC>.json`` and ``websocket-latest.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio
from trio_websocket import open_websocket_url

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
    sequential_turns: int
    concurrent_sockets: int
    concurrent_turns_each: int
    seconds_per_phase: float


QUICK = Profile(
    name="quick", sequential_turns=30, concurrent_sockets=50, concurrent_turns_each=3, seconds_per_phase=60
)
FULL = Profile(
    name="full", sequential_turns=300, concurrent_sockets=50, concurrent_turns_each=12, seconds_per_phase=300
)


@attrs.define
class Sample:
    first_text_s: float | None = None
    first_audio_s: float | None = None
    total_s: float | None = None


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
    }


# -- Through the socket -----------------------------------------------------------------------


class RunnerProcess:
    """``runner serve bench.websocket:AGENT`` on free loopback ports; stopped by its pid."""

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
        self.process = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, text=True
        )
        assert self.process.stderr is not None
        deadline = time.monotonic() + 60
        self.public = ""
        for line in self.process.stderr:
            if line.startswith(PUBLIC_LINE):
                self.public = line.removeprefix(PUBLIC_LINE).strip()
                break
            if time.monotonic() > deadline:
                break
        if not self.public:
            self.stop()
            raise RuntimeError("the runner did not start its public listener")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process.stderr is not None:
            self.process.stderr.close()


async def _conversation(client: httpx.AsyncClient, person: str) -> tuple[str, str]:
    minted = await client.post(
        "/v1/ephemeral-keys", json={"end_user_id": person}, headers={"Authorization": f"Bearer {API_KEY}"}
    )
    token = minted.json()["token"]
    session = await client.post("/v1/agent/sessions", json={}, headers={"Authorization": f"Bearer {token}"})
    return token, session.json()["session_id"]


async def _socket_turns(
    public: str, token: str, session_id: str, turns: int, deadline: float, out: list[Sample]
) -> None:
    url = f"ws://{public}/v1/agent/stream?session_id={session_id}"
    async with open_websocket_url(url, subprotocols=["ino.v2"], max_message_size=4 << 20) as ws:
        stream = ws._stream
        await ws.send_message(json.dumps({"type": "auth", "key": token, "session_id": session_id}))
        ready = json.loads(await ws.get_message())
        assert ready["type"] == "ready", ready
        for _ in range(turns):
            if time.perf_counter() > deadline:
                break
            sample = Sample()
            began = time.perf_counter()
            await ws.send_message(json.dumps({"type": "user_message", "text": QUESTION}))
            while True:
                message = await ws.get_message()
                now = time.perf_counter() - began
                if isinstance(message, bytes):
                    if sample.first_audio_s is None:
                        sample.first_audio_s = now
                    continue
                kind = json.loads(message)["type"]
                if kind == "text.delta" and sample.first_text_s is None:
                    sample.first_text_s = now
                elif kind in ("turn.done", "interrupted"):
                    sample.total_s = now
                    break
                elif kind == "error":
                    raise RuntimeError(message)
            out.append(sample)
    await stream.aclose()  # trio-websocket leaves it open when the server closed first


async def measure_socket(profile: Profile, data_dir: Path) -> dict[str, Any]:
    runner = RunnerProcess(
        data_dir / f"bench-ws-{os.getpid()}.db", max_sessions=profile.concurrent_sockets + 5
    )
    try:
        async with httpx.AsyncClient(base_url=f"http://{runner.public}", timeout=30) as client:
            people = [
                await _conversation(client, f"bench-{i}") for i in range(profile.concurrent_sockets + 1)
            ]
        results: dict[str, Any] = {}
        # Warm up: the first turns pay for imports and espeak's first voice load.
        await _socket_turns(runner.public, *people[-1], 3, time.perf_counter() + 60, [])
        pid = runner.process.pid
        one: list[Sample] = []
        start, runner_start = cpu_sample(), _process_cpu_s(pid)
        await _socket_turns(
            runner.public,
            *people[0],
            profile.sequential_turns,
            time.perf_counter() + profile.seconds_per_phase,
            one,
        )
        cpu = _with_runner(cpu_report(start, cpu_sample()), _process_cpu_s(pid) - runner_start)
        results["one"] = {**_summary(one), "cpu": cpu}
        many: list[Sample] = []
        start, runner_start = cpu_sample(), _process_cpu_s(pid)
        deadline = time.perf_counter() + profile.seconds_per_phase
        async with trio.open_nursery() as nursery:
            for token, session_id in people[: profile.concurrent_sockets]:
                nursery.start_soon(
                    _socket_turns,
                    runner.public,
                    token,
                    session_id,
                    profile.concurrent_turns_each,
                    deadline,
                    many,
                )
        cpu = _with_runner(cpu_report(start, cpu_sample()), _process_cpu_s(pid) - runner_start)
        results["many"] = {**_summary(many), "sockets": profile.concurrent_sockets, "cpu": cpu}
        return results
    finally:
        runner.stop()


# -- In process -------------------------------------------------------------------------------


async def _runtime_turns(index: int, turns: int, deadline: float, out: list[Sample]) -> None:
    from runner.agent._runtime import AgentRuntime
    from runner.calls import CallContext
    from runner.transports.loopback import LoopbackSession
    from runner.voice.engine import AudioData, ReplyDelta, TurnEvent

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


async def measure_in_process(profile: Profile) -> dict[str, Any]:
    await _runtime_turns(-1, 3, time.perf_counter() + 60, [])  # warm up
    one: list[Sample] = []
    start = cpu_sample()
    await _runtime_turns(0, profile.sequential_turns, time.perf_counter() + profile.seconds_per_phase, one)
    results: dict[str, Any] = {"one": {**_summary(one), "cpu": cpu_report(start, cpu_sample())}}
    many: list[Sample] = []
    start = cpu_sample()
    deadline = time.perf_counter() + profile.seconds_per_phase
    async with trio.open_nursery() as nursery:
        for index in range(profile.concurrent_sockets):
            nursery.start_soon(_runtime_turns, index, profile.concurrent_turns_each, deadline, many)
    results["many"] = {
        **_summary(many),
        "runtimes": profile.concurrent_sockets,
        "cpu": cpu_report(start, cpu_sample()),
    }
    return results


# -- Report -----------------------------------------------------------------------------------


def _p(got: dict[str, Any], key: str, q: str) -> float | None:
    value = got[key].get(q)
    return float(value) if value is not None else None


def _table(socket: dict[str, Any], local: dict[str, Any]) -> tuple[list[list[str]], dict[str, Any]]:
    rows: list[list[str]] = []
    ratios: dict[str, Any] = {}
    for level, label in (("one", "1 socket"), ("many", "50 sockets")):
        for metric, name in (
            ("first_text_delta_ms", "first text.delta"),
            ("first_audio_byte_ms", "first audio byte"),
        ):
            s, here = socket[level][metric], local[level][metric]
            r50 = ratio(s.get("p50", 0.0), here.get("p50", 0.0))
            ratios[f"{level}.{metric}.p50"] = r50
            rows.append(
                [
                    f"{name}, {label}",
                    f"{fmt(s.get('p50'))} / {fmt(s.get('p99'))} ms",
                    f"{fmt(here.get('p50'))} / {fmt(here.get('p99'))} ms",
                    fmt(r50) + "x" if r50 else "-",
                    f"{s.get('n', 0)} / {here.get('n', 0)}",
                ]
            )
    return rows, ratios


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.websocket", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the short profile (about a minute)")
    parser.add_argument(
        "--data-dir", type=Path, default=Path(tempfile.gettempdir()), help="where the runner's journal goes"
    )
    args = parser.parse_args(argv)
    freeze_heap_as_the_runner_does()
    profile = QUICK if args.quick else FULL
    command = "python -m bench.websocket" + (" --quick" if args.quick else "")
    machine = machine_info(args.data_dir)
    say(f"{command}: {machine['cores']} cores, Python {machine['python']}")
    began = time.perf_counter()
    socket = trio.run(measure_socket, profile, args.data_dir)
    local = trio.run(measure_in_process, profile)
    elapsed = time.perf_counter() - began
    rows, ratios = _table(socket, local)
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
            "socket: a runner serve process, trio-websocket clients in the bench process, times from sending"
            " user_message to receiving the frame; in_process: AgentRuntime.take_turn in the bench process, times"
            " to the engine's first ReplyDelta / AudioData; ratio = socket p50 / in-process p50"
        ),
        "socket": socket,
        "in_process": local,
        "overhead_ratio": ratios,
        "table": [
            dict(
                zip(
                    ("figure", "socket p50 / p99", "in process p50 / p99", "ratio p50", "turns"),
                    row,
                    strict=True,
                )
            )
            for row in rows
        ],
    }
    path = write_results("websocket", results)
    print()
    print(
        f"{command} ({profile.name}, {elapsed:.0f} s; {machine['cores']} cores, Python {machine['python']})"
    )
    print_table(("figure", "socket p50 / p99", "in process p50 / p99", "ratio p50", "turns"), rows)
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
