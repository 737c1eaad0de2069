"""Faster replies: decode at the caller's pauses, and ask the model before the turn is sure.

At a short pause in the caller's speech the listener hands over the utterance so far; a
:class:`Speculation` transcribes it at once. When that transcript is ready and the caller
has not gone on, the runtime starts the model's reply (:class:`PrefetchedReply`, what
livekit-agents calls preemptive generation) while the end-of-turn silence is still running.
If the caller goes on, both are cancelled and nothing of them is said, journaled or kept.
If the turn ends, the turn's model (:class:`Preempted`) replays what the request has
streamed so far and follows it live; a turn whose messages differ from the ones the request
was made with (the history moved meanwhile) asks the model afresh. The reply's first
sentence is synthesized early too, as soon as the request has written it: the turn's voice
(:class:`PreSpoken`) replays that audio when the turn says exactly that sentence.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import aclosing
from typing import Generic, TypeVar

import trio

from ..providers import ChatMessage, ChatModel, LLMEvent, ProviderError, Synthesizer, TextDelta, ToolSpec
from ..telemetry import mark
from .chunker import SentenceChunker
from .listener import Utterance

__all__ = ["PreSpoken", "Preempted", "PrefetchedReply", "Speculation", "early_messages"]

T = TypeVar("T")


class _Tape(Generic[T]):
    """What a producer wrote so far, kept for one reader that replays it and follows it live."""

    def __init__(self) -> None:
        self.items: list[T] = []
        self.error: ProviderError | None = None
        self.finished = False
        self._changed = trio.Event()

    def wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def append(self, item: T) -> None:
        self.items.append(item)
        self.wake()

    def finish(self, error: ProviderError | None = None) -> None:
        if not self.finished:
            self.error = error
            self.finished = True
            self.wake()

    async def replay(self, stopped: Callable[[], bool] = lambda: False) -> AsyncIterator[T]:
        """The items so far, then the rest as they come; ``stopped``: the producer was cancelled.

        Raises:
            ProviderError: what the producer failed with, or ``provider_failed`` once stopped.
        """
        sent = 0
        while True:
            while sent < len(self.items):
                sent += 1
                yield self.items[sent - 1]
            if stopped():
                raise ProviderError("provider_failed", "the early request was cancelled")
            if self.finished:
                if self.error is not None:
                    raise self.error
                return
            await self._changed.wait()


class EarlySpeech:
    """The audio of a reply's first sentence, synthesized before the turn asked for it."""

    def __init__(self, tts: Synthesizer, text: str) -> None:
        self.tts = tts
        self.text = text
        self._pcm = _Tape[bytes]()
        self.taken = False

    async def run(self) -> None:
        error = None
        try:
            async with aclosing(self.tts.synthesize(self.text)) as audio:  # type: ignore[type-var]  # the Synthesizer Protocol promises an AsyncIterator; every provider's synthesize is an async generator, which aclosing needs
                async for pcm in audio:
                    if not self._pcm.items:
                        mark("tts_first_audio_early")
                    self._pcm.append(pcm)
        except ProviderError as exc:
            error = exc
        finally:
            self._pcm.finish(error)

    def replay(self) -> AsyncIterator[bytes]:
        """The audio so far, then the rest as it comes."""
        self.taken = True
        return self._pcm.replay()


class PrefetchedReply:
    """A model request started before the turn ended; its events are kept until taken.

    Run :meth:`run` in a nursery; :meth:`cancel` closes the request.
    """

    def __init__(
        self,
        llm: ChatModel,
        messages: Sequence[ChatMessage],
        tools: Sequence[ToolSpec],
        tts: Synthesizer | None = None,
    ) -> None:
        self.llm = llm
        self.messages = tuple(messages)
        self.tools = tuple(tools)
        self.tts = tts
        #: The first sentence's audio, once the request has written that sentence (with ``tts``).
        self.speech: EarlySpeech | None = None
        self._events = _Tape[LLMEvent]()
        self._cancelled = False
        self._scope = trio.CancelScope()
        self.taken = False

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def matches(self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> bool:
        """Whether a turn asking with these would have asked exactly this."""
        return not self._cancelled and tuple(messages) == self.messages and tuple(tools) == self.tools

    def cancel(self) -> None:
        """Stop the request (if it still runs); a later turn asks the model afresh."""
        self._cancelled = True
        self._scope.cancel()
        self._events.wake()

    async def run(self) -> None:
        """Stream the reply into memory until it ends, fails or is cancelled; and synthesize
        its first sentence (as the turn engine would cut it) as soon as it is written."""
        mark("model_asked_early")
        chunker = SentenceChunker() if self.tts is not None else None
        written = False
        with self._scope:
            async with trio.open_nursery() as nursery:
                try:
                    async with aclosing(self.llm.stream(self.messages, self.tools)) as events:  # type: ignore[type-var]  # the ChatModel Protocol promises an AsyncIterator; every provider's stream is an async generator, which aclosing needs
                        async for event in events:
                            if isinstance(event, TextDelta):
                                if not written:
                                    written = True
                                    mark("model_first_text_early")
                                if chunker is not None:
                                    self._speak_early(chunker.feed(event.text), nursery)
                            elif chunker is not None:
                                # A tool call or the usage: the round's words are all written.
                                self._speak_early(chunker.flush(), nursery)
                            self._events.append(event)
                    if chunker is not None:
                        self._speak_early(chunker.flush(), nursery)
                except ProviderError as exc:
                    self._events.finish(exc)
                # Finished before its early speech is: a turn reads the rest without waiting.
                self._events.finish()
        self._events.finish()

    def _speak_early(self, pieces: list[str], nursery: trio.Nursery) -> None:
        if self.speech is None and pieces and self.tts is not None:
            self.speech = EarlySpeech(self.tts, pieces[0])
            nursery.start_soon(self.speech.run)

    async def replay(self) -> AsyncIterator[LLMEvent]:
        """What the request streamed so far, then the rest as it comes."""
        self.taken = True
        try:
            async for event in self._events.replay(lambda: self._cancelled):
                yield event
        finally:
            # A turn that stops reading (cancelled, barged in) stops the request too.
            if not self._events.finished:
                self.cancel()


class Preempted:
    """The turn's model: the prefetched reply for the request it was made for, else ``llm``."""

    def __init__(self, llm: ChatModel, prefetched: PrefetchedReply) -> None:
        self.provider = llm.provider
        self.model = llm.model
        self._llm = llm
        self._prefetched = prefetched

    def stream(
        self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec] = ()
    ) -> AsyncIterator[LLMEvent]:
        prefetched = self._prefetched
        if not prefetched.taken and prefetched.matches(messages, tools):
            mark("early_reply_taken")
            return prefetched.replay()
        if not prefetched.taken:
            prefetched.cancel()
        return self._llm.stream(messages, tools)


class PreSpoken:
    """The turn's voice: the early audio for the sentence it was made for, else ``tts``."""

    def __init__(self, tts: Synthesizer, prefetched: PrefetchedReply) -> None:
        self.provider = tts.provider
        self.voice = tts.voice
        self.sample_rate_hz = tts.sample_rate_hz
        self._tts = tts
        self._prefetched = prefetched

    def synthesize(self, text: str) -> AsyncIterator[bytes]:
        prefetched = self._prefetched
        speech = prefetched.speech
        # Only the turn that took the early reply says its early audio (a turn that asked
        # afresh cancelled it, and the audio may be cut short).
        if (
            speech is not None
            and prefetched.taken
            and not prefetched.cancelled
            and not speech.taken
            and speech.tts is self._tts
            and speech.text == text
        ):
            mark("early_audio_taken")
            return speech.replay()
        return self._tts.synthesize(text)


class Speculation:
    """The transcript of an utterance so far, decoded at a pause, and maybe an early reply.

    Args:
        seconds: How much audio was decoded.
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.utterance: Utterance | None = None
        self.error: Exception | None = None
        self.prefetched: PrefetchedReply | None = None
        self._done = trio.Event()
        self._cancelled = False

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def cancel(self) -> None:
        """The caller went on: drop the transcript and stop the early reply."""
        self._cancelled = True
        if self.prefetched is not None:
            self.prefetched.cancel()

    async def run(
        self,
        transcribe: Callable[[], Awaitable[Utterance]],
        prefetch: Callable[[str], PrefetchedReply | None],
        nursery: trio.Nursery,
    ) -> None:
        """Transcribe; then, unless cancelled meanwhile, start the early reply in ``nursery``."""
        try:
            self.utterance = await transcribe()
        except Exception as exc:  # noqa: BLE001 - kept, and raised again by wait()
            self.error = exc
        finally:
            self._done.set()
        if self._cancelled or self.utterance is None or not self.utterance.text:
            return
        self.prefetched = prefetch(self.utterance.text)
        if self.prefetched is not None:
            nursery.start_soon(self.prefetched.run)

    async def wait(self) -> Utterance:
        """The transcript, once decoded.

        Raises:
            Exception: what the recognizer raised.
        """
        await self._done.wait()
        if self.utterance is None:
            assert self.error is not None
            raise self.error
        return self.utterance


def early_messages(instructions: str, history: Sequence[ChatMessage], text: str) -> list[ChatMessage]:
    """The first model request of a turn whose person said ``text`` (as the turn engine asks it)."""
    return [
        ChatMessage(role="system", content=instructions),
        *history,
        ChatMessage(role="user", content=text),
    ]
