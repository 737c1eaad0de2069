"""Model providers: chat models (``ChatModel``), recognizers (``Recognizer``, speech to text) and
synthesizers (``Synthesizer``, text to speech).

The shapes every provider speaks come from ``_types``; each service lives in its own module.
``make_llm``, ``make_stt`` and ``make_tts`` build providers from configuration. The offline speech engines
(``HibariTTS`` and ``WhisperSTT``, the embedded defaults; ``EspeakTTS`` and ``PocketsphinxSTT``, the light
options) load native libraries and models, so they are imported on first use.
"""

import importlib as _importlib
import typing as _typing

from . import _registry
from ._registry import chat_model as chat_model
from ._registry import recognizer as recognizer
from ._registry import synthesizer as synthesizer
from ._types import ChatMessage as ChatMessage
from ._types import ChatModel as ChatModel
from ._types import LLMEvent as LLMEvent
from ._types import ProviderError as ProviderError
from ._types import Recognizer as Recognizer
from ._types import Role as Role
from ._types import SpeechStream as SpeechStream
from ._types import Synthesizer as Synthesizer
from ._types import TextDelta as TextDelta
from ._types import ThoughtDelta as ThoughtDelta
from ._types import ToolCall as ToolCall
from ._types import ToolSpec as ToolSpec
from ._types import Transcript as Transcript
from ._types import Usage as Usage
from ._types import reports_thoughts as reports_thoughts
from .anthropic import AnthropicLLM as AnthropicLLM
from .azure import AzureSTT as AzureSTT
from .kugelaudio import KugelAudioLLM as KugelAudioLLM
from .kugelaudio import KugelAudioTTS as KugelAudioTTS
from .kugelaudio import KugelAudioVoice as KugelAudioVoice
from .local import LocalLLM as LocalLLM
from .openai import OpenAILLM as OpenAILLM
from .openai import OpenAISTT as OpenAISTT
from .openai import OpenAITTS as OpenAITTS

if _typing.TYPE_CHECKING:
    from .espeak import EspeakTTS as EspeakTTS
    from .hibari import HibariTTS as HibariTTS
    from .pocketsphinx import PocketsphinxSTT as PocketsphinxSTT
    from .whisper import WhisperSTT as WhisperSTT

__all__ = [
    "LLM_PROVIDERS",
    "STT_PROVIDERS",
    "TTS_PROVIDERS",
    "AnthropicLLM",
    "AzureSTT",
    "ChatMessage",
    "ChatModel",
    "EspeakTTS",
    "HibariTTS",
    "KugelAudioLLM",
    "KugelAudioTTS",
    "KugelAudioVoice",
    "LLMEvent",
    "LocalLLM",
    "OpenAILLM",
    "OpenAISTT",
    "OpenAITTS",
    "PocketsphinxSTT",
    "ProviderError",
    "Recognizer",
    "Role",
    "SpeechStream",
    "Synthesizer",
    "TextDelta",
    "ThoughtDelta",
    "ToolCall",
    "ToolSpec",
    "Transcript",
    "Usage",
    "WhisperSTT",
    "chat_model",
    "make_llm",
    "make_stt",
    "make_tts",
    "recognizer",
    "reports_thoughts",
    "synthesizer",
]

#: The providers ``make_llm`` knows.
LLM_PROVIDERS = _registry.names("llm")
#: The providers ``make_tts`` knows.
TTS_PROVIDERS = _registry.names("tts")
#: The providers ``make_stt`` knows.
STT_PROVIDERS = _registry.names("stt")

#: Names whose modules load native engines: imported on first use.
_LAZY = {
    "EspeakTTS": ".espeak",
    "HibariTTS": ".hibari",
    "PocketsphinxSTT": ".pocketsphinx",
    "WhisperSTT": ".whisper",
}


def __getattr__(name: str) -> _typing.Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


def make_llm(
    provider: str, model: str, *, base_url: str | None = None, api_key_env: str | None = None
) -> ChatModel:
    """Build the chat model a configuration names.

    Keys come from the environment (``OPENAI_API_KEY``, ``ANTHROPIC_API_KEY``,
    ``KUGELAUDIO_API_KEY``, or for an OpenAI-compatible endpoint only the variable named by
    ``api_key_env``); a missing key surfaces as ``ProviderError("unauthorized")`` on the first
    call, not here.

    Args:
        provider: ``"openai"``, ``"anthropic"``, ``"openai-compatible"``, ``"kugelaudio"`` (an
            OpenAI-compatible client of KugelAudio's API: ``KugelAudioLLM``) or ``"local"``.
        model: The model name the service knows (any label for ``"local"``).
        base_url: The API root; required for ``"openai-compatible"``, optional otherwise,
            ignored for ``"local"``.
        api_key_env: The environment variable holding the key, overriding the default.

    Returns:
        An object implementing ``ChatModel``.

    Raises:
        ValueError: for an unknown provider, or ``"openai-compatible"`` without ``base_url``.
    """
    declared = _registry.chat_model(provider)
    if declared is None:
        raise ValueError(f"unknown LLM provider {provider!r}; expected one of {', '.join(LLM_PROVIDERS)}")
    if declared.needs_base_url and not base_url:
        raise ValueError(f"provider {provider!r} needs a base_url")
    return declared.build(model, base_url=base_url, api_key_env=api_key_env)


def make_tts(provider: str, *, voice: str | int | None = None, model: str | None = None) -> Synthesizer:
    """Build the text-to-speech engine a configuration names.

    Keys and regions come from the environment (``OPENAI_API_KEY``, ``KUGELAUDIO_API_KEY``);
    a missing key surfaces as ``ProviderError("unauthorized")`` on the first call.

    Args:
        provider: ``"hibari"`` (offline, neural, English: the embedded default), ``"espeak"``
            (offline, light, many languages), ``"openai"`` or ``"kugelaudio"``.
        voice: The voice: a hibari voice inside its wheel (default ``"heart"``), an espeak
            voice name (default ``"en"``), an OpenAI voice name (default ``"alloy"``), or a
            KugelAudio numeric voice id (required).
        model: The speech model (ignored by hibari and espeak); the provider's default when ``None``.

    Returns:
        An object implementing ``Synthesizer``.

    Raises:
        ProviderError: ``invalid_settings`` for a voice the provider cannot use.
        ValueError: for a provider with no TTS here.
    """
    declared = _registry.synthesizer(provider)
    if declared is None:
        raise ValueError(f"unknown TTS provider {provider!r}; expected one of {', '.join(TTS_PROVIDERS)}")
    return declared.build(voice, model=model)


def make_stt(provider: str, *, language: str | None = None) -> Recognizer:
    """Build the speech-to-text engine a configuration names.

    Args:
        provider: ``"whisper"`` (offline, Whisper tiny.en for English: the embedded default;
            Whisper base for the other languages it knows, with the ``multilingual`` extra),
            ``"pocketsphinx"`` (offline, light, English only), ``"openai"`` or ``"azure"``
            (region from ``AZURE_SPEECH_REGION``, key from ``AZURE_SPEECH_KEY``).
        language: The language: ``"en"`` for pocketsphinx, ``"en"`` or (with the
            ``multilingual`` extra) any language Whisper knows for whisper, an ISO-639-1 hint (or ``None``
            to detect) for OpenAI, a locale such as ``"de-DE"`` for Azure (default
            ``"en-US"``; a bare ``"de"`` means ``"de-DE"``).

    Returns:
        An object implementing ``Recognizer``.

    Raises:
        ProviderError: ``invalid_settings`` for a language the engine cannot recognise, or
            Azure without a region.
        ValueError: for a provider with no STT here.
    """
    declared = _registry.recognizer(provider)
    if declared is None:
        raise ValueError(f"unknown STT provider {provider!r}; expected one of {', '.join(STT_PROVIDERS)}")
    return declared.build(language)
