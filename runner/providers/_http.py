"""The HTTP machinery the HTTP providers share (OpenAI, Anthropic, Azure, KugelAudio).

Errors mapped to ``ProviderError`` (the key never quoted), bodies always run to their end,
server-sent events parsed with bounds, replies' JSON decoded, audio sent as a WAV file.
"""

from __future__ import annotations

import datetime
import email.utils
import io
import json
import math
import os
import wave
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import attrs
import httpx
import trio

from ._types import ProviderError

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
MAX_ERROR_MESSAGE_CHARS = 300


def env_key(env_var: str | None) -> str | None:
    if not env_var:
        return None
    value = os.environ.get(env_var, "").strip()
    return value or None


def redact(text: str, secret: str | None) -> str:
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


def error_detail(body: bytes) -> tuple[str, str]:
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


def status_error(
    service: str, status: int, headers: httpx.Headers, body: bytes, secret: str | None
) -> ProviderError:
    """Map an HTTP error answer to a ``ProviderError``; the key never reaches the message."""
    kind, message = error_detail(body)
    kind = redact(kind, secret)[:80]
    message = redact(message, secret)[:MAX_ERROR_MESSAGE_CHARS]
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


def transport_error(service: str, exc: httpx.TransportError, *, connected: bool) -> ProviderError:
    name = type(exc).__name__
    if not connected and isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout)):
        return ProviderError("unavailable", f"cannot reach {service}: {name}", retryable=True)
    if isinstance(exc, httpx.TimeoutException):
        return ProviderError("provider_failed", f"{service} stopped sending ({name})", retryable=True)
    return ProviderError("provider_failed", f"{service} cut the connection ({name})", retryable=True)


@asynccontextmanager
async def iterate_body(
    response: httpx.Response, chunks: AsyncIterator[_T]
) -> AsyncIterator[AsyncIterator[_T]]:
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


async def drain(events: AsyncIterator[Any]) -> None:
    """Read what follows the end of a reply (normally just the end of the body), briefly, so
    the connection can serve the next request; anything odd there is not our concern."""
    with trio.move_on_after(_DRAIN_S):
        try:
            for _ in range(_MAX_STREAM_EVENTS):
                await events.__anext__()
        except (StopAsyncIteration, ProviderError):
            pass


async def read_capped(response: httpx.Response, limit: int) -> bytes:
    data = bytearray()
    async with iterate_body(response, response.aiter_bytes()) as chunks:
        async for chunk in chunks:
            data += chunk
            if len(data) >= limit:
                break
    return bytes(data[:limit])


@asynccontextmanager
async def open_response(
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
    async with maybe_client(http) as client:
        request = client.build_request(
            "POST", url, headers=dict(headers), json=json_body, files=files, data=data
        )
        try:
            response = await client.send(request, stream=True)
        except httpx.TransportError as exc:
            raise transport_error(service, exc, connected=False) from None
        try:
            if response.status_code >= 400:
                try:
                    body = await read_capped(response, _MAX_ERROR_BODY_BYTES)
                except httpx.TransportError:
                    body = b""
                raise status_error(service, response.status_code, response.headers, body, secret)
            yield response
        finally:
            await response.aclose()


@asynccontextmanager
async def maybe_client(http: httpx.AsyncClient | None) -> AsyncIterator[httpx.AsyncClient]:
    if http is not None:
        yield http
        return
    async with httpx.AsyncClient(timeout=_TIMEOUT) as client:
        yield client


@attrs.define
class SSEEvent:
    event: str
    data: str


async def sse_events(
    response: httpx.Response, service: str, *, max_stream_s: float
) -> AsyncGenerator[SSEEvent, None]:
    """Parse a ``text/event-stream`` body into events (``event:`` and joined ``data:`` lines).

    Ends when the body ends; transport failures become ``ProviderError``. Bounded by
    ``_MAX_STREAM_EVENTS`` and by ``max_stream_s`` of total time.
    """
    deadline = trio.current_time() + max_stream_s
    event_name = ""
    data_lines: list[str] = []
    count = 0
    async with iterate_body(response, response.aiter_lines()) as lines:
        while True:
            try:
                line = await lines.__anext__()
            except StopAsyncIteration:
                break
            except httpx.TransportError as exc:
                raise transport_error(service, exc, connected=True) from None
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
                    yield SSEEvent(event=event_name or "message", data="\n".join(data_lines))
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
        yield SSEEvent(event=event_name or "message", data="\n".join(data_lines))


def decode_json_object(text: str, service: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        raise ProviderError("provider_failed", f"{service} sent a malformed chunk") from None
    if not isinstance(value, dict):
        raise ProviderError("provider_failed", f"{service} sent a chunk that is not an object")
    return value


def decode_arguments(text: str, service: str, tool: str) -> dict[str, Any]:
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


def int_or_zero(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def wav(pcm: bytes, sample_rate_hz: int) -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(sample_rate_hz)
        out.writeframes(pcm[: len(pcm) - len(pcm) % 2])
    return buffer.getvalue()
