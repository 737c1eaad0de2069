"""``runner console``: talk to an agent in the terminal, with no transport and no server.

Lines from stdin are the caller's turns; each reply prints as it streams, with tool
calls and timings dimmed. Without ``--text`` the replies are also spoken through the
agent's voice into a WAV file. A console call keeps no record and has no host.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TextIO

import trio

from .agent import Agent
from .agent._runtime import AgentRuntime, choose_experiments
from .calls import CallContext
from .logs import bind_session
from .transports.loopback import LoopbackSession
from .voice.audio import write_wav
from .voice.engine import AudioData, AudioStart, ReplyDelta, ToolEnded, ToolStarted, TurnEvent, TurnFinished


def _dim(text: str, tty: bool) -> str:
    return f"\x1b[2m{text}\x1b[0m" if tty else text


async def run_console(
    agent: Agent,
    *,
    text_only: bool,
    wav_path: Path | None,
    stdin: TextIO = sys.stdin,
    stdout: TextIO = sys.stdout,
) -> int:
    """Converse until end of input; return the exit code (1 if a turn failed)."""
    tty = stdout.isatty()
    session_id = "console"
    bind_session(session_id)
    call = CallContext(
        session_id=session_id,
        direction="inbound",
        client={},
        experiments=choose_experiments(agent, session_id, {}, None),
    )
    if text_only:
        # The console shows text; no need to synthesize speech nobody hears.
        agent = _without_voice(agent)
    runtime = AgentRuntime(agent, call, None, host_connected=False)
    session = LoopbackSession("app")
    audio = bytearray()
    rate = 0
    failed = 0

    async def show(event: TurnEvent) -> None:
        nonlocal rate
        if isinstance(event, ReplyDelta):
            stdout.write(event.text)
        elif isinstance(event, ToolStarted):
            stdout.write(
                _dim(f"[{event.name}({', '.join(f'{k}={v!r}' for k, v in event.arguments.items())})] ", tty)
            )
        elif isinstance(event, ToolEnded):
            stdout.write(_dim(f"[{event.name}: {'ok' if event.ok else 'failed'} in {event.ms} ms] ", tty))
        elif isinstance(event, AudioStart):
            rate = event.sample_rate_hz
        elif isinstance(event, AudioData) and not text_only:
            audio.extend(event.pcm)
        elif isinstance(event, TurnFinished):
            result = event.result
            if result.error_code is not None:
                # In place of the reply a provider error would leave empty: what went wrong.
                nonlocal failed
                failed += 1
                stdout.write(
                    f"{' ' if result.text else ''}[turn failed at the {result.stage}: {result.reason}]"
                )
            timings = result.timings
            note = f"  ({timings.total_ms} ms"
            if timings.model_first_text_ms is not None:
                note += f", first text {timings.model_first_text_ms} ms"
            if timings.first_audio_sent_ms is not None and not text_only:
                note += f", first audio {timings.first_audio_sent_ms} ms"
            stdout.write(_dim(note + ")", tty) + "\n")
        stdout.flush()

    runtime.add_listener(show)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(runtime.run, session, session.events)
        await runtime.ready.wait()
        await runtime.wait_idle()  # the greeting, if any
        while True:
            line = await trio.to_thread.run_sync(stdin.readline)
            if not line:
                break
            if line.strip():
                await runtime.take_turn(line.strip())
        nursery.cancel_scope.cancel()
    if not text_only and wav_path is not None and audio:
        write_wav(wav_path, bytes(audio), rate)
        stdout.write(_dim(f"speech written to {wav_path}", tty) + "\n")
    return 1 if failed else 0


def _without_voice(agent: Agent) -> Agent:
    import copy

    quiet = copy.copy(agent)
    quiet.tts = None
    quiet.skills = [copy.copy(s) for s in agent.skills]
    for skill in quiet.skills:
        skill.tts = None
    return quiet
