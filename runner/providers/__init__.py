"""Model providers: chat models (LLM), speech to text (STT) and text to speech (TTS).

The shapes every provider speaks come from ``_types``; each service lives in its own module.
``make_llm``, ``make_stt`` and ``make_tts`` build providers from configuration. The offline speech engines
(``HibariTTS`` and ``WhisperSTT``, the embedded defaults; ``EspeakTTS`` and ``PocketsphinxSTT``, the light
options) load native libraries and models, so they are imported on first use.
"""

import importlib as _importlib
import typing as _typing

from ._types import LLM as LLM
from ._types import STT as STT
from ._types import TTS as TTS
from ._types import ChatMessage as ChatMessage
from ._types import LLMEvent as LLMEvent
from ._types import ProviderError as ProviderError
from ._types import Role as Role
from ._types import TextDelta as TextDelta
from ._types import ToolCall as ToolCall
from ._types import ToolSpec as ToolSpec
from ._types import Transcript as Transcript
from ._types import Usage as Usage
from .anthropic import AnthropicLLM as AnthropicLLM
from .azure import AzureSTT as AzureSTT
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

#: The providers ``make_llm`` knows.
LLM_PROVIDERS = ("openai", "anthropic", "openai-compatible", "local")
#: The providers ``make_tts`` knows.
TTS_PROVIDERS = ("hibari", "espeak", "openai", "kugelaudio")
#: The providers ``make_stt`` knows.
STT_PROVIDERS = ("whisper", "pocketsphinx", "openai", "azure")

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
) -> LLM:
    """Build the chat model a configuration names.

    Keys come from the environment (``OPENAI_API_KEY``, ``ANTHROPIC_API_KEY``, or for an
    OpenAI-compatible endpoint only the variable named by ``api_key_env``); a missing key
    surfaces as ``ProviderError("unauthorized")`` on the first call, not here.

    Args:
        provider: ``"openai"``, ``"anthropic"``, ``"openai-compatible"`` or ``"local"``.
        model: The model name the service knows (any label for ``"local"``).
        base_url: The API root; required for ``"openai-compatible"``, optional otherwise,
            ignored for ``"local"``.
        api_key_env: The environment variable holding the key, overriding the default.

    Returns:
        An object implementing ``LLM``.

    Raises:
        ValueError: for an unknown provider, or ``"openai-compatible"`` without ``base_url``.
    """
    if provider == "openai":
        return OpenAILLM(
            model,
            base_url=base_url or "https://api.openai.com/v1",
            api_key_env=api_key_env,
        )
    if provider == "openai-compatible":
        if not base_url:
            raise ValueError("provider 'openai-compatible' needs a base_url")
        return OpenAILLM(model, base_url=base_url, provider="openai-compatible", api_key_env=api_key_env)
    if provider == "anthropic":
        return AnthropicLLM(
            model,
            base_url=base_url or "https://api.anthropic.com",
            api_key_env=api_key_env or "ANTHROPIC_API_KEY",
        )
    if provider == "local":
        return LocalLLM(model)
    raise ValueError(f"unknown LLM provider {provider!r}; expected one of {', '.join(LLM_PROVIDERS)}")


def make_tts(provider: str, *, voice: str | int | None = None, model: str | None = None) -> TTS:
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
        An object implementing ``TTS``.

    Raises:
        ProviderError: ``invalid_settings`` for a voice the provider cannot use.
        ValueError: for a provider with no TTS here.
    """
    if provider == "hibari":
        from .hibari import HibariTTS

        return HibariTTS(voice)
    if provider == "espeak":
        from .espeak import EspeakTTS

        return EspeakTTS(voice)
    if provider == "openai":
        if voice is not None and not isinstance(voice, str):
            raise ProviderError("invalid_settings", f"OpenAI voices are names, got {voice!r}")
        return OpenAITTS(model or "gpt-4o-mini-tts", voice=voice or "alloy")
    if provider == "kugelaudio":
        if voice is None:
            raise ProviderError("invalid_settings", "KugelAudio needs a numeric voice id (see list_voices)")
        return KugelAudioTTS(voice, model=model)
    raise ValueError(f"unknown TTS provider {provider!r}; expected one of {', '.join(TTS_PROVIDERS)}")


def make_stt(provider: str, *, language: str | None = None) -> STT:
    """Build the speech-to-text engine a configuration names.

    Args:
        provider: ``"whisper"`` (offline, Whisper tiny.en, English only: the embedded default),
            ``"pocketsphinx"`` (offline, light, English only), ``"openai"`` or ``"azure"``
            (region from ``AZURE_SPEECH_REGION``, key from ``AZURE_SPEECH_KEY``).
        language: The language: ``"en"`` for whisper and pocketsphinx, an ISO-639-1 hint (or ``None``
            to detect) for OpenAI, a locale such as ``"de-DE"`` for Azure (default
            ``"en-US"``; a bare ``"de"`` means ``"de-DE"``).

    Returns:
        An object implementing ``STT``.

    Raises:
        ProviderError: ``invalid_settings`` for a language the engine cannot recognise, or
            Azure without a region.
        ValueError: for a provider with no STT here.
    """
    if provider == "whisper":
        from .whisper import WhisperSTT

        return WhisperSTT(language)
    if provider == "pocketsphinx":
        from .pocketsphinx import PocketsphinxSTT

        return PocketsphinxSTT(language)
    if provider == "openai":
        return OpenAISTT(language=language.split("-")[0].lower() if language else None)
    if provider == "azure":
        return AzureSTT(language or "en-US")
    raise ValueError(f"unknown STT provider {provider!r}; expected one of {', '.join(STT_PROVIDERS)}")
