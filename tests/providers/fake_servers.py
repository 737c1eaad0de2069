"""Local fakes of the OpenAI and Anthropic HTTP APIs, speaking their real wire formats.

The real services cannot be reached from tests, so these stand in for them: plain ASGI apps
served by Hypercorn on 127.0.0.1 (port 0) inside the test's nursery. Each fake checks the
request the way the service would (credentials, body shape, tool-call bookkeeping) and answers
400/401 like the service when it is wrong; it records every request for the test to inspect,
and replies from a queue of scripted ``Reply`` objects built by the helpers below.
"""

from __future__ import annotations

import email.parser
import email.policy
import io
import json
import logging
import wave
from collections import deque
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import attrs
import hypercorn
import hypercorn.trio
import trio
import trio.lowlevel

_log = logging.getLogger("tests.fake_servers")


class _CutConnection(Exception):
    """Raised inside the app to make Hypercorn drop the connection mid-body."""


@attrs.frozen(kw_only=True)
class Recorded:
    """One request as the fake received it."""

    method: str
    path: str
    headers: Mapping[str, str]
    body: bytes
    client_port: int

    def json(self) -> Any:
        return json.loads(self.body)


@attrs.frozen(kw_only=True)
class Reply:
    """A scripted answer: status, headers, the body in pieces (each its own write).

    ``cut=True`` drops the connection after the pieces instead of ending the body;
    ``stall=True`` keeps it open, silent, until the server stops.
    """

    status: int = 200
    headers: tuple[tuple[str, str], ...] = ()
    chunks: tuple[bytes, ...] = ()
    cut: bool = False
    stall: bool = False


def json_reply(status: int, payload: Any, headers: Iterable[tuple[str, str]] = ()) -> Reply:
    return Reply(
        status=status,
        headers=(("content-type", "application/json"), *headers),
        chunks=(json.dumps(payload).encode(),),
    )


def sse_reply(events: Sequence[bytes], *, cut: bool = False, stall: bool = False) -> Reply:
    return Reply(
        headers=(("content-type", "text/event-stream"), ("cache-control", "no-cache")),
        chunks=tuple(events),
        cut=cut,
        stall=stall,
    )


class _FakeService:
    """Records requests and answers from a queue; subclasses check requests and route."""

    def __init__(self, *, api_key: str) -> None:
        self.api_key = api_key
        #: ``http://127.0.0.1:<port>`` once served (the test sets it from ``open_fake_server``).
        self.root = ""
        self.requests: list[Recorded] = []
        self._replies: deque[Reply] = deque()
        self._arrived = trio.Event()

    def enqueue(self, *replies: Reply) -> None:
        self._replies.extend(replies)

    def next_reply(self) -> Reply:
        if not self._replies:
            return json_reply(500, {"error": {"message": "the test scripted no reply"}})
        return self._replies.popleft()

    def answer(self, request: Recorded) -> Reply:
        raise NotImplementedError

    async def wait_requests(self, count: int) -> None:
        """Wait until ``count`` requests have come in (the caller bounds the wait)."""
        while len(self.requests) < count:
            await self._arrived.wait()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            for _ in range(2):
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                else:
                    await send({"type": "lifespan.shutdown.complete"})
                    return
            return
        if scope["type"] != "http":
            return
        body = b""
        for _ in range(10_000):
            message = await receive()
            if message["type"] != "http.request":
                return
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        request = Recorded(
            method=scope["method"],
            path=scope["path"],
            headers={k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]},
            body=body,
            client_port=scope["client"][1],
        )
        self.requests.append(request)
        self._arrived.set()
        self._arrived = trio.Event()
        reply = self.answer(request)
        await send(
            {
                "type": "http.response.start",
                "status": reply.status,
                "headers": [(k.encode(), v.encode()) for k, v in reply.headers],
            }
        )
        for chunk in reply.chunks:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await trio.lowlevel.checkpoint()
        if reply.cut:
            raise _CutConnection("scripted cut")
        if reply.stall:
            await trio.sleep_forever()
        await send({"type": "http.response.body", "body": b"", "more_body": False})


@asynccontextmanager
async def open_fake_server(app: Any) -> AsyncIterator[str]:
    """Serve ``app`` on 127.0.0.1 at a free port; yield its ``http://host:port`` root."""
    config = hypercorn.Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    config.errorlog = _log
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(partial(hypercorn.trio.serve, app, config, mode="asgi"))
        try:
            yield binds[0]
        finally:
            nursery.cancel_scope.cancel()


# ------------------------------------------------------------------------------------------
# OpenAI
# ------------------------------------------------------------------------------------------


def _openai_error(status: int, message: str, kind: str, code: str | None = None) -> Reply:
    return json_reply(status, {"error": {"message": message, "type": kind, "param": None, "code": code}})


def _check_chat_body(body: Any) -> str | None:
    """What a real chat completions endpoint would reject in this streamed request."""
    if not isinstance(body, dict) or not isinstance(body.get("model"), str):
        return "you must provide a model parameter"
    if body.get("stream") is not True:
        return "this fake only serves stream: true"
    if body.get("stream_options") != {"include_usage": True}:
        return "stream_options.include_usage expected"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "messages must be a non-empty array"
    open_calls: set[str] = set()
    for i, message in enumerate(messages):
        role = message.get("role")
        if role not in ("system", "user", "assistant", "tool", "developer"):
            return f"messages[{i}].role is invalid"
        if role == "assistant" and "tool_calls" in message:
            for call in message["tool_calls"]:
                if call.get("type") != "function" or not isinstance(call.get("id"), str):
                    return f"messages[{i}].tool_calls is invalid"
                json.loads(call["function"]["arguments"])
                open_calls.add(call["id"])
        elif role == "tool":
            if message.get("tool_call_id") not in open_calls:
                return (
                    "messages with role 'tool' must be a response to a preceeding message with 'tool_calls'"
                )
            if not isinstance(message.get("content"), str):
                return f"messages[{i}].content must be a string"
        elif not isinstance(message.get("content"), str):
            return f"messages[{i}].content must be a string"
    for i, tool in enumerate(body.get("tools", ())):
        function = tool.get("function", {})
        if tool.get("type") != "function" or not isinstance(function.get("name"), str):
            return f"tools[{i}] is invalid"
        if function.get("parameters", {}).get("type") != "object":
            return f"tools[{i}].function.parameters must be an object schema"
    return None


def _multipart(content_type: str, body: bytes) -> dict[str, tuple[str | None, bytes]]:
    parser = email.parser.BytesParser(policy=email.policy.HTTP)
    message = parser.parsebytes(b"Content-Type: " + content_type.encode() + b"\r\n\r\n" + body)
    fields: dict[str, tuple[str | None, bytes]] = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        payload = part.get_payload(decode=True)
        fields[str(name)] = (part.get_filename(), payload if isinstance(payload, bytes) else b"")
    return fields


class FakeOpenAI(_FakeService):
    """``/v1/chat/completions``, ``/v1/audio/speech`` and ``/v1/audio/transcriptions``.

    Without a scripted reply, a transcription answers what it received
    (``"heard N frames at R Hz"``), so the test can check the WAV it was sent.
    """

    @property
    def base_url(self) -> str:
        return f"{self.root}/v1"

    def answer(self, request: Recorded) -> Reply:
        if request.method != "POST":
            return _openai_error(405, "method not allowed", "invalid_request_error")
        if request.headers.get("authorization") != f"Bearer {self.api_key}":
            given = request.headers.get("authorization", "").removeprefix("Bearer ")
            # Like the service, quote the key that was refused (here in full, to be harsh).
            return _openai_error(
                401,
                f"Incorrect API key provided: {given}.",
                "invalid_request_error",
                "invalid_api_key",
            )
        if request.path == "/v1/chat/completions":
            problem = _check_chat_body(request.json())
            if problem:
                return _openai_error(400, problem, "invalid_request_error")
            return self.next_reply()
        if request.path == "/v1/audio/speech":
            body = request.json()
            if not body.get("input") or not body.get("voice") or not body.get("model"):
                return _openai_error(400, "model, input and voice are required", "invalid_request_error")
            return self.next_reply()
        if request.path == "/v1/audio/transcriptions":
            fields = _multipart(request.headers.get("content-type", ""), request.body)
            if "file" not in fields or "model" not in fields:
                return _openai_error(400, "file and model are required", "invalid_request_error")
            try:
                with wave.open(io.BytesIO(fields["file"][1]), "rb") as audio:
                    frames, rate = audio.getnframes(), audio.getframerate()
                    width, channels = audio.getsampwidth(), audio.getnchannels()
            except (wave.Error, EOFError):
                return _openai_error(400, "Invalid file format.", "invalid_request_error")
            if self._replies:
                return self.next_reply()
            text = f"heard {frames} frames at {rate} Hz, {width * 8} bit, {channels} channel"
            return json_reply(200, {"text": text})
        return _openai_error(404, f"Invalid URL (POST {request.path})", "invalid_request_error")


def openai_chunk(
    delta: Mapping[str, Any] | None,
    *,
    model: str = "gpt-4o-mini-2024-07-18",
    finish_reason: str | None = None,
    usage: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """One ``chat.completion.chunk`` object (``delta=None`` gives the usage-only chunk)."""
    return {
        "id": "chatcmpl-fake1",
        "object": "chat.completion.chunk",
        "created": 1_700_000_000,
        "model": model,
        "system_fingerprint": "fp_fake",
        "choices": []
        if delta is None
        else [{"index": 0, "delta": dict(delta), "logprobs": None, "finish_reason": finish_reason}],
        "usage": dict(usage) if usage is not None else None,
    }


def openai_events(chunks: Iterable[Mapping[str, Any] | str], *, done: bool = True) -> list[bytes]:
    """``data: ...`` events for these chunks (a ``str`` is sent verbatim), then ``[DONE]``."""
    events = [f"data: {c if isinstance(c, str) else json.dumps(c)}\n\n".encode() for c in chunks]
    if done:
        events.append(b"data: [DONE]\n\n")
    return events


def openai_usage(prompt: int, completion: int, *, cached: int = 0, reasoning: int = 0) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached, "audio_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": reasoning, "audio_tokens": 0},
    }


def openai_text_chunks(pieces: Sequence[str], *, usage: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The chunks of a plain text reply as the service streams it."""
    chunks = [openai_chunk({"role": "assistant", "content": "", "refusal": None})]
    chunks += [openai_chunk({"content": p}) for p in pieces]
    chunks.append(openai_chunk({}, finish_reason="stop"))
    if usage is not None:
        chunks.append(openai_chunk(None, usage=usage))
    return chunks


# ------------------------------------------------------------------------------------------
# Anthropic
# ------------------------------------------------------------------------------------------


def _anthropic_error(status: int, kind: str, message: str) -> Reply:
    return json_reply(status, {"type": "error", "error": {"type": kind, "message": message}})


def _check_messages_body(body: Any) -> str | None:
    """What the real Messages endpoint would reject in this streamed request."""
    if not isinstance(body, dict) or not isinstance(body.get("model"), str):
        return "model: Field required"
    if not isinstance(body.get("max_tokens"), int):
        return "max_tokens: Field required"
    if body.get("stream") is not True:
        return "this fake only serves stream: true"
    if "system" in body and not isinstance(body["system"], str | list):
        return "system: Input should be a valid string"
    if "thinking" in body:
        thinking = body["thinking"]
        if not isinstance(thinking, dict) or thinking.get("type") not in ("enabled", "disabled"):
            return "thinking.type: Input should be 'enabled' or 'disabled'"
        if thinking["type"] == "enabled":
            budget = thinking.get("budget_tokens")
            if not isinstance(budget, int) or budget < 1024:
                return "thinking.enabled.budget_tokens: Input should be greater than or equal to 1024"
            if body["max_tokens"] <= budget:
                return "`max_tokens` must be greater than `thinking.budget_tokens`"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "messages: at least one message is required"
    tool_uses: set[str] = set()
    previous = None
    for i, message in enumerate(messages):
        role = message.get("role")
        if role not in ("user", "assistant"):
            return f"messages.{i}.role: Input should be 'user' or 'assistant'"
        if role == previous:
            return f"messages.{i}: roles must alternate between 'user' and 'assistant'"
        previous = role
        content = message.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if not isinstance(blocks, list) or not blocks:
            return f"messages.{i}.content: must not be empty"
        for block in blocks:
            kind = block.get("type")
            if kind == "text" and not block.get("text"):
                return f"messages.{i}: text content blocks must be non-empty"
            if kind == "tool_use":
                if role != "assistant" or not isinstance(block.get("input"), dict):
                    return f"messages.{i}: invalid tool_use block"
                tool_uses.add(block["id"])
            elif kind == "tool_result":
                if role != "user" or block.get("tool_use_id") not in tool_uses:
                    return f"messages.{i}: unexpected `tool_use_id` found in `tool_result` blocks"
            elif kind != "text":
                return f"messages.{i}: unknown block type {kind!r}"
    for i, tool in enumerate(body.get("tools", ())):
        if set(tool) != {"name", "description", "input_schema"}:
            return f"tools.{i}: Extra inputs are not permitted"
        if tool["input_schema"].get("type") != "object":
            return f"tools.{i}.input_schema.type: Input should be 'object'"
    return None


class FakeAnthropic(_FakeService):
    """``/v1/messages``, streamed."""

    @property
    def base_url(self) -> str:
        return self.root

    def answer(self, request: Recorded) -> Reply:
        if request.method != "POST" or request.path != "/v1/messages":
            return _anthropic_error(404, "not_found_error", "Not found")
        if request.headers.get("x-api-key") != self.api_key:
            return _anthropic_error(
                401, "authentication_error", f"invalid x-api-key {request.headers.get('x-api-key')}"
            )
        if request.headers.get("anthropic-version") != "2023-06-01":
            return _anthropic_error(400, "invalid_request_error", "anthropic-version: bad header")
        problem = _check_messages_body(request.json())
        if problem:
            return _anthropic_error(400, "invalid_request_error", problem)
        return self.next_reply()


def anthropic_events(events: Iterable[Mapping[str, Any]]) -> list[bytes]:
    """``event: <type>`` / ``data: <json>`` pairs as the service sends them."""
    return [f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events]


def anthropic_message(
    *,
    thinking_pieces: Sequence[str] = (),
    text_pieces: Sequence[str] = (),
    tool_uses: Sequence[tuple[str, str, Sequence[str]]] = (),
    input_tokens: int = 0,
    cache_read: int = 0,
    output_tokens: int = 0,
    model: str = "claude-sonnet-4-5-20250929",
    stop: bool = True,
) -> list[dict[str, Any]]:
    """The events of one streamed message: an optional thinking block (its ``thinking_delta``
    pieces, then a ``signature_delta``, as extended thinking streams them), optional text,
    then ``(id, name, json pieces)`` tool uses, then ``message_delta`` and (with ``stop``)
    ``message_stop``."""
    events: list[dict[str, Any]] = [
        {
            "type": "message_start",
            "message": {
                "id": "msg_fake01",
                "type": "message",
                "role": "assistant",
                "content": [],
                "model": model,
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {
                    "input_tokens": input_tokens,
                    "cache_creation_input_tokens": 0,
                    "cache_read_input_tokens": cache_read,
                    "output_tokens": 1,
                },
            },
        },
        {"type": "ping"},
    ]
    index = 0
    if thinking_pieces:
        events.append(
            {
                "type": "content_block_start",
                "index": index,
                "content_block": {"type": "thinking", "thinking": "", "signature": ""},
            }
        )
        events += [
            {
                "type": "content_block_delta",
                "index": index,
                "delta": {"type": "thinking_delta", "thinking": p},
            }
            for p in thinking_pieces
        ]
        events.append(
            {
                "type": "content_block_delta",
                "index": index,
                "delta": {"type": "signature_delta", "signature": "EqQBCgIYAhIM1gbcDa9GJwZA2b3h"},
            }
        )
        events.append({"type": "content_block_stop", "index": index})
        index += 1
    if text_pieces:
        events.append(
            {
                "type": "content_block_start",
                "index": index,
                "content_block": {"type": "text", "text": ""},
            }
        )
        events += [
            {
                "type": "content_block_delta",
                "index": index,
                "delta": {"type": "text_delta", "text": p},
            }
            for p in text_pieces
        ]
        events.append({"type": "content_block_stop", "index": index})
        index += 1
    for tool_id, name, pieces in tool_uses:
        events.append(
            {
                "type": "content_block_start",
                "index": index,
                "content_block": {"type": "tool_use", "id": tool_id, "name": name, "input": {}},
            }
        )
        events += [
            {
                "type": "content_block_delta",
                "index": index,
                "delta": {"type": "input_json_delta", "partial_json": p},
            }
            for p in pieces
        ]
        events.append({"type": "content_block_stop", "index": index})
        index += 1
    events.append(
        {
            "type": "message_delta",
            "delta": {
                "stop_reason": "tool_use" if tool_uses else "end_turn",
                "stop_sequence": None,
            },
            "usage": {"output_tokens": output_tokens},
        }
    )
    if stop:
        events.append({"type": "message_stop"})
    return events
