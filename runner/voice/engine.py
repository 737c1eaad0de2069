"""The turn engine: words in, a streamed reply out, spoken sentence by sentence.

One turn: the model streams its reply; tool calls run in bounded rounds; the reply is
cut into sentences as it arrives and each sentence is synthesized while later ones are
still being written, so the first sentence is audio early. Everything the turn does is
reported as :data:`~.events.TurnEvent` values to one ``emit`` callback, which each transport
maps to its own wire (WebSocket frames, a LiveKit track, a terminal).
"""

from __future__ import annotations

import json
import math
import secrets
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from contextlib import aclosing
from typing import Any

import attrs
import trio

from ..providers import (
    ChatMessage,
    ChatModel,
    ProviderError,
    Synthesizer,
    TextDelta,
    ThoughtDelta,
    ToolCall,
    ToolSpec,
    Usage,
    reports_thoughts,
)
from ..telemetry import mark, stage
from .chunker import SentenceChunker
from .events import (
    AudioData,
    AudioEnd,
    AudioStart,
    Heard,
    Muted,
    ReplyChunk,
    ReplyDelta,
    SpeechFailed,
    Thought,
    ToolEnded,
    ToolRecord,
    ToolStarted,
    TurnEvent,
    TurnFinished,
    TurnResult,
    TurnStarted,
    TurnTimings,
    UsageReported,
)

Emit = Callable[[TurnEvent], Awaitable[None]]
# Hears a spoken turn inside it: returns the transcript and how many seconds of audio it was.
Hear = Callable[[], Awaitable[tuple[str, float]]]


@attrs.frozen(kw_only=True)
class ToolOutcome:
    """What running a tool gave: ``result`` when ``ok``, else ``error``."""

    ok: bool
    result: Any = None
    error: str | None = None


@attrs.frozen(kw_only=True)
class TurnPlan:
    """What one turn works with, fixed when it starts (a new voice waits for the next reply)."""

    llm: ChatModel
    tts: Synthesizer | None
    instructions: Callable[[], str]
    tools: Callable[[], Sequence[ToolSpec]]
    run_tool: Callable[[ToolCall], Awaitable[ToolOutcome]]
    max_tool_rounds: int = 4
    # The line to say while a call runs (a tool's ``filler``), or None.
    filler: Callable[[ToolCall], str | None] = lambda call: None


def new_turn_id() -> str:
    return "turn_" + secrets.token_hex(8)


class Turn:
    """One running turn. :meth:`cancel` ends it interrupted; :meth:`mute` stops its voice."""

    def __init__(
        self, plan: TurnPlan, history: list[ChatMessage], emit: Emit, *, turn_id: str | None = None
    ) -> None:
        self.id = turn_id or new_turn_id()
        self._plan = plan
        self._history = history
        self._emit = emit
        self._scope = trio.CancelScope()
        self._muted = False
        self._reason: str | None = None
        self.text = ""
        self._chunks_spoken = 0
        self._tool_calls: list[ToolRecord] = []
        self._usage: list[Usage] = []
        self._started = 0.0
        self._first_text: float | None = None
        self._first_audio: float | None = None
        self._thoughts = False
        self._after_filler = False
        self._chunks_cut = 0
        self._stage = "model"

    def cancel(self, reason: str = "cancelled") -> None:
        """Stop generating and speaking; the turn ends interrupted with what was said so far."""
        if self._reason is None:
            self._reason = reason
        self._scope.cancel()

    def mute(self) -> None:
        """Stop speaking but let the turn finish; later sentences are never synthesized."""
        self._muted = True

    @property
    def cancel_reason(self) -> str | None:
        """Why the turn was cancelled (or failed), once it was; ``None`` while it runs on."""
        return self._reason

    def _ms(self, at: float | None) -> int | None:
        return None if at is None else int((at - self._started) * 1000)

    async def run(
        self,
        user: str | None,
        *,
        scripted: str | None = None,
        heard: str | None = None,
        heard_seconds: float | None = None,
        hear: Hear | None = None,
        run_first: Sequence[ToolCall] = (),
        thoughts: bool = False,
    ) -> TurnResult:
        """Run the turn to its end and return how it ended.

        Args:
            user: The person's words (``None`` for an opening line).
            scripted: Speak this text as written instead of asking the model.
            heard: For a spoken turn, the transcript (also in ``user``).
            heard_seconds: How much audio it was.
            hear: For a spoken turn whose words are not known yet: called once the turn
                started, its transcript becomes the person's words (reported as
                :class:`Heard`); a cancel or a provider error during it ends the turn.
            run_first: Tool calls to run before the model is asked (a confirmed tool).
            thoughts: Ask the model for its thinking summaries, reported as :class:`Thought`
                in the order the model writes them (only a provider that reports thoughts,
                see :class:`~runner.providers.ChatModel`, is asked; the others run as usual).
        """
        self._thoughts = thoughts
        self._started = time.monotonic()
        mark("turn_started")
        await self._emit(TurnStarted(turn=self.id))
        if user is not None:
            self._history.append(ChatMessage(role="user", content=user))
        error_code: str | None = None
        with self._scope:
            try:
                if hear is not None:
                    self._stage = "stt"
                    heard, heard_seconds = await hear()
                    self._history.append(ChatMessage(role="user", content=heard))
                    await self._emit(Heard(turn=self.id, text=heard, audio_seconds=heard_seconds))
                if run_first:
                    self._history.append(
                        ChatMessage(role="assistant", content="", tool_calls=tuple(run_first))
                    )
                    for call in run_first:
                        await self._run_tool(call, 0)
                self._stage = "model"
                await self._produce(scripted)
            except ProviderError as exc:
                error_code = exc.code
                self._reason = f"{exc.code}: {exc}"
        interrupted = self._reason is not None
        if self.text:
            self._history.append(ChatMessage(role="assistant", content=self.text))
        result = TurnResult(
            turn=self.id,
            text=self.text,
            interrupted=interrupted,
            reason=self._reason,
            error_code=error_code,
            chunks_spoken=self._chunks_spoken,
            tool_calls=tuple(self._tool_calls),
            usage=tuple(self._usage),
            timings=TurnTimings(
                model_first_text_ms=self._ms(self._first_text),
                first_audio_sent_ms=self._ms(self._first_audio),
                total_ms=self._ms(time.monotonic()) or 0,
            ),
            heard=heard,
            heard_seconds=heard_seconds,
            stage=self._stage if error_code is not None else None,
        )
        with trio.CancelScope(shield=True):
            await self._emit(TurnFinished(result=result))
        return result

    async def _produce(self, scripted: str | None) -> None:
        send_chunk, receive_chunk = trio.open_memory_channel[tuple[int, str]](math.inf)
        failure: ProviderError | None = None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._speak, receive_chunk)
            async with send_chunk:
                chunker = SentenceChunker()
                try:
                    if scripted is not None:
                        await self._text(scripted, chunker, send_chunk)
                    else:
                        await self._generate(chunker, send_chunk)
                except ProviderError as exc:
                    # The model failed: stop speaking too, and end the turn interrupted.
                    failure = exc
                    nursery.cancel_scope.cancel()
                else:
                    await self._flush(chunker, send_chunk)
        if failure is not None:
            raise failure

    async def _text(
        self, text: str, chunker: SentenceChunker, send_chunk: trio.MemorySendChannel[tuple[int, str]]
    ) -> None:
        if self._first_text is None:
            self._first_text = time.monotonic()
        if self._after_filler and text:
            # The model's next words start a new sentence after the filler line.
            self._after_filler = False
            if not text[0].isspace():
                text = " " + text
        self.text += text
        await self._emit(ReplyDelta(turn=self.id, text=text))
        for piece in chunker.feed(text):
            await self._chunk(piece, send_chunk)

    async def _flush(
        self, chunker: SentenceChunker, send_chunk: trio.MemorySendChannel[tuple[int, str]]
    ) -> None:
        """Send what the chunker still holds, though its sentence is unfinished."""
        for piece in chunker.flush():
            await self._chunk(piece, send_chunk)

    async def _chunk(self, piece: str, send_chunk: trio.MemorySendChannel[tuple[int, str]]) -> None:
        # Reported as it is cut, not when its turn to be spoken comes: a piece's text is
        # never held behind the audio of the pieces before it (or behind the usage).
        chunk = self._chunks_cut
        self._chunks_cut += 1
        send_chunk.send_nowait((chunk, piece))
        await self._emit(ReplyChunk(turn=self.id, chunk=chunk, text=piece))

    async def _generate(
        self, chunker: SentenceChunker, send_chunk: trio.MemorySendChannel[tuple[int, str]]
    ) -> None:
        plan = self._plan
        for round_ in range(plan.max_tool_rounds + 1):
            # The last round offers no tools, so the model must answer in words.
            tools = plan.tools() if round_ < plan.max_tool_rounds else ()
            messages = [ChatMessage(role="system", content=plan.instructions()), *self._history]
            calls: list[ToolCall] = []
            usages: list[UsageReported] = []
            began = time.monotonic()
            round_text = ""
            async with aclosing(_stream(plan.llm, messages, tools, thoughts=self._thoughts)) as events:
                async for event in events:
                    if isinstance(event, ThoughtDelta):
                        # Reported only: never in the reply, the history or what is spoken.
                        if self._thoughts and event.text:
                            await self._emit(Thought(turn=self.id, text=event.text))
                    elif isinstance(event, TextDelta):
                        round_text += event.text
                        await self._text(event.text, chunker, send_chunk)
                    elif isinstance(event, ToolCall):
                        calls.append(event)
                    elif isinstance(event, Usage):
                        self._usage.append(event)
                        usages.append(
                            UsageReported(
                                turn=self.id, usage=event, generation_seconds=time.monotonic() - began
                            )
                        )
            # The round's words are all written: its last piece is cut before its usage is
            # reported (seed 002's order: text chunks, then usage, then the round's tools).
            await self._flush(chunker, send_chunk)
            for usage in usages:
                await self._emit(usage)
            if not calls or not tools:
                # A model that calls a tool it was not offered gets no more rounds.
                return
            self._history.append(ChatMessage(role="assistant", content=round_text, tool_calls=tuple(calls)))
            for call in calls:
                await self._run_tool(call, round_, speak=(chunker, send_chunk))

    async def _run_tool(
        self,
        call: ToolCall,
        round_: int,
        *,
        speak: tuple[SentenceChunker, trio.MemorySendChannel[tuple[int, str]]] | None = None,
    ) -> None:
        arguments = dict(call.arguments)
        await self._emit(ToolStarted(turn=self.id, call_id=call.id, name=call.name, arguments=arguments))
        filler = self._plan.filler(call)
        if filler and speak is not None:
            await self._say_filler(filler, *speak)
        began = time.monotonic()
        outcome = await self._plan.run_tool(call)
        ms = int((time.monotonic() - began) * 1000)
        record = ToolRecord(
            call_id=call.id,
            name=call.name,
            arguments=arguments,
            result=outcome.result,
            ok=outcome.ok,
            error=outcome.error,
            ms=ms,
            round=round_,
        )
        self._tool_calls.append(record)
        await self._emit(
            ToolEnded(
                turn=self.id,
                call_id=call.id,
                name=call.name,
                ok=outcome.ok,
                ms=ms,
                result=outcome.result,
                error=outcome.error,
            )
        )
        content = _tool_content(outcome)
        self._history.append(ChatMessage(role="tool", content=content, tool_call_id=call.id))

    async def _say_filler(
        self, line: str, chunker: SentenceChunker, send_chunk: trio.MemorySendChannel[tuple[int, str]]
    ) -> None:
        """Say ``line`` now, while the tool runs: it is part of the reply, as the caller hears it."""
        # Whatever the model wrote before calling the tool is said first, in order.
        await self._flush(chunker, send_chunk)
        text = line if not self.text or self.text[-1].isspace() else " " + line
        self.text += text
        self._after_filler = True
        await self._emit(ReplyDelta(turn=self.id, text=text))
        await self._chunk(line, send_chunk)

    async def _speak(self, chunks: trio.MemoryReceiveChannel[tuple[int, str]]) -> None:
        async for chunk, piece in chunks:
            tts = self._plan.tts
            if tts is None or self._muted:
                continue
            await self._say(tts, chunk, piece)
        if self._muted:
            await self._emit(Muted(turn=self.id))

    async def _say(self, tts: Synthesizer, chunk: int, piece: str) -> None:
        sent = 0
        opened = False
        try:
            async with aclosing(_synthesize(tts, piece)) as audio:
                async for pcm in audio:
                    # A mute stops the voice between two pieces of audio (tens of ms).
                    if self._muted:
                        break
                    if not opened:
                        opened = True
                        await self._emit(
                            AudioStart(turn=self.id, chunk=chunk, sample_rate_hz=tts.sample_rate_hz)
                        )
                    if self._first_audio is None:
                        self._first_audio = time.monotonic()
                        mark("tts_first_audio")
                    sent += len(pcm)
                    await self._emit(AudioData(turn=self.id, chunk=chunk, pcm=pcm))
        except ProviderError as exc:
            await self._emit(SpeechFailed(turn=self.id, chunk=chunk, code=exc.code, message=str(exc)))
        finally:
            if opened:
                with trio.CancelScope(shield=True):
                    await self._emit(
                        AudioEnd(
                            turn=self.id, chunk=chunk, bytes=sent, audio_seconds=sent / 2 / tts.sample_rate_hz
                        )
                    )
                if sent:
                    self._chunks_spoken += 1


def _tool_content(outcome: ToolOutcome) -> str:
    if not outcome.ok:
        return json.dumps({"error": outcome.error})
    if isinstance(outcome.result, str):
        return outcome.result
    return json.dumps(outcome.result, default=str)


async def _stream(
    llm: ChatModel, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec], *, thoughts: bool = False
) -> AsyncGenerator[Any, None]:
    # One place owns the provider's iterator, so a cancelled turn always closes it.
    # ``thoughts`` goes only to a provider that takes it; the LLM protocol stays as it is.
    with stage("llm", llm) as request:
        if thoughts and reports_thoughts(llm):
            stream = llm.stream(messages, tools, thoughts=True)  # type: ignore[call-arg]  # reports_thoughts() just checked that this provider takes thoughts=; the ChatModel Protocol does not
        else:
            stream = llm.stream(messages, tools)
        async with aclosing(stream) as events:  # type: ignore[type-var]  # the ChatModel Protocol promises an AsyncIterator; every provider's stream is an async generator, which aclosing needs
            first = True
            async for event in events:
                if isinstance(event, TextDelta) and first:
                    first = False
                    request.first()
                    mark("model_first_text")
                yield event


async def _synthesize(tts: Synthesizer, text: str) -> AsyncGenerator[bytes, None]:
    with stage("tts", tts) as request:
        async with aclosing(tts.synthesize(text)) as audio:  # type: ignore[type-var]  # the Synthesizer Protocol promises an AsyncIterator; every provider's synthesize is an async generator, which aclosing needs
            async for pcm in audio:
                request.first()
                yield pcm
