"""Azure AI Speech: speech to text through the REST API for short audio.

``POST https://{region}.stt.speech.microsoft.com/speech/recognition/conversation/
cognitiveservices/v1?language=de-DE&format=simple`` with ``Ocp-Apim-Subscription-Key`` and a
WAV body (16-bit mono PCM at 16 kHz); the answer is ``{"RecognitionStatus": "Success",
"DisplayText": "...", "Offset": <100 ns ticks>, "Duration": <100 ns ticks>}``. The API takes
up to 60 s of audio per request, which fits one utterance of a turn.
"""

from __future__ import annotations

import re
from typing import Any

import httpx

from ..voice.audio import resample_s16le
from ._http import (
    decode_json_object,
    env_key,
    maybe_client,
    read_capped,
    status_error,
    transport_error,
    wav,
)
from ._registry import RecognizerProvider
from ._types import ProviderError, Transcript

AZURE_SPEECH_KEY_ENV = "AZURE_SPEECH_KEY"
AZURE_SPEECH_REGION_ENV = "AZURE_SPEECH_REGION"
#: The rate the short-audio API takes.
AZURE_STT_SAMPLE_RATE_HZ = 16_000
_PATH = "/speech/recognition/conversation/cognitiveservices/v1"
_SERVICE = "Azure Speech"

#: Common recognition locales, for reference; any well-formed tag is accepted as well.
AZURE_COMMON_LANGUAGES = (
    "ar-SA", "ca-ES", "cs-CZ", "da-DK", "de-AT", "de-CH", "de-DE", "el-GR", "en-AU", "en-CA",
    "en-GB", "en-IE", "en-IN", "en-NZ", "en-US", "es-ES", "es-MX", "fi-FI", "fr-CA", "fr-CH",
    "fr-FR", "he-IL", "hi-IN", "hu-HU", "id-ID", "it-IT", "ja-JP", "ko-KR", "nb-NO", "nl-NL",
    "pl-PL", "pt-BR", "pt-PT", "ro-RO", "ru-RU", "sk-SK", "sv-SE", "th-TH", "tr-TR", "uk-UA",
    "vi-VN", "zh-CN", "zh-HK", "zh-TW",
)  # fmt: skip
#: The locale a bare language code stands for.
_DEFAULT_LOCALE = {tag.split("-")[0]: tag for tag in reversed(AZURE_COMMON_LANGUAGES)} | {
    "de": "de-DE", "en": "en-US", "es": "es-ES", "fr": "fr-FR", "pt": "pt-BR", "zh": "zh-CN",
}  # fmt: skip
#: language[-Script]-REGION, e.g. ``de-DE``, ``sr-Latn-RS``, ``es-419``.
_LOCALE = re.compile(r"^([A-Za-z]{2,3})(?:-([A-Za-z]{4}))?-([A-Za-z]{2}|[0-9]{3})$")
_REGION = re.compile(r"^[a-z0-9]+$")
_SILENT_STATUSES = ("NoMatch", "InitialSilenceTimeout", "BabbleTimeout")


def _locale(language: str | None) -> str | None:
    """The canonical locale (``de-DE``) for a tag, or ``None`` if it is not one Azure takes."""
    if not isinstance(language, str):
        return None
    tag = language.strip().replace("_", "-")
    match = _LOCALE.match(tag)
    if match:
        lang, script, region = match.groups()
        script = f"-{script.title()}" if script else ""
        return f"{lang.lower()}{script}-{region.upper()}"
    return _DEFAULT_LOCALE.get(tag.lower())


class AzureSTT:
    """Speech to text with Azure AI Speech (REST API for short audio, ``format=simple``).

    Azure recognises one locale per request. ``language`` is a BCP-47 locale such as
    ``"de-DE"``, ``"en-GB"`` or ``"sr-Latn-RS"`` (case is normalised); a bare language code
    is taken as its most common locale (``"de"`` as ``"de-DE"``, ``"en"`` as ``"en-US"``).
    Any well-formed ``language[-Script]-REGION`` tag is accepted; whether Azure knows it is
    for the service to say (it answers 400).

    Args:
        language: The recognition locale.
        region: The Azure region (``"westeurope"``); by default ``AZURE_SPEECH_REGION``.
        api_key: The resource key; by default ``AZURE_SPEECH_KEY``. Never shown in errors.
        base_url: The endpoint root instead of ``https://{region}.stt.speech.microsoft.com``.
        http: A shared ``httpx.AsyncClient``; by default each request opens its own.

    Raises:
        ProviderError: ``invalid_settings`` for a language that is not a locale, or with
            neither a region nor a ``base_url``.
    """

    provider = "azure"

    def __init__(
        self,
        language: str = "en-US",
        *,
        region: str | None = None,
        api_key: str | None = None,
        base_url: str | None = None,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        locale = _locale(language)
        if locale is None:
            raise ProviderError(
                "invalid_settings",
                f"Azure Speech needs a recognition locale such as 'en-US' or 'de-DE', got {language!r}",
            )
        self.language: str | None = locale
        if base_url is None:
            region = region if region is not None else env_key(AZURE_SPEECH_REGION_ENV)
            if not region:
                raise ProviderError(
                    "invalid_settings",
                    f"Azure Speech needs a region: set {AZURE_SPEECH_REGION_ENV} or pass region",
                )
            region = region.strip().lower()
            if not _REGION.match(region):
                raise ProviderError("invalid_settings", f"Azure Speech region is malformed: {region!r}")
            base_url = f"https://{region}.stt.speech.microsoft.com"
        self.region = region
        self.base_url = base_url.rstrip("/")
        self._http = http
        self._api_key = api_key if api_key is not None else env_key(AZURE_SPEECH_KEY_ENV)

    @property
    def missing_key(self) -> str | None:
        """The variable to set when this provider has no key (checked at warm-up)."""
        return None if self._api_key else AZURE_SPEECH_KEY_ENV

    def __repr__(self) -> str:
        return f"AzureSTT(language={self.language!r}, base_url={self.base_url!r})"

    @staticmethod
    def supports_language(language: str | None) -> bool:
        """Whether ``language`` names a locale (or a bare code with a default locale)."""
        return _locale(language) is not None

    def open_stream(self, sample_rate_hz: int) -> None:
        """None: the service takes whole utterances only (see :meth:`transcribe`)."""
        return None

    async def transcribe(self, pcm: bytes, sample_rate_hz: int, *, prompt: str = "") -> Transcript:
        """Transcribe one utterance of 16-bit little-endian mono PCM (resampled to 16 kHz).
        The short-audio REST API takes no hint: ``prompt`` is ignored.

        Silence or unintelligible speech (``NoMatch`` and the timeouts) gives empty text.

        Raises:
            ProviderError: on an HTTP error, a failed connection, an ``Error`` status or an
                unreadable answer.
        """
        if sample_rate_hz <= 0:
            raise ValueError(f"sample_rate_hz must be positive, got {sample_rate_hz}")
        if not self._api_key:
            raise ProviderError(
                "unauthorized",
                f"no key for Azure Speech: set {AZURE_SPEECH_KEY_ENV} or pass api_key",
            )
        pcm = pcm[: len(pcm) - len(pcm) % 2]
        audio_seconds = (len(pcm) // 2) / sample_rate_hz
        audio = resample_s16le(pcm, sample_rate_hz, AZURE_STT_SAMPLE_RATE_HZ)
        query = httpx.QueryParams({"language": self.language or "en-US", "format": "simple"})
        headers = {
            "ocp-apim-subscription-key": self._api_key,
            "content-type": "audio/wav; codecs=audio/pcm; samplerate=16000",
            "accept": "application/json",
        }
        async with maybe_client(self._http) as client:
            request = client.build_request(
                "POST",
                f"{self.base_url}{_PATH}?{query}",
                headers=headers,
                content=wav(audio, AZURE_STT_SAMPLE_RATE_HZ),
            )
            try:
                response = await client.send(request, stream=True)
            except httpx.TransportError as exc:
                raise transport_error(_SERVICE, exc, connected=False) from None
            try:
                body = await read_capped(response, 1024 * 1024)
            except httpx.TransportError as exc:
                raise transport_error(_SERVICE, exc, connected=True) from None
            finally:
                await response.aclose()
        if response.status_code >= 400:
            raise status_error(_SERVICE, response.status_code, response.headers, body, self._api_key)
        return Transcript(text=_recognized_text(body), audio_seconds=audio_seconds)


def _recognized_text(body: bytes) -> str:
    payload: dict[str, Any] = decode_json_object(body.decode("utf-8", "replace"), _SERVICE)
    status = payload.get("RecognitionStatus")
    if status == "Success":
        text = payload.get("DisplayText")
        if not isinstance(text, str):
            raise ProviderError("provider_failed", f"{_SERVICE} sent a result with no text")
        return text.strip()
    if status in _SILENT_STATUSES:
        return ""
    if status == "Error":
        raise ProviderError("provider_failed", f"{_SERVICE} failed to recognise the audio", retryable=True)
    raise ProviderError("provider_failed", f"{_SERVICE} sent recognition status {status!r}")


def _build(language: str | None) -> AzureSTT:
    return AzureSTT(language or "en-US")


PROVIDES = (RecognizerProvider(name="azure", build=_build, streams=False),)
