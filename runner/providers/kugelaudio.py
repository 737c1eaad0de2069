"""KugelAudio: streaming text to speech over the service's WebSocket, and its voice list.

The wire format is the one the official ``kugelaudio`` SDK (2.7.0) speaks:

- ``GET {api}/v1/voices?limit=&offset=&include_public=true`` with ``Authorization: Bearer
  <key>`` and ``X-API-Key: <key>`` answers ``{"voices": [{"id": 123, "name": ...,
  "supported_languages": [...]}, ...], "total", "limit", "offset"}``. Voices are numbered.
- ``{api as ws(s)}/ws/tts?api_key=<key>&model_id=<model>``: the client sends one JSON text
  frame ``{"text", "model_id", "voice_id", "sample_rate", "cfg_scale", "max_new_tokens",
  "normalize", "word_timestamps", "speed"[, "language"]}``; the server answers JSON text
  frames ``{"audio": <base64 PCM16 LE mono>, "idx", "sr", "samples"}`` as audio is made,
  optionally ``{"word_timestamps": [...]}``, then ``{"final": true, ...stats}``. A failure is
  a frame ``{"error": <message>, "error_code": "UNAUTHORIZED" | "RATE_LIMITED" | ..., "code":
  <HTTP-like status>}``, a refused upgrade (401/403/429), or a close code (4001 bad key,
  4003 no credits, 4029 rate limited, 4500 model unavailable, 1012/1013 restarting).

The SDK runs on asyncio, so this module speaks that format itself: a small WebSocket client
on ``wsproto`` over a Trio stream, with no background task, so ``synthesize`` can stay a plain
async generator. The key travels in the query string, as the service requires, and never
appears in a message.

The host protocol names KugelAudio as an LLM provider too (``llm={kugelaudio.llm()}``, model
``qwen3.8-27b``), but KugelAudio documents no chat API of its own that could be found (the SDK
has TTS, ASR, voices and an OpenAI-*Live* preview). ``KugelAudioLLM`` is therefore an
OpenAI-compatible chat client (``POST {base}/chat/completions``, streamed) against
KugelAudio's API base, with KugelAudio's key: the base is ``KUGELAUDIO_LLM_BASE_URL`` when set,
so a deployment can point it at whatever endpoint KugelAudio gives it (``docs/agents.md``).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import os
import ssl
import urllib.parse
from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import Any

import attrs
import httpx
import trio
import wsproto
import wsproto.events as ws_events
import wsproto.utilities
from wsproto.connection import ConnectionState

from ..voice.audio import Resampler
from ._http import (
    MAX_ERROR_MESSAGE_CHARS,
    decode_json_object,
    env_key,
    maybe_client,
    read_capped,
    redact,
    status_error,
    transport_error,
)
from ._registry import ChatModelProvider, SynthesizerProvider
from ._types import ProviderError
from .openai import OpenAILLM

KUGELAUDIO_BASE_URL = "https://api.kugelaudio.com"
KUGELAUDIO_EU_BASE_URL = "https://api.eu.kugelaudio.com"
KUGELAUDIO_DEFAULT_MODEL = "kugel-3.5"
KUGELAUDIO_KEY_ENV = "KUGELAUDIO_API_KEY"
#: The chat model the host protocol's own example reports for ``kugelaudio.llm()``.
KUGELAUDIO_LLM_DEFAULT_MODEL = "qwen3.8-27b"
#: Overrides the chat API's base (everything before ``/chat/completions``).
KUGELAUDIO_LLM_BASE_URL_ENV = "KUGELAUDIO_LLM_BASE_URL"

_SERVICE = "KugelAudio"
#: Keys may carry a region prefix (``eu-...``); the SDK strips it and picks the host by it.
_REGION_PREFIXES = ("eu-", "us-", "global-")
#: The most frames one synthesis may take before we call the stream broken.
_MAX_FRAMES = 100_000
#: The longest one frame (a base64 chunk of audio) may be.
_MAX_FRAME_BYTES = 16 * 1024 * 1024
#: Bytes read from the socket per receive.
_RECEIVE_BYTES = 65_536
#: The longest we spend on the closing handshake after leaving a stream.
_CLOSE_S = 1.0

_CLOSE_CODES: Mapping[int, tuple[str, str, bool]] = {
    4001: ("unauthorized", "refused the credentials", False),
    4003: ("provider_failed", "reports insufficient credits", False),
    4029: ("rate_limited", "rate limited the request", True),
    4500: ("provider_failed", "has the model temporarily unavailable", True),
    1012: ("provider_failed", "is restarting", True),
    1013: ("provider_failed", "asks to try again later", True),
}


def _split_key(key: str | None) -> tuple[str | None, str | None]:
    """``(key without region prefix, region)``, as the SDK reads a key."""
    if key is None:
        return None, None
    for prefix in _REGION_PREFIXES:
        if key.startswith(prefix):
            return key[len(prefix) :], prefix[:-1]
    return key, None


def _voice_id(voice: Any) -> int:
    if isinstance(voice, bool):
        raise ProviderError("invalid_settings", "KugelAudio voices are numbers, not booleans")
    if isinstance(voice, int):
        if voice < 0:
            raise ProviderError("invalid_settings", f"KugelAudio voice ids are >= 0, got {voice}")
        return voice
    if isinstance(voice, str) and voice.strip().isdigit() and voice.strip().isascii():
        return int(voice.strip())
    raise ProviderError("invalid_settings", f"KugelAudio voices are numeric ids (e.g. 123), got {voice!r}")


def _http_base(base_url: str) -> str:
    base_url = base_url.rstrip("/")
    parsed = urllib.parse.urlsplit(base_url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ProviderError(
            "invalid_settings", f"KugelAudio base_url must be http(s)://host, got {base_url!r}"
        )
    return base_url


class KugelAudioLLM(OpenAILLM):
    """KugelAudio's chat model, over the OpenAI Chat Completions wire format (streamed).

    Args:
        model: The model name; by default ``"qwen3.8-27b"``.
        api_key: The key; by default ``KUGELAUDIO_API_KEY``. A region prefix (``eu-``) is
            stripped and, without a base, picks the host. Never shown in errors or ``repr``.
        base_url: The API base, ending before ``/chat/completions``; by default
            ``KUGELAUDIO_LLM_BASE_URL``, else ``https://api.kugelaudio.com/v1`` (the ``eu``
            host for an ``eu-`` key).
        http: A shared ``httpx.AsyncClient``.
        max_stream_s: The longest one streamed reply may take.

    Raises:
        ProviderError: ``invalid_settings`` for a base that is not ``http(s)://host``.
    """

    def __init__(
        self,
        model: str = KUGELAUDIO_LLM_DEFAULT_MODEL,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        http: httpx.AsyncClient | None = None,
        max_stream_s: float = 600.0,
    ) -> None:
        key, region = _split_key(api_key if api_key is not None else env_key(KUGELAUDIO_KEY_ENV))
        if not base_url:
            host = KUGELAUDIO_EU_BASE_URL if region == "eu" else KUGELAUDIO_BASE_URL
            base_url = os.environ.get(KUGELAUDIO_LLM_BASE_URL_ENV, "").strip() or f"{host}/v1"
        super().__init__(
            model or KUGELAUDIO_LLM_DEFAULT_MODEL,
            api_key=key,
            base_url=_http_base(base_url),
            provider="kugelaudio",
            http=http,
            api_key_env=KUGELAUDIO_KEY_ENV,
            max_stream_s=max_stream_s,
        )


@attrs.frozen(kw_only=True)
class KugelAudioVoice:
    """A voice as ``GET /v1/voices`` lists it."""

    id: int
    name: str
    supported_languages: tuple[str, ...] = ()
    is_public: bool = False


class KugelAudioTTS:
    """Text to speech from KugelAudio, streamed over its ``/ws/tts`` WebSocket.

    Yields 16-bit little-endian mono PCM at ``sample_rate_hz`` (asked of the service; audio
    that arrives at another rate is resampled).

    Args:
        voice: The numeric voice id (``123`` or ``"123"``); see ``list_voices``.
        model: The model id; ``None`` means ``"kugel-3.5"``.
        api_key: The key; by default ``KUGELAUDIO_API_KEY``. Never shown in errors or ``repr``.
            A region prefix (``eu-``) is stripped and, without ``base_url``, picks the host.
        base_url: The API root (``https://`` or ``http://``; the WebSocket uses ``wss``/``ws``).
        sample_rate_hz: The output rate asked of the service.
        language: An ISO 639-1 hint for text normalisation (``"de"``), or ``None``.
        http: A shared ``httpx.AsyncClient`` for ``list_voices``.
        connect_timeout_s: The longest the connection and upgrade may take.
        idle_timeout_s: The longest silence between two frames of a stream.
        max_audio_s: The most audio one request may return.

    Raises:
        ProviderError: ``invalid_settings`` for a voice that is not a number.
    """

    provider = "kugelaudio"

    def __init__(
        self,
        voice: int | str,
        *,
        model: str | None = None,
        api_key: str | None = None,
        base_url: str | None = None,
        sample_rate_hz: int = 24_000,
        language: str | None = None,
        http: httpx.AsyncClient | None = None,
        connect_timeout_s: float = 10.0,
        idle_timeout_s: float = 60.0,
        max_audio_s: float = 600.0,
    ) -> None:
        self.voice: str | int | None = _voice_id(voice)
        if sample_rate_hz <= 0:
            raise ProviderError("invalid_settings", f"sample_rate_hz must be positive, got {sample_rate_hz}")
        self.model = model or KUGELAUDIO_DEFAULT_MODEL
        self.sample_rate_hz = sample_rate_hz
        self.language = language
        self.connect_timeout_s = connect_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.max_audio_s = max_audio_s
        self._http = http
        key, region = _split_key(api_key if api_key is not None else env_key(KUGELAUDIO_KEY_ENV))
        self._api_key = key
        if base_url is None:
            base_url = KUGELAUDIO_EU_BASE_URL if region == "eu" else KUGELAUDIO_BASE_URL
        self.base_url = _http_base(base_url)

    @property
    def missing_key(self) -> str | None:
        """The variable to set when this provider has no key (checked at warm-up)."""
        return None if self._api_key else KUGELAUDIO_KEY_ENV

    def __repr__(self) -> str:
        return f"KugelAudioTTS(voice={self.voice!r}, model={self.model!r}, base_url={self.base_url!r})"

    def _require_key(self) -> str:
        if not self._api_key:
            raise ProviderError(
                "unauthorized", f"no API key for KugelAudio: set {KUGELAUDIO_KEY_ENV} or pass api_key"
            )
        return self._api_key

    def request_body(self, text: str) -> dict[str, Any]:
        """The JSON frame that asks for the speech of ``text``."""
        body: dict[str, Any] = {
            "text": text,
            "model_id": self.model,
            "voice_id": self.voice,
            "sample_rate": self.sample_rate_hz,
            "cfg_scale": 2.0,
            "max_new_tokens": 2048,
            "normalize": True,
            "word_timestamps": False,
            "speed": 1.0,
        }
        if self.language:
            body["language"] = self.language
        return body

    async def list_voices(
        self, *, language: str | None = None, limit: int = 100, offset: int = 0
    ) -> Sequence[KugelAudioVoice]:
        """One page of the voices this key may use (its own and the public ones).

        Raises:
            ProviderError: on an HTTP error, a failed connection or an unreadable answer.
        """
        key = self._require_key()
        params: dict[str, Any] = {"limit": limit, "offset": offset, "include_public": "true"}
        if language:
            params["language"] = language
        async with maybe_client(self._http) as client:
            try:
                response = await client.send(
                    client.build_request(
                        "GET",
                        f"{self.base_url}/v1/voices",
                        params=params,
                        headers={"authorization": f"Bearer {key}", "x-api-key": key},
                    ),
                    stream=True,
                )
            except httpx.TransportError as exc:
                raise transport_error(_SERVICE, exc, connected=False) from None
            try:
                body = await read_capped(response, 8 * 1024 * 1024)
            except httpx.TransportError as exc:
                raise transport_error(_SERVICE, exc, connected=True) from None
            finally:
                await response.aclose()
        if response.status_code >= 400:
            raise status_error(_SERVICE, response.status_code, response.headers, body, key)
        payload = decode_json_object(body.decode("utf-8", "replace"), _SERVICE)
        voices = []
        for item in payload.get("voices") or ():
            if not isinstance(item, Mapping) or not isinstance(item.get("id"), int):
                raise ProviderError("provider_failed", "KugelAudio listed a voice with no id")
            languages = item.get("supported_languages") or ()
            voices.append(
                KugelAudioVoice(
                    id=item["id"],
                    name=str(item.get("name") or ""),
                    supported_languages=tuple(str(x) for x in languages),
                    is_public=bool(item.get("is_public", False)),
                )
            )
        return tuple(voices)

    async def synthesize(self, text: str) -> AsyncGenerator[bytes, None]:
        """Yield the speech of ``text`` as PCM chunks of whole samples, as they arrive.

        Raises:
            ProviderError: ``unauthorized`` / ``rate_limited`` when the service says so,
                ``unavailable`` when it cannot be reached, ``provider_failed`` for an error
                frame, a malformed frame, or a stream that ends before its ``final`` frame
                (then after the audio already yielded).
        """
        key = self._require_key()
        query = urllib.parse.urlencode({"api_key": key, "model_id": self.model})
        limit = int(self.max_audio_s * self.sample_rate_hz * 2)
        total = 0
        carry = b""
        resampler: Resampler | None = None
        socket = _WebSocket(self.base_url, f"/ws/tts?{query}", secret=key)
        try:
            with trio.fail_after(self.connect_timeout_s):
                await socket.connect()
        except trio.TooSlowError:
            await socket.abort()
            raise ProviderError(
                "unavailable", "KugelAudio did not accept the connection in time", retryable=True
            ) from None
        except BaseException:
            await socket.abort()
            raise
        try:
            await socket.send_text(json.dumps(self.request_body(text)))
            for _ in range(_MAX_FRAMES):
                try:
                    with trio.fail_after(self.idle_timeout_s):
                        raw = await socket.receive_text()
                except trio.TooSlowError:
                    raise ProviderError(
                        "provider_failed", "KugelAudio stopped sending", retryable=True
                    ) from None
                frame = decode_json_object(raw, _SERVICE)
                if frame.get("error"):
                    raise _frame_error(frame, key)
                if frame.get("final"):
                    break
                audio = frame.get("audio")
                if not audio:
                    continue  # word timestamps and other notes
                pcm = _decode_audio(audio)
                rate = frame.get("sr", self.sample_rate_hz)
                if not isinstance(rate, int) or isinstance(rate, bool) or rate <= 0:
                    raise ProviderError("provider_failed", "KugelAudio sent a bad sample rate")
                data = carry + pcm
                whole = len(data) - len(data) % 2
                carry = data[whole:]
                chunk = data[:whole]
                if rate != self.sample_rate_hz:
                    if resampler is None or resampler.from_hz != rate:
                        resampler = Resampler(rate, self.sample_rate_hz)
                    chunk = resampler.process(chunk)
                total += len(chunk)
                if total > limit:
                    raise ProviderError(
                        "provider_failed",
                        f"KugelAudio sent more than {self.max_audio_s:g} s of audio",
                    )
                if chunk:
                    yield chunk
            else:
                raise ProviderError("provider_failed", f"KugelAudio stream exceeded {_MAX_FRAMES} frames")
            if resampler is not None:
                tail = resampler.flush()
                if tail:
                    yield tail
        finally:
            with trio.move_on_after(_CLOSE_S, shield=True):
                await socket.close()


def _decode_audio(audio: Any) -> bytes:
    if not isinstance(audio, str):
        raise ProviderError("provider_failed", "KugelAudio sent audio that is not base64 text")
    try:
        return base64.b64decode(audio, validate=True)
    except (binascii.Error, ValueError):
        raise ProviderError("provider_failed", "KugelAudio sent malformed base64 audio") from None


def _frame_error(frame: Mapping[str, Any], secret: str) -> ProviderError:
    """Map an error frame (``{error, error_code, code}``) as the SDK classifies it."""
    error_code = str(frame.get("error_code") or "")[:80]
    status = frame.get("code") if isinstance(frame.get("code"), int) else None
    message = redact(str(frame.get("error") or ""), secret)[:MAX_ERROR_MESSAGE_CHARS]
    label = f" ({error_code})" if error_code else ""
    if error_code == "UNAUTHORIZED" or status in (401, 403):
        return ProviderError("unauthorized", f"KugelAudio refused the credentials{label}")
    if error_code in ("RATE_LIMITED", "TOO_MANY_CONTEXTS") or status == 429:
        return ProviderError(
            "rate_limited", f"KugelAudio rate limited the request{label}: {message}", retryable=True
        )
    retryable = error_code in ("MODEL_UNAVAILABLE", "INTERNAL_ERROR") or (
        status is not None and status >= 500
    )
    return ProviderError("provider_failed", f"KugelAudio failed{label}: {message}", retryable=retryable)


def _close_error(code: int | None, reason: str, secret: str) -> ProviderError:
    reason = redact(reason, secret)[:MAX_ERROR_MESSAGE_CHARS]
    known = _CLOSE_CODES.get(code) if code is not None else None
    if known is not None:
        kind, what, retryable = known
        detail = f": {reason}" if reason and kind != "unauthorized" else ""
        return ProviderError(kind, f"KugelAudio {what} (close {code}){detail}", retryable=retryable)
    detail = f": {reason}" if reason else ""
    return ProviderError(
        "provider_failed",
        f"KugelAudio closed the stream before it ended (close {code}){detail}",
        retryable=True,
    )


class _Closed(Exception):
    def __init__(self, code: int | None, reason: str) -> None:
        super().__init__(code, reason)
        self.code = code
        self.reason = reason


class _WebSocket:
    """A minimal client WebSocket on ``wsproto``: no background task, so it may live in a
    generator. Text frames only; pings answered while receiving."""

    def __init__(self, base_url: str, target: str, *, secret: str) -> None:
        parts = urllib.parse.urlsplit(base_url)
        self._tls = parts.scheme == "https"
        self._host = parts.hostname or ""
        self._port = parts.port or (443 if self._tls else 80)
        self._target = (parts.path.rstrip("/") + target) or "/"
        self._secret = secret
        self._stream: trio.abc.Stream | None = None
        self._ws = wsproto.WSConnection(wsproto.ConnectionType.CLIENT)
        self._pending: list[ws_events.Event] = []
        self._text: list[str] = []
        self._closed = False

    async def connect(self) -> None:
        try:
            tcp = await trio.open_tcp_stream(self._host, self._port)
        except OSError as exc:
            raise ProviderError(
                "unavailable", f"cannot reach KugelAudio: {type(exc).__name__}", retryable=True
            ) from None
        stream: trio.abc.Stream = tcp
        if self._tls:
            stream = trio.SSLStream(
                tcp, ssl.create_default_context(), server_hostname=self._host, https_compatible=True
            )
        self._stream = stream
        host = self._host if self._port in (80, 443) else f"{self._host}:{self._port}"
        await self._write(ws_events.Request(host=host, target=self._target))
        status = 0
        headers: dict[str, str] = {}
        body = bytearray()
        for _ in range(_MAX_FRAMES):
            event = await self._next_event()
            if isinstance(event, ws_events.AcceptConnection):
                return
            if isinstance(event, ws_events.RejectConnection):
                status = event.status_code
                headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in event.headers}
                if not event.has_body:
                    break
            elif isinstance(event, ws_events.RejectData):
                if len(body) < 64 * 1024:
                    body += event.data
                if event.body_finished:
                    break
        self._closed = True
        if status == 0:
            raise ProviderError("provider_failed", "KugelAudio did not upgrade the connection")
        if status == 403:  # the service answers a bad key on the upgrade with 403
            raise ProviderError("unauthorized", "KugelAudio refused the credentials: HTTP 403")
        raise status_error(_SERVICE, status, httpx.Headers(headers), bytes(body), self._secret)

    async def send_text(self, text: str) -> None:
        try:
            await self._write(ws_events.TextMessage(data=text))
        except _Closed as closed:
            raise _close_error(closed.code, closed.reason, self._secret) from None

    async def receive_text(self) -> str:
        """The next whole text message; a close becomes ``ProviderError``."""
        size = 0
        for _ in range(_MAX_FRAMES):
            try:
                event = await self._next_event()
            except _Closed as closed:
                raise _close_error(closed.code, closed.reason, self._secret) from None
            if isinstance(event, ws_events.TextMessage):
                self._text.append(event.data)
                size += len(event.data)
                if size > _MAX_FRAME_BYTES:
                    raise ProviderError("provider_failed", "KugelAudio sent an oversized frame")
                if event.message_finished:
                    text = "".join(self._text)
                    self._text.clear()
                    return text
            elif isinstance(event, ws_events.BytesMessage):
                raise ProviderError("provider_failed", "KugelAudio sent an unexpected binary frame")
            elif isinstance(event, ws_events.Ping):
                await self._write(event.response())
            elif isinstance(event, ws_events.CloseConnection):
                self._closed = True
                with contextlib.suppress(_Closed, ProviderError):
                    await self._write(event.response())
                raise _close_error(event.code, event.reason or "", self._secret)
        raise ProviderError("provider_failed", "KugelAudio sent too many control frames")

    async def close(self) -> None:
        """Say goodbye (best effort) and close the socket."""
        if self._stream is None:
            return
        if not self._closed and self._ws.state is ConnectionState.OPEN:
            self._closed = True
            with contextlib.suppress(
                _Closed, ProviderError, trio.BrokenResourceError, trio.ClosedResourceError
            ):
                await self._write(ws_events.CloseConnection(code=1000))
        await self.abort()

    async def abort(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            await trio.aclose_forcefully(stream)

    async def _write(self, event: ws_events.Event) -> None:
        assert self._stream is not None
        try:
            data = self._ws.send(event)
        except wsproto.utilities.LocalProtocolError:
            raise _Closed(None, "") from None
        try:
            await self._stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            raise ProviderError("provider_failed", "KugelAudio cut the connection", retryable=True) from None

    async def _next_event(self) -> ws_events.Event:
        assert self._stream is not None
        for _ in range(_MAX_FRAMES):
            if self._pending:
                return self._pending.pop(0)
            self._pending.extend(self._ws.events())
            if self._pending:
                continue
            try:
                data = await self._stream.receive_some(_RECEIVE_BYTES)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                data = b""
            if not data:
                if self._closed:
                    raise _Closed(None, "")
                raise ProviderError("provider_failed", "KugelAudio cut the connection", retryable=True)
            try:
                self._ws.receive_data(bytes(data))
            except wsproto.utilities.RemoteProtocolError:
                raise ProviderError("provider_failed", "KugelAudio broke the WebSocket protocol") from None
        raise ProviderError("provider_failed", "KugelAudio sent too many frames")


def _build_llm(model: str, *, base_url: str | None, api_key_env: str | None) -> KugelAudioLLM:
    return KugelAudioLLM(model, base_url=base_url)  # the key is always KUGELAUDIO_API_KEY


def _build_tts(voice: str | int | None, *, model: str | None) -> KugelAudioTTS:
    if voice is None:
        raise ProviderError("invalid_settings", "KugelAudio needs a numeric voice id (see list_voices)")
    return KugelAudioTTS(voice, model=model)


def _voice_problem(voice: str | int | float) -> str | None:
    if isinstance(voice, str) and not voice.isdigit():
        return "a KugelAudio voice is a numeric voice id"
    if isinstance(voice, float) and not voice.is_integer():
        return "a KugelAudio voice is a numeric voice id"
    return None


PROVIDES = (
    ChatModelProvider(name="kugelaudio", build=_build_llm),
    SynthesizerProvider(name="kugelaudio", build=_build_tts, voice_problem=_voice_problem),
)
