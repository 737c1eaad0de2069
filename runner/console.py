"""An agent in the terminal: ``runner console`` (no server) and the terminal side of ``runner dev``.

Lines from stdin are the caller's turns; each reply prints as it streams, with tool calls
and timings dimmed; the greeting prints too. On a terminal a ``you>`` prompt asks for each
line; ``/help`` lists the commands and ``/quit`` ends. Without ``--text`` the agent's
speech plays through ``sounddevice`` and the microphone is heard, when the machine has
audio devices; otherwise one line on stderr says why and the console stays text only.
``--wav`` also writes the replies' speech to a file. A console call keeps no record.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TextIO

import trio

from .agent import Agent, AgentRuntime, choose_experiments, without_voice
from .calls import CallContext
from .logs import bind_session
from .transports.loopback import LoopbackCaller, LoopbackSession
from .voice.audio import write_wav
from .voice.events import (
    AudioData,
    AudioStart,
    Heard,
    ReplyDelta,
    SpeechFailed,
    ToolEnded,
    ToolStarted,
    TurnEvent,
    TurnFinished,
    TurnResult,
)

PROMPT = "you> "
HELP = """\
Type what you would say and press Enter: the agent answers.
  /help   this list
  /quit   end (Ctrl-D does too)"""
MIC_RATE_HZ = 16_000
MIC_FRAME_MS = 20


def _dim(text: str, tty: bool) -> str:
    return f"\x1b[2m{text}\x1b[0m" if tty else text


class Transcript:
    """Prints what a call's turns do as they happen: one line per reply, timings dimmed.

    Args:
        stdout: Where the conversation goes.
        speech: Audio is spoken (its first-audio timing is shown).
        audio: Called with each piece of the agent's speech (PCM, its rate).
    """

    def __init__(
        self,
        stdout: TextIO,
        *,
        speech: bool,
        audio: Callable[[bytes, int], Awaitable[None]] | None = None,
    ) -> None:
        self.stdout = stdout
        self.tty = stdout.isatty()
        self.speech = speech
        self.audio = audio
        self.rate_hz = 0
        self.speech_bytes = bytearray()
        self.turns = 0
        self.failed = 0
        # The conversation line written so far, and whether a log line cut it off since.
        self._line = ""
        self._cut = False

    def _write(self, text: str) -> None:
        if self._cut and self._line:
            self.stdout.write(self._line)  # the line again, whole, below what cut it
        self._cut = False
        self.stdout.write(text)
        self._line = (self._line + text).rpartition("\n")[2]

    def end_line(self) -> None:
        """End the conversation line being written (if any) before something else prints."""
        if self._line and not self._cut:
            self.stdout.write("\n")
            self.stdout.flush()
            self._cut = True

    @contextlib.contextmanager
    def keeping_lines_whole(self) -> Iterator[None]:
        """While open, a log line (on the root logger's handlers, which share the terminal)
        first ends the conversation line it would land in the middle of; the conversation
        line is shown again, whole, when it goes on."""
        guard = _EndsTheLine(self)
        handlers = list(logging.getLogger().handlers)
        for handler in handlers:
            handler.addFilter(guard)
        try:
            yield
        finally:
            for handler in handlers:
                handler.removeFilter(guard)

    async def show(self, event: TurnEvent) -> None:
        """Print what of a turn's events a person at the terminal reads; keep its speech."""
        match event:
            case Heard(text=text):
                self._write(_dim(f"(heard) {text}", self.tty) + "\n")
            case ReplyDelta(text=text):
                self._write(text)
            case ToolStarted(name=name, arguments=arguments):
                shown = ", ".join(f"{k}={v!r}" for k, v in arguments.items())
                self._write(_dim(f"[{name}({shown})] ", self.tty))
            case ToolEnded(name=name, ok=ok, error=error, ms=ms):
                outcome = "ok" if ok else f"failed: {error}"
                self._write(_dim(f"[{name}: {outcome} in {ms} ms] ", self.tty))
            case SpeechFailed(code=code):
                self._write(_dim(f"[speech failed: {code}] ", self.tty))
            case AudioStart(sample_rate_hz=rate_hz):
                self.rate_hz = rate_hz
            case AudioData(pcm=pcm):
                self.speech_bytes.extend(pcm)
                if self.audio is not None:
                    await self.audio(pcm, self.rate_hz)
            case TurnFinished(result=result):
                self._finished(result)
        self.stdout.flush()

    def _finished(self, result: TurnResult) -> None:
        if result.error_code is not None:
            # In place of the reply a provider error would leave empty: what went wrong.
            self.failed += 1
            self._write(f"{' ' if result.text else ''}[turn failed at the {result.stage}: {result.reason}]")
        timings = result.timings
        note = f"  ({timings.total_ms} ms"
        if timings.model_first_text_ms is not None:
            note += f", first text {timings.model_first_text_ms} ms"
        if timings.first_audio_sent_ms is not None and self.speech:
            note += f", first audio {timings.first_audio_sent_ms} ms"
        self._write(_dim(note + ")", self.tty) + "\n")
        self.turns += 1


class _EndsTheLine(logging.Filter):
    def __init__(self, transcript: Transcript) -> None:
        super().__init__()
        self.transcript = transcript

    def filter(self, record: logging.LogRecord) -> bool:
        self.transcript.end_line()
        return True


async def read_turns(
    stdin: TextIO,
    stdout: TextIO,
    say: Callable[[str], Awaitable[None]],
    *,
    prompt: bool,
) -> None:
    """Read lines until end of input or ``/quit``; each other line is a turn, said with ``say``.

    Args:
        stdin: The lines.
        stdout: Where prompts and command answers go.
        say: Takes one turn's text; returns when the console may ask for the next.
        prompt: Write the ``you>`` prompt before each line (a person at a terminal).
    """
    while True:
        if prompt:
            stdout.write(PROMPT)
            stdout.flush()
        line = await trio.to_thread.run_sync(stdin.readline, abandon_on_cancel=True)
        if not line:
            if prompt:
                stdout.write("\n")
            return
        text = line.strip()
        if not text:
            continue
        if text in ("/quit", "/exit"):
            return
        if text == "/help":
            stdout.write(HELP + "\n")
            continue
        if text.startswith("/"):
            stdout.write(f"unknown command {text.split()[0]}; /help lists them\n")
            continue
        await say(text)


def open_audio() -> tuple[Any, str | None]:
    """``sounddevice`` when this machine has an input and an output device, else why not."""
    try:
        import sounddevice  # type: ignore[import-untyped]  # an optional extra that ships no types
    except (ImportError, OSError) as exc:
        return None, f"no audio: sounddevice cannot load ({exc})"
    devices = list(sounddevice.query_devices())
    if not any(d["max_input_channels"] > 0 for d in devices) or not any(
        d["max_output_channels"] > 0 for d in devices
    ):
        return None, "no audio: this machine has no microphone or no speaker"
    try:
        sounddevice.check_input_settings(channels=1, dtype="int16", samplerate=MIC_RATE_HZ)
        sounddevice.query_devices(kind="output")
    except Exception as exc:  # noqa: BLE001 - PortAudio reports an unusable device in several ways
        return None, f"no audio: {exc}"
    return sounddevice, None


class _Sound:
    """The sound card: the agent's speech out, the microphone in (``sounddevice``, PortAudio)."""

    def __init__(self, sounddevice: Any, session: LoopbackSession) -> None:
        self.sounddevice = sounddevice
        self.session = session
        self.idle = trio.Event()
        self.idle.set()

    async def serve(self) -> None:
        """Play the agent's speech and send the microphone to it, until cancelled."""
        caller = LoopbackCaller(self.session)
        token = trio.lowlevel.current_trio_token()

        def heard(data: Any, frames: int, time: Any, status: Any) -> None:
            # PortAudio's own thread: hand the samples to the call's loop.
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(caller.send_audio, bytes(data), MIC_RATE_HZ)

        microphone = self.sounddevice.RawInputStream(
            samplerate=MIC_RATE_HZ,
            channels=1,
            dtype="int16",
            blocksize=MIC_RATE_HZ * MIC_FRAME_MS // 1000,
            callback=heard,
        )
        microphone.start()
        speaker: Any = None
        try:
            async for first in caller.audio:
                # A new Event only once the last was set: wait_played may be waiting on this one.
                if self.idle.is_set():
                    self.idle = trio.Event()
                batch = [first, *_ready(caller)]
                if None in batch:
                    # The caller talked over the agent: what was queued before the clear is dropped.
                    batch = batch[len(batch) - batch[::-1].index(None) :]
                    if speaker is not None:
                        speaker.abort()
                        speaker.start()
                rate = self.session.audio_rate_hz
                for pcm in batch:
                    if speaker is None or speaker.samplerate != rate:
                        if speaker is not None:
                            speaker.close()
                        speaker = self.sounddevice.RawOutputStream(samplerate=rate, channels=1, dtype="int16")
                        speaker.start()
                    await trio.to_thread.run_sync(speaker.write, pcm)
                if not self.session.audio_out.statistics().current_buffer_used:
                    self.idle.set()
        finally:
            microphone.close()
            if speaker is not None:
                speaker.close()

    async def wait_played(self, limit_s: float = 60.0) -> None:
        """Wait until what the agent said has been played (at most ``limit_s``)."""
        with trio.move_on_after(limit_s):
            for _ in range(100_000):
                await self.idle.wait()
                if not self.session.audio_out.statistics().current_buffer_used:
                    return
                await trio.lowlevel.checkpoint()  # the speaker's task takes what is left first


def _ready(caller: LoopbackCaller) -> list[bytes | None]:
    out: list[bytes | None] = []
    for _ in range(100_000):
        try:
            out.append(caller.audio.receive_nowait())
        except (trio.WouldBlock, trio.EndOfChannel):
            break
    return out


async def run_console(
    agent: Agent,
    *,
    text_only: bool,
    wav_path: Path | None,
    stdin: TextIO = sys.stdin,
    stdout: TextIO = sys.stdout,
    stderr: TextIO = sys.stderr,
) -> int:
    """Converse until end of input or ``/quit``; return the exit code (1 if a turn failed)."""
    session_id = "console"
    bind_session(session_id)
    call = CallContext(
        session_id=session_id,
        direction="inbound",
        client={},
        experiments=choose_experiments(agent, session_id, {}, None),
    )
    sounddevice = None
    if not text_only:
        sounddevice, why_not = open_audio()
        if why_not is not None:
            also = "" if wav_path is None else f" (speech also to {wav_path})"
            print(f"runner: {why_not}; text only{also}", file=stderr)
    speaking = sounddevice is not None or wav_path is not None
    if not speaking:
        # Nobody hears it: no need to synthesize speech.
        agent = without_voice(agent)
    runtime = AgentRuntime(agent, call, None, host_connected=False)
    session = LoopbackSession("app")
    caller = LoopbackCaller(session)
    transcript = Transcript(stdout, speech=speaking)
    runtime.add_listener(transcript.show)
    prompt = stdin.isatty() and stdout.isatty()

    async def say(text: str) -> None:
        await runtime.take_turn(text)

    # On a terminal the log (stderr) and the conversation (stdout) share the screen.
    whole = transcript.keeping_lines_whole() if stdout.isatty() else contextlib.nullcontext()
    with whole:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(runtime.run, session, session.events)
            sound = _Sound(sounddevice, session) if sounddevice is not None else None
            if sound is not None:
                nursery.start_soon(sound.serve)
            else:
                nursery.start_soon(_drain, caller)
            await runtime.ready.wait()
            await runtime.wait_idle()  # the greeting, if any
            if prompt:
                stdout.write(_dim("(/help lists the commands)", True) + "\n")
            await read_turns(stdin, stdout, say, prompt=prompt)
            await runtime.wait_idle()
            if sound is not None:
                await sound.wait_played()  # the last reply is heard to its end
            nursery.cancel_scope.cancel()
    if wav_path is not None and transcript.speech_bytes:
        write_wav(wav_path, bytes(transcript.speech_bytes), transcript.rate_hz)
        stdout.write(_dim(f"speech written to {wav_path}", transcript.tty) + "\n")
    return 1 if transcript.failed else 0


async def _drain(caller: LoopbackCaller) -> None:
    # With nobody listening, the speech queue is read and dropped, so it never grows.
    async for _ in caller.audio:
        pass
