"""Which providers there are, and what each one is.

A provider module declares what it offers in ``PROVIDES``: a :class:`ChatModelProvider`,
:class:`SynthesizerProvider` or :class:`RecognizerProvider` saying its name, how it is built,
and how each option a call may change is checked. ``_WHERE`` below is the one line per provider
that says which module declares it; the module is imported only when the provider is first
asked for, so naming the offline engines loads no native library.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Literal, Protocol, TypeAlias, TypeVar

import attrs

from ._types import ChatModel, Recognizer, Synthesizer

Kind = Literal["llm", "tts", "stt"]

#: Where each provider is declared: (kind, name, module), in the order they are listed.
_WHERE: tuple[tuple[Kind, str, str], ...] = (
    ("llm", "openai", ".openai"),
    ("llm", "anthropic", ".anthropic"),
    ("llm", "openai-compatible", ".openai"),
    ("llm", "kugelaudio", ".kugelaudio"),
    ("llm", "local", ".local"),
    ("tts", "hibari", ".hibari"),
    ("tts", "espeak", ".espeak"),
    ("tts", "openai", ".openai"),
    ("tts", "kugelaudio", ".kugelaudio"),
    ("stt", "whisper", ".whisper"),
    ("stt", "pocketsphinx", ".pocketsphinx"),
    ("stt", "openai", ".openai"),
    ("stt", "azure", ".azure"),
)


def fits(value: object) -> str | None:
    """No problem with ``value``: for options a provider does not check itself."""
    return None


class BuildChatModel(Protocol):
    """Makes a chat model from its configuration."""

    def __call__(self, model: str, *, base_url: str | None, api_key_env: str | None) -> ChatModel: ...


@attrs.frozen(kw_only=True)
class ChatModelProvider:
    """A chat model service.

    Attributes:
        name: What a configuration calls it (``LLM(provider=name, ...)``).
        build: Makes the model; keys come from the environment on the first call.
        needs_base_url: Whether a configuration must give the endpoint.
    """

    kind: Literal["llm"] = "llm"
    name: str
    build: BuildChatModel
    needs_base_url: bool = False


class BuildSynthesizer(Protocol):
    """Makes a speech engine from its configuration."""

    def __call__(self, voice: str | int | None, *, model: str | None) -> Synthesizer: ...


@attrs.frozen(kw_only=True)
class SynthesizerProvider:
    """A speech (text to speech) service or engine.

    Attributes:
        name: What a configuration calls it (``TTS(provider=name, ...)``).
        build: Makes the engine. Raises ``ProviderError("invalid_settings")`` for a voice it cannot use.
        voice_problem: Why a voice (a string or a number) would not do, or ``None``.
        has_models: Whether ``model`` chooses anything.
    """

    kind: Literal["tts"] = "tts"
    name: str
    build: BuildSynthesizer
    voice_problem: Callable[[str | int | float], str | None] = fits
    has_models: bool = True


@attrs.frozen(kw_only=True)
class RecognizerProvider:
    """A speech recognition (speech to text) service or engine.

    Attributes:
        name: What a configuration calls it (``STT(provider=name, ...)``).
        build: Makes the recognizer for a language (``None``: its default).
            Raises ``ProviderError("invalid_settings")`` for a language it cannot hear.
        streams: Whether it hears an utterance as it arrives (``open_stream``) or only whole.
        streams_at_pauses: Its stream decodes only at pauses in the speech, which it finds
            itself (Whisper): a caller whose pauses are found already (the voice pipeline's
            listener) decodes it whole at those pauses instead.
        language_problem: Why a language tag would not do, or ``None``.
    """

    kind: Literal["stt"] = "stt"
    name: str
    build: Callable[[str | None], Recognizer]
    streams: bool
    streams_at_pauses: bool = False
    language_problem: Callable[[str], str | None] = fits


Provider: TypeAlias = ChatModelProvider | SynthesizerProvider | RecognizerProvider
_P = TypeVar("_P", bound=Provider)


def names(kind: Kind) -> tuple[str, ...]:
    """The providers of one kind, in the order they are listed."""
    return tuple(name for k, name, _ in _WHERE if k == kind)


def _declared(kind: Kind, name: str, shape: type[_P]) -> _P | None:
    for k, known, module in _WHERE:
        if (k, known) == (kind, name):
            provides = importlib.import_module(module, __package__).PROVIDES
            return next(p for p in provides if isinstance(p, shape) and p.name == name)
    return None


def chat_model(name: str) -> ChatModelProvider | None:
    """The chat model provider called ``name``, or ``None`` when there is none."""
    return _declared("llm", name, ChatModelProvider)


def synthesizer(name: str) -> SynthesizerProvider | None:
    """The speech provider called ``name``, or ``None`` when there is none."""
    return _declared("tts", name, SynthesizerProvider)


def recognizer(name: str) -> RecognizerProvider | None:
    """The recognition provider called ``name``, or ``None`` when there is none."""
    return _declared("stt", name, RecognizerProvider)
