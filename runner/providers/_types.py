"""The shapes every provider speaks: what goes into a model, what comes out, and the errors.

Pure data: no Trio, no HTTP. A provider module (``openai``, ``anthropic``, ``espeak``, ...)
turns these into its service's wire format and back.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from types import TracebackType
from typing import Any, Literal, Protocol, runtime_checkable

import attrs

Role = Literal["system", "user", "assistant", "tool"]


@attrs.frozen(kw_only=True)
class ToolCall:
    """A call the model asked for: ``arguments`` is the decoded JSON object."""

    id: str
    name: str
    arguments: Mapping[str, Any]


@attrs.frozen(kw_only=True)
class ChatMessage:
    """One message of the conversation as the model sees it.

    ``tool_calls`` is set on an assistant message that called tools; ``tool_call_id``
    on the ``tool`` message that answers one of them.
    """

    role: Role
    content: str = ""
    tool_calls: Sequence[ToolCall] = ()
    tool_call_id: str | None = None


@attrs.frozen(kw_only=True)
class ToolSpec:
    """A tool offered to the model: ``parameters`` is a JSON Schema object."""

    name: str
    description: str
    parameters: Mapping[str, Any] = attrs.field(factory=lambda: {"type": "object", "properties": {}})


@attrs.frozen(kw_only=True)
class TextDelta:
    """A piece of the reply, as the model writes it."""

    text: str


@attrs.frozen(kw_only=True)
class ThoughtDelta:
    """A piece of the model's thinking summary: never part of the reply.

    Only a provider that reports its thinking (``reports_thoughts``, see :class:`ChatModel`) and
    was asked for it (``stream(..., thoughts=True)``) yields these, before the text they
    led to.
    """

    text: str


@attrs.frozen(kw_only=True)
class Usage:
    """Token counts of one model call."""

    model: str
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    thought_tokens: int = 0


LLMEvent = TextDelta | ThoughtDelta | ToolCall | Usage


class ProviderError(Exception):
    """A provider failed. ``code`` is stable and safe to show; the message never holds a key.

    Codes: ``provider_failed`` (the service answered an error or cut the stream),
    ``rate_limited`` (429), ``unauthorized`` (401/403), ``unavailable`` (cannot connect).
    """

    def __init__(self, code: str, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.retryable = retryable


@runtime_checkable
class ChatModel(Protocol):
    """A chat model that streams.

    Thinking summaries are optional and outside the protocol: a provider that can report its
    thinking sets the class attribute ``reports_thoughts = True`` and accepts a keyword-only
    ``thoughts: bool = False`` on :meth:`stream`; asked with ``thoughts=True`` it may yield
    :class:`ThoughtDelta` events. Callers pass ``thoughts`` only to such providers (see
    :func:`reports_thoughts`), so every other provider keeps the plain signature below.
    """

    provider: str
    model: str

    def stream(
        self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec] = ()
    ) -> AsyncIterator[LLMEvent]:
        """Yield text deltas as written, then any tool calls, then one ``Usage``.

        Raises ``ProviderError`` (also mid-stream, when the stream is cut).
        """
        ...


def reports_thoughts(llm: object) -> bool:
    """Whether ``llm`` takes ``stream(..., thoughts=True)`` and may yield :class:`ThoughtDelta`."""
    return getattr(llm, "reports_thoughts", False) is True


@attrs.frozen(kw_only=True)
class Transcript:
    """What a recognizer heard in one utterance."""

    text: str
    audio_seconds: float


class SpeechStream(Protocol):
    """One utterance recognized as its audio arrives: ``async with stt.open_stream(rate) as stream``."""

    async def __aenter__(self) -> SpeechStream: ...

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...

    async def feed(self, pcm: bytes) -> str | None:
        """Take more audio; return the words so far when they changed (else ``None``)."""
        ...

    async def finish(self) -> Transcript:
        """No more audio: the whole utterance's transcript."""
        ...


@runtime_checkable
class Recognizer(Protocol):
    """Speech to text over 16-bit signed little-endian mono PCM, batch and maybe streaming."""

    provider: str
    language: str | None

    async def transcribe(self, pcm: bytes, sample_rate_hz: int, *, prompt: str = "") -> Transcript:
        """Transcribe one whole utterance.

        ``prompt``: words the speech likely holds, spelled as they should be written (Whisper's
        previous-text prompt, OpenAI's ``prompt``); a recognizer that takes no hint ignores it.
        """
        ...

    def open_stream(self, sample_rate_hz: int) -> SpeechStream | None:
        """A stream that hears an utterance as it arrives; ``None``: this one takes whole utterances only.

        Raises:
            ValueError: It cannot take audio at ``sample_rate_hz``.
        """
        ...


@runtime_checkable
class Synthesizer(Protocol):
    """Text to speech, yielding 16-bit signed little-endian mono PCM at ``sample_rate_hz``."""

    provider: str
    voice: str | int | None
    sample_rate_hz: int

    def synthesize(self, text: str) -> AsyncIterator[bytes]:
        """Yield the audio of ``text`` in chunks as it is produced."""
        ...
