"""OpenAI (and any OpenAI-compatible endpoint): chat completions, speech and transcription.

Speaks the HTTP wire formats directly through ``httpx`` (which runs under Trio through anyio):
``POST /chat/completions`` streamed as server-sent events, ``POST /audio/speech`` streamed as raw
PCM, ``POST /audio/transcriptions`` as a multipart upload of a WAV file.

The module also holds the small HTTP helpers the other HTTP providers share (error mapping,
server-sent events); they are private.
"""

from __future__ import annotations

import datetime
import email.utils
import io
import json
import math
import os
import wave
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from contextlib import aclosing, asynccontextmanager
from typing import Any, TypeVar

import attrs
import httpx
import trio

from ._types import (
    ChatMessage,
    LLMEvent,
    ProviderError,
    TextDelta,
    ToolCall,
    ToolSpec,
    Transcript,
    Usage,
)

OPENAI_BASE_URL = "https://api.openai.com/v1"

_T = TypeVar("_T")

#: Connect within 10 s; between two pieces of a streamed body, at most 60 s of silence.
_TIMEOUT = httpx.Timeout(60.0, connect=10.0)
#: The most server-sent events one reply may hold before we call the stream broken.
_MAX_STREAM_EVENTS = 200_000
#: The most bytes of an error body we read (the rest is dropped).
_MAX_ERROR_BODY_BYTES = 64 * 1024
#: The longest we wait for a body to end after the reply's last event.
_DRAIN_S = 0.25
#: The longest we spend closing a body that was left early.
_RUN_DOWN_S = 1.0
#: How much of a service's error message we quote.
_MAX_ERROR_MESSAGE_CHARS = 300


# --------------------------------------------------------------------------------------------
# Shared HTTP machinery (private; also used by the Anthropic provider)
# --------------------------------------------------------------------------------------------


def _env_key(env_var: str | None) -> str | None:
    if not env_var:
        return None
    value = os.environ.get(env_var, "").strip()
    return value or None


def _redact(text: str, secret: str | None) -> str:
    if secret:
        text = text.replace(secret, "[redacted]")
    return text


def _retry_after_s(headers: httpx.Headers) -> float | None:
    """The wait a 429 asks for, from ``retry-after-ms`` or ``Retry-After`` (seconds or a date)."""
    ms = headers.get("retry-after-ms")
    if ms is not None:
        try:
            value = float(ms) / 1000.0
        except ValueError:
            value = math.nan
        if math.isfinite(value) and value >= 0:
            return value
    raw = headers.get("retry-after")
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(raw)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=datetime.UTC)
        return max(0.0, (when - datetime.datetime.now(datetime.UTC)).total_seconds())
    return value if math.isfinite(value) and value >= 0 else None


def _error_detail(body: bytes) -> tuple[str, str]:
    """``(type, message)`` of an OpenAI- or Anthropic-shaped error body, best effort."""
    try:
        payload = json.loads(body)
    except ValueError:
        return "", body.decode("utf-8", "replace").strip()
    if isinstance(payload, Mapping):
        error = payload.get("error", payload)
        if isinstance(error, Mapping):
            kind = error.get("type") or error.get("code") or ""
            message = error.get("message") or ""
            return str(kind), str(message)
        if isinstance(error, str):
            return "", error
    return "", ""


def _status_error(
    service: str, status: int, headers: httpx.Headers, body: bytes, secret: str | None
) -> ProviderError:
    """Map an HTTP error answer to a ``ProviderError``; the key never reaches the message."""
    kind, message = _error_detail(body)
    kind = _redact(kind, secret)[:80]
    message = _redact(message, secret)[:_MAX_ERROR_MESSAGE_CHARS]
    suffix = f" ({kind})" if kind else ""
    if status in (401, 403):
        # Services echo part of a rejected key in the message: quote only the error type.
        return ProviderError("unauthorized", f"{service} refused the credentials: HTTP {status}{suffix}")
    detail = f": {message}" if message else ""
    if status == 429:
        wait = _retry_after_s(headers)
        note = f"; retry after {wait:g} s" if wait is not None else ""
        return ProviderError(
            "rate_limited",
            f"{service} rate limited the request: HTTP 429{suffix}{note}{detail}",
            retryable=True,
        )
    retryable = status >= 500 or status in (408, 409)
    return ProviderError(
        "provider_failed", f"{service} answered HTTP {status}{suffix}{detail}", retryable=retryable
    )


def _transport_error(service: str, exc: httpx.TransportError, *, connected: bool) -> ProviderError:
    name = type(exc).__name__
    if not connected and isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout)):
        return ProviderError("unavailable", f"cannot reach {service}: {name}", retryable=True)
    if isinstance(exc, httpx.TimeoutException):
        return ProviderError("provider_failed", f"{service} stopped sending ({name})", retryable=True)
    return ProviderError("provider_failed", f"{service} cut the connection ({name})", retryable=True)


@asynccontextmanager
async def _body(response: httpx.Response, chunks: AsyncIterator[_T]) -> AsyncIterator[AsyncIterator[_T]]:
    """Iterate one of ``response``'s body iterators and always run it to its end.

    httpx's body iterators are async generators nested several deep: closing the outer one
    early leaves the inner ones to the garbage collector (and Trio warns). So an iterator left
    early is run down instead: the connection is closed first, so the rest ends at once.
    """
    try:
        yield chunks
    finally:
        if getattr(chunks, "ag_frame", None) is not None:  # an async generator not yet ended
            with trio.move_on_after(_RUN_DOWN_S, shield=True):
                await response.aclose()
                try:
                    for _ in range(_MAX_STREAM_EVENTS):
                        await chunks.__anext__()
                except Exception:  # noqa: BLE001 - draining a failed stream: whatever it raises now is moot
                    pass


async def _drain(events: AsyncIterator[Any]) -> None:
    """Read what follows the end of a reply (normally just the end of the body), briefly, so
    the connection can serve the next request; anything odd there is not our concern."""
    with trio.move_on_after(_DRAIN_S):
        try:
            for _ in range(_MAX_STREAM_EVENTS):
                await events.__anext__()
        except (StopAsyncIteration, ProviderError):
            pass


async def _read_capped(response: httpx.Response, limit: int) -> bytes:
    data = bytearray()
    async with _body(response, response.aiter_bytes()) as chunks:
        async for chunk in chunks:
            data += chunk
            if len(data) >= limit:
                break
    return bytes(data[:limit])


@asynccontextmanager
async def _open_response(
    http: httpx.AsyncClient | None,
    service: str,
    url: str,
    *,
    headers: Mapping[str, str],
    secret: str | None,
    json_body: Any = None,
    files: Any = None,
    data: Any = None,
) -> AsyncIterator[httpx.Response]:
    """POST and yield a successful streaming response; errors become ``ProviderError``.

    With no ``http`` client a private one lives for this one request.
    """
    async with _maybe_client(http) as client:
        request = client.build_request(
            "POST", url, headers=dict(headers), json=json_body, files=files, data=data
        )
        try:
            response = await client.send(request, stream=True)
        except httpx.TransportError as exc:
            raise _transport_error(service, exc, connected=False) from None
        try:
            if response.status_code >= 400:
                try:
                    body = await _read_capped(response, _MAX_ERROR_BODY_BYTES)
                except httpx.TransportError:
                    body = b""
                raise _status_error(service, response.status_code, response.headers, body, secret)
            yield response
        finally:
            await response.aclose()


@asynccontextmanager
async def _maybe_client(http: httpx.AsyncClient | None) -> AsyncIterator[httpx.AsyncClient]:
    if http is not None:
        yield http
        return
    async with httpx.AsyncClient(timeout=_TIMEOUT) as client:
        yield client


@attrs.define
class _SSEEvent:
    event: str
    data: str


async def _sse_events(
    response: httpx.Response, service: str, *, max_stream_s: float
) -> AsyncGenerator[_SSEEvent, None]:
    """Parse a ``text/event-stream`` body into events (``event:`` and joined ``data:`` lines).

    Ends when the body ends; transport failures become ``ProviderError``. Bounded by
    ``_MAX_STREAM_EVENTS`` and by ``max_stream_s`` of total time.
    """
    deadline = trio.current_time() + max_stream_s
    event_name = ""
    data_lines: list[str] = []
    count = 0
    async with _body(response, response.aiter_lines()) as lines:
        while True:
            try:
                line = await lines.__anext__()
            except StopAsyncIteration:
                break
            except httpx.TransportError as exc:
                raise _transport_error(service, exc, connected=True) from None
            if trio.current_time() > deadline:
                raise ProviderError(
                    "provider_failed",
                    f"{service} stream ran past {max_stream_s:g} s",
                    retryable=True,
                )
            if line == "":
                if data_lines:
                    count += 1
                    if count > _MAX_STREAM_EVENTS:
                        raise ProviderError(
                            "provider_failed",
                            f"{service} stream exceeded {_MAX_STREAM_EVENTS} events",
                        )
                    yield _SSEEvent(event=event_name or "message", data="\n".join(data_lines))
                event_name = ""
                data_lines = []
                continue
            if line.startswith(":"):
                continue
            field, _, value = line.partition(":")
            if value.startswith(" "):
                value = value[1:]
            if field == "data":
                data_lines.append(value)
            elif field == "event":
                event_name = value
    # A last event the server did not end with a blank line still counts (a cut one is
    # usually half a JSON object, which the caller rejects).
    if data_lines:
        yield _SSEEvent(event=event_name or "message", data="\n".join(data_lines))


def _decode_json_object(text: str, service: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        raise ProviderError("provider_failed", f"{service} sent a malformed chunk") from None
    if not isinstance(value, dict):
        raise ProviderError("provider_failed", f"{service} sent a chunk that is not an object")
    return value


def _decode_arguments(text: str, service: str, tool: str) -> dict[str, Any]:
    if not text.strip():
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        raise ProviderError(
            "provider_failed", f"{service} sent malformed arguments for tool {tool!r}"
        ) from None
    if not isinstance(value, dict):
        raise ProviderError(
            "provider_failed", f"{service} sent arguments for tool {tool!r} that are not an object"
        )
    return value


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


# --------------------------------------------------------------------------------------------
# Chat completions
# --------------------------------------------------------------------------------------------


def _chat_message(message: ChatMessage) -> dict[str, Any]:
    if message.role == "tool":
        return {
            "role": "tool",
            "tool_call_id": message.tool_call_id or "",
            "content": message.content,
        }
    if message.role == "assistant" and message.tool_calls:
        return {
            "role": "assistant",
            "content": message.content or None,
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {
                        "name": call.name,
                        "arguments": json.dumps(dict(call.arguments), separators=(",", ":")),
                    },
                }
                for call in message.tool_calls
            ],
        }
    return {"role": message.role, "content": message.content}


def _chat_tool(tool: ToolSpec) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description,
            "parameters": dict(tool.parameters),
        },
    }


@attrs.define
class _PendingCall:
    id: str = ""
    name: str = ""
    arguments: str = ""


def _service_name(provider: str) -> str:
    return "OpenAI" if provider == "openai" else provider


def _auth_headers(api_key: str | None) -> dict[str, str]:
    return {"authorization": f"Bearer {api_key}"} if api_key else {}


def _resolve_key(
    api_key: str | None, api_key_env: str | None, provider: str
) -> tuple[str | None, str | None]:
    env = api_key_env if api_key_env is not None else ("OPENAI_API_KEY" if provider == "openai" else None)
    return (api_key if api_key is not None else _env_key(env)), env


def _missing_key(api_key: str | None, env: str | None, provider: str) -> str | None:
    """OpenAI always needs a key; a compatible endpoint only when told which variable holds it."""
    if api_key is None and (provider == "openai" or env is not None):
        return env or "OPENAI_API_KEY"
    return None


def _require_key(api_key: str | None, env: str | None, provider: str) -> None:
    """OpenAI itself always needs a key; a compatible endpoint may take none."""
    if api_key is None and provider == "openai":
        raise ProviderError(
            "unauthorized", f"no API key for OpenAI: set {env or 'OPENAI_API_KEY'} or pass api_key"
        )


class OpenAILLM:
    """A chat model behind the OpenAI Chat Completions API, streamed.

    Serves OpenAI itself and any OpenAI-compatible endpoint (``provider="openai-compatible"``
    with its ``base_url``). The key comes from ``api_key`` or else the environment:
    ``OPENAI_API_KEY`` for OpenAI, and for other endpoints only the variable named by
    ``api_key_env`` (an OpenAI key is never sent to a third-party URL). A compatible endpoint
    with no key is called without an ``Authorization`` header.

    Args:
        model: The model name the service knows, e.g. ``"gpt-4o-mini"``.
        api_key: The key; never shown in errors or ``repr``.
        base_url: The API root, ending before ``/chat/completions``.
        provider: ``"openai"`` or ``"openai-compatible"`` (any label is kept as given).
        http: A shared ``httpx.AsyncClient`` (reuses connections); by default each request
            opens its own.
        api_key_env: The environment variable holding the key.
        max_stream_s: The longest one streamed reply may take.
    """

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None = None,
        base_url: str = OPENAI_BASE_URL,
        provider: str = "openai",
        http: httpx.AsyncClient | None = None,
        api_key_env: str | None = None,
        max_stream_s: float = 600.0,
    ) -> None:
        self.provider = provider
        self.model = model
        self.base_url = base_url.rstrip("/")
        self.max_stream_s = max_stream_s
        self._http = http
        self._api_key, self._api_key_env = _resolve_key(api_key, api_key_env, provider)

    @property
    def missing_key(self) -> str | None:
        """The variable to set when this provider needs a key and has none (checked at warm-up)."""
        return _missing_key(self._api_key, self._api_key_env, self.provider)

    def __repr__(self) -> str:
        return f"OpenAILLM(model={self.model!r}, provider={self.provider!r}, base_url={self.base_url!r})"

    def request_body(self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec] = ()) -> dict[str, Any]:
        """The JSON body of the streamed chat completion request for these inputs."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [_chat_message(m) for m in messages],
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if tools:
            body["tools"] = [_chat_tool(t) for t in tools]
        return body

    async def stream(
        self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec] = ()
    ) -> AsyncGenerator[LLMEvent, None]:
        """Yield text deltas as written, then the tool calls, then one ``Usage``.

        Raises:
            ProviderError: on an HTTP error, a failed connection, or a stream cut before
                ``[DONE]`` (then after the deltas already yielded).
        """
        service = _service_name(self.provider)
        _require_key(self._api_key, self._api_key_env, self.provider)
        state = _ChatStream(service=service, model=self.model, secret=self._api_key)
        async with _open_response(
            self._http,
            service,
            f"{self.base_url}/chat/completions",
            headers={**_auth_headers(self._api_key), "accept": "text/event-stream"},
            secret=self._api_key,
            json_body=self.request_body(messages, tools),
        ) as response:
            events = _sse_events(response, service, max_stream_s=self.max_stream_s)
            async with aclosing(events):
                async for event in events:
                    if event.data.strip() == "[DONE]":
                        state.done = True
                        break
                    for text in state.feed(event.data):
                        yield TextDelta(text=text)
                if state.done:
                    await _drain(events)
        for final in state.finish():
            yield final


@attrs.define
class _ChatStream:
    """What a chat completions stream has said so far."""

    service: str
    model: str
    secret: str | None = attrs.field(repr=False)
    done: bool = False
    usage: Usage | None = None
    pending: dict[int, _PendingCall] = attrs.Factory(dict)

    def feed(self, data: str) -> list[str]:
        """Take one chunk; return its text (raises ``ProviderError`` on an error chunk)."""
        chunk = _decode_json_object(data, self.service)
        if chunk.get("error"):
            kind, message = _error_detail(data.encode())
            message = _redact(message, self.secret)[:_MAX_ERROR_MESSAGE_CHARS]
            raise ProviderError(
                "provider_failed",
                f"{self.service} failed mid-stream ({kind or 'error'}): {message}",
                retryable=True,
            )
        if isinstance(chunk.get("model"), str) and chunk["model"]:
            self.model = chunk["model"]
        texts: list[str] = []
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, Mapping) or _int(choice.get("index")) != 0:
                continue
            delta = choice.get("delta") or {}
            if not isinstance(delta, Mapping):
                raise ProviderError("provider_failed", f"{self.service} sent a malformed delta")
            text = delta.get("content")
            if isinstance(text, str) and text:
                texts.append(text)
            for piece in delta.get("tool_calls") or ():
                self._accumulate_call(piece)
        raw_usage = chunk.get("usage")
        if isinstance(raw_usage, Mapping):
            self.usage = _chat_usage(raw_usage, self.model)
        return texts

    def finish(self) -> list[LLMEvent]:
        """The tool calls and the usage, once the stream ended; raises if it was cut."""
        if not self.done:
            raise ProviderError(
                "provider_failed", f"{self.service} ended the stream before [DONE]", retryable=True
            )
        events: list[LLMEvent] = []
        for index in sorted(self.pending):
            call = self.pending[index]
            if not call.name:
                raise ProviderError("provider_failed", f"{self.service} sent a tool call with no name")
            events.append(
                ToolCall(
                    id=call.id or f"call_{index}",
                    name=call.name,
                    arguments=_decode_arguments(call.arguments, self.service, call.name),
                )
            )
        events.append(self.usage if self.usage is not None else Usage(model=self.model))
        return events

    def _accumulate_call(self, piece: Any) -> None:
        if not isinstance(piece, Mapping):
            raise ProviderError("provider_failed", f"{self.service} sent a malformed tool call")
        call = self.pending.setdefault(_int(piece.get("index")), _PendingCall())
        if isinstance(piece.get("id"), str) and piece["id"]:
            call.id = piece["id"]
        function = piece.get("function") or {}
        if not isinstance(function, Mapping):
            raise ProviderError("provider_failed", f"{self.service} sent a malformed tool call")
        name = function.get("name")
        if isinstance(name, str) and name:
            # OpenAI sends the name once; some compatible servers repeat it whole or split it.
            if not call.name or name.startswith(call.name):
                call.name = name
            else:
                call.name += name
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            call.arguments += arguments


def _chat_usage(raw: Mapping[str, Any], model: str) -> Usage:
    prompt_details = raw.get("prompt_tokens_details") or {}
    completion_details = raw.get("completion_tokens_details") or {}
    return Usage(
        model=model,
        input_tokens=_int(raw.get("prompt_tokens")),
        output_tokens=_int(raw.get("completion_tokens")),
        cached_tokens=_int(prompt_details.get("cached_tokens")) if isinstance(prompt_details, Mapping) else 0,
        thought_tokens=_int(completion_details.get("reasoning_tokens"))
        if isinstance(completion_details, Mapping)
        else 0,
    )


# --------------------------------------------------------------------------------------------
# Speech
# --------------------------------------------------------------------------------------------


class OpenAITTS:
    """Text to speech through ``POST /audio/speech`` as raw 24 kHz 16-bit mono PCM, streamed.

    Args:
        model: The speech model, e.g. ``"gpt-4o-mini-tts"`` or ``"tts-1"``.
        voice: The voice name, e.g. ``"alloy"``.
        api_key: The key; never shown in errors or ``repr``.
        base_url: The API root, ending before ``/audio/speech``.
        provider: ``"openai"`` or ``"openai-compatible"``.
        http: A shared ``httpx.AsyncClient``; by default each request opens its own.
        api_key_env: The environment variable holding the key (as for ``OpenAILLM``).
        instructions: Optional speaking-style instructions (models that take them).
        max_audio_s: The most audio one request may return.
    """

    sample_rate_hz = 24_000

    def __init__(
        self,
        model: str = "gpt-4o-mini-tts",
        *,
        voice: str = "alloy",
        api_key: str | None = None,
        base_url: str = OPENAI_BASE_URL,
        provider: str = "openai",
        http: httpx.AsyncClient | None = None,
        api_key_env: str | None = None,
        instructions: str | None = None,
        max_audio_s: float = 600.0,
    ) -> None:
        self.provider = provider
        self.model = model
        self.voice: str | int | None = voice
        self.base_url = base_url.rstrip("/")
        self.instructions = instructions
        self.max_audio_s = max_audio_s
        self._http = http
        self._api_key, self._api_key_env = _resolve_key(api_key, api_key_env, provider)

    @property
    def missing_key(self) -> str | None:
        """The variable to set when this provider needs a key and has none (checked at warm-up)."""
        return _missing_key(self._api_key, self._api_key_env, self.provider)

    def __repr__(self) -> str:
        return (
            f"OpenAITTS(model={self.model!r}, voice={self.voice!r}, provider={self.provider!r}, "
            f"base_url={self.base_url!r})"
        )

    async def synthesize(self, text: str) -> AsyncGenerator[bytes, None]:
        """Yield the speech of ``text`` as 16-bit little-endian PCM chunks of whole samples.

        Raises:
            ProviderError: on an HTTP error, a failed connection or a cut body.
        """
        service = _service_name(self.provider)
        _require_key(self._api_key, self._api_key_env, self.provider)
        body: dict[str, Any] = {
            "model": self.model,
            "input": text,
            "voice": self.voice,
            "response_format": "pcm",
        }
        if self.instructions:
            body["instructions"] = self.instructions
        limit = int(self.max_audio_s * self.sample_rate_hz * 2)
        total = 0
        carry = b""
        async with (
            _open_response(
                self._http,
                service,
                f"{self.base_url}/audio/speech",
                headers=_auth_headers(self._api_key),
                secret=self._api_key,
                json_body=body,
            ) as response,
            _body(response, response.aiter_bytes()) as chunks,
        ):
            while True:
                try:
                    chunk = await chunks.__anext__()
                except StopAsyncIteration:
                    break
                except httpx.TransportError as exc:
                    raise _transport_error(service, exc, connected=True) from None
                total += len(chunk)
                if total > limit:
                    raise ProviderError(
                        "provider_failed",
                        f"{service} sent more than {self.max_audio_s:g} s of audio",
                    )
                data = carry + chunk
                whole = len(data) - len(data) % 2
                carry = data[whole:]
                if whole:
                    yield data[:whole]


def _wav(pcm: bytes, sample_rate_hz: int) -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(sample_rate_hz)
        out.writeframes(pcm[: len(pcm) - len(pcm) % 2])
    return buffer.getvalue()


class OpenAISTT:
    """Speech to text through ``POST /audio/transcriptions`` (the PCM is sent as a WAV file).

    Args:
        model: The transcription model, e.g. ``"gpt-4o-mini-transcribe"`` or ``"whisper-1"``.
        language: An ISO-639-1 hint such as ``"en"``, or ``None`` to let the model detect it.
        api_key: The key; never shown in errors or ``repr``.
        base_url: The API root, ending before ``/audio/transcriptions``.
        provider: ``"openai"`` or ``"openai-compatible"``.
        http: A shared ``httpx.AsyncClient``; by default each request opens its own.
        api_key_env: The environment variable holding the key (as for ``OpenAILLM``).
    """

    def __init__(
        self,
        model: str = "gpt-4o-mini-transcribe",
        *,
        language: str | None = None,
        api_key: str | None = None,
        base_url: str = OPENAI_BASE_URL,
        provider: str = "openai",
        http: httpx.AsyncClient | None = None,
        api_key_env: str | None = None,
    ) -> None:
        self.provider = provider
        self.model = model
        self.language = language
        self.base_url = base_url.rstrip("/")
        self._http = http
        self._api_key, self._api_key_env = _resolve_key(api_key, api_key_env, provider)

    @property
    def missing_key(self) -> str | None:
        """The variable to set when this provider needs a key and has none (checked at warm-up)."""
        return _missing_key(self._api_key, self._api_key_env, self.provider)

    def __repr__(self) -> str:
        return (
            f"OpenAISTT(model={self.model!r}, language={self.language!r}, "
            f"provider={self.provider!r}, base_url={self.base_url!r})"
        )

    async def transcribe(self, pcm: bytes, sample_rate_hz: int) -> Transcript:
        """Transcribe one utterance of 16-bit little-endian mono PCM.

        Raises:
            ProviderError: on an HTTP error, a failed connection or an unreadable answer.
        """
        service = _service_name(self.provider)
        _require_key(self._api_key, self._api_key_env, self.provider)
        if sample_rate_hz <= 0:
            raise ValueError(f"sample_rate_hz must be positive, got {sample_rate_hz}")
        data = {"model": self.model, "response_format": "json"}
        if self.language:
            data["language"] = self.language
        files = {"file": ("audio.wav", _wav(pcm, sample_rate_hz), "audio/wav")}
        async with _open_response(
            self._http,
            service,
            f"{self.base_url}/audio/transcriptions",
            headers=_auth_headers(self._api_key),
            secret=self._api_key,
            files=files,
            data=data,
        ) as response:
            try:
                body = await _read_capped(response, 4 * 1024 * 1024)
            except httpx.TransportError as exc:
                raise _transport_error(service, exc, connected=True) from None
        payload = _decode_json_object(body.decode("utf-8", "replace"), service)
        text = payload.get("text")
        if not isinstance(text, str):
            raise ProviderError("provider_failed", f"{service} sent a transcription with no text")
        return Transcript(text=text.strip(), audio_seconds=(len(pcm) // 2) / sample_rate_hz)
