"""Anthropic: the Messages API, streamed as server-sent events.

Speaks ``POST /v1/messages`` with ``stream: true`` directly through ``httpx`` (which runs under
Trio through anyio). The HTTP helpers (error mapping, server-sent events) are shared with the
OpenAI provider.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping, Sequence
from contextlib import aclosing
from typing import Any

import attrs
import httpx

from ._http import (
    MAX_ERROR_MESSAGE_CHARS,
    decode_arguments,
    decode_json_object,
    drain,
    env_key,
    int_or_zero,
    open_response,
    redact,
    sse_events,
)
from ._registry import ChatModelProvider
from ._types import (
    ChatMessage,
    LLMEvent,
    ProviderError,
    TextDelta,
    ThoughtDelta,
    ToolCall,
    ToolSpec,
    Usage,
)

ANTHROPIC_BASE_URL = "https://api.anthropic.com"
ANTHROPIC_VERSION = "2023-06-01"

_SERVICE = "Anthropic"

#: Error types of an ``error`` event that a retry may cure, and the code each maps to.
_STREAM_ERRORS = {
    "overloaded_error": ("provider_failed", True),
    "api_error": ("provider_failed", True),
    "rate_limit_error": ("rate_limited", True),
    "authentication_error": ("unauthorized", False),
    "permission_error": ("unauthorized", False),
}


def _blocks(message: ChatMessage) -> list[dict[str, Any]]:
    if message.role == "tool":
        return [
            {
                "type": "tool_result",
                "tool_use_id": message.tool_call_id or "",
                "content": message.content,
            }
        ]
    blocks: list[dict[str, Any]] = []
    if message.content:
        blocks.append({"type": "text", "text": message.content})
    if message.role == "assistant":
        blocks.extend(
            {"type": "tool_use", "id": call.id, "name": call.name, "input": dict(call.arguments)}
            for call in message.tool_calls
        )
    return blocks


def _messages(messages: Sequence[ChatMessage]) -> tuple[str, list[dict[str, Any]]]:
    """``(system, messages)``: system text goes to the top level; tool results become
    ``tool_result`` blocks of a user turn; neighbouring turns of one role are merged."""
    system: list[str] = []
    turns: list[dict[str, Any]] = []
    for message in messages:
        if message.role == "system":
            if message.content:
                system.append(message.content)
            continue
        role = "assistant" if message.role == "assistant" else "user"
        blocks = _blocks(message)
        if not blocks:
            continue
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})
    return "\n\n".join(system), turns


@attrs.define
class _ToolBlock:
    id: str
    name: str
    partial_json: str = ""
    start_input: Mapping[str, Any] = attrs.Factory(dict)


@attrs.define
class _MessageStream:
    """What a Messages stream has said so far."""

    model: str
    secret: str | None = attrs.field(repr=False)
    done: bool = False
    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    tools: dict[int, _ToolBlock] = attrs.Factory(dict)
    calls: list[ToolCall] = attrs.Factory(list)
    thoughts: bool = False

    def feed(self, event: str, data: str) -> list[TextDelta | ThoughtDelta]:
        """Take one event; return its text and thinking (raises ``ProviderError`` on an ``error``
        event). Thinking is returned only when ``thoughts`` was asked for."""
        payload = decode_json_object(data, _SERVICE)
        kind = payload.get("type") or event
        if kind == "message_start":
            message = payload.get("message") or {}
            if isinstance(message, Mapping):
                if isinstance(message.get("model"), str) and message["model"]:
                    self.model = message["model"]
                self._take_usage(message.get("usage"))
        elif kind == "content_block_start":
            block = payload.get("content_block") or {}
            if isinstance(block, Mapping) and block.get("type") == "tool_use":
                start_input = block.get("input")
                self.tools[int_or_zero(payload.get("index"))] = _ToolBlock(
                    id=str(block.get("id") or ""),
                    name=str(block.get("name") or ""),
                    start_input=start_input if isinstance(start_input, Mapping) else {},
                )
            elif isinstance(block, Mapping) and block.get("type") == "text" and block.get("text"):
                return [TextDelta(text=str(block["text"]))]
            elif (
                self.thoughts
                and isinstance(block, Mapping)
                and block.get("type") == "thinking"
                and isinstance(block.get("thinking"), str)
                and block["thinking"]
            ):
                return [ThoughtDelta(text=block["thinking"])]
        elif kind == "content_block_delta":
            delta = payload.get("delta") or {}
            if not isinstance(delta, Mapping):
                raise ProviderError("provider_failed", f"{_SERVICE} sent a malformed delta")
            if delta.get("type") == "text_delta":
                text = delta.get("text")
                return [TextDelta(text=text)] if isinstance(text, str) and text else []
            if delta.get("type") == "thinking_delta":
                thought = delta.get("thinking")
                if self.thoughts and isinstance(thought, str) and thought:
                    return [ThoughtDelta(text=thought)]
                return []
            if delta.get("type") == "input_json_delta":
                tool = self.tools.get(int_or_zero(payload.get("index")))
                if tool is None:
                    raise ProviderError(
                        "provider_failed", f"{_SERVICE} sent tool input for no tool_use block"
                    )
                tool.partial_json += str(delta.get("partial_json") or "")
        elif kind == "content_block_stop":
            tool = self.tools.pop(int_or_zero(payload.get("index")), None)
            if tool is not None:
                arguments = (
                    decode_arguments(tool.partial_json, _SERVICE, tool.name)
                    if tool.partial_json.strip()
                    else dict(tool.start_input)
                )
                self.calls.append(
                    ToolCall(
                        id=tool.id or f"toolu_{len(self.calls)}",
                        name=tool.name,
                        arguments=arguments,
                    )
                )
        elif kind == "message_delta":
            self._take_usage(payload.get("usage"))
        elif kind == "message_stop":
            self.done = True
        elif kind == "error":
            raise self._stream_error(payload)
        # ping, signature deltas, redacted thinking and unknown events are ignored.
        return []

    def finish(self) -> list[LLMEvent]:
        """The tool calls and the usage, once the stream ended; raises if it was cut."""
        if not self.done:
            raise ProviderError(
                "provider_failed",
                f"{_SERVICE} ended the stream before message_stop",
                retryable=True,
            )
        return [
            *self.calls,
            Usage(
                model=self.model,
                input_tokens=self.input_tokens,
                output_tokens=self.output_tokens,
                cached_tokens=self.cached_tokens,
            ),
        ]

    def _take_usage(self, raw: Any) -> None:
        # Input counts come with message_start (message_delta may repeat them); output
        # counts in message_delta are cumulative. Cache reads and writes are input too.
        if not isinstance(raw, Mapping):
            return
        if any(k in raw for k in ("input_tokens", "cache_read_input_tokens")):
            cached = int_or_zero(raw.get("cache_read_input_tokens"))
            total = (
                int_or_zero(raw.get("input_tokens"))
                + cached
                + int_or_zero(raw.get("cache_creation_input_tokens"))
            )
            if total:
                self.input_tokens = total
                self.cached_tokens = cached
        if "output_tokens" in raw:
            self.output_tokens = int_or_zero(raw.get("output_tokens"))

    def _stream_error(self, payload: Mapping[str, Any]) -> ProviderError:
        error = payload.get("error") or {}
        kind = str(error.get("type") or "error") if isinstance(error, Mapping) else "error"
        message = str(error.get("message") or "") if isinstance(error, Mapping) else ""
        code, retryable = _STREAM_ERRORS.get(kind, ("provider_failed", False))
        if code == "unauthorized":
            return ProviderError(code, f"{_SERVICE} refused the credentials ({kind})")
        message = redact(message, self.secret)[:MAX_ERROR_MESSAGE_CHARS]
        return ProviderError(code, f"{_SERVICE} failed mid-stream ({kind}): {message}", retryable=retryable)


class AnthropicLLM:
    """A Claude model behind the Anthropic Messages API, streamed.

    The key comes from ``api_key`` or else ``ANTHROPIC_API_KEY`` (or the variable named by
    ``api_key_env``).

    Args:
        model: The model name, e.g. ``"claude-sonnet-4-5"``.
        api_key: The key; never shown in errors or ``repr``.
        base_url: The API root, ending before ``/v1/messages``.
        http: A shared ``httpx.AsyncClient`` (reuses connections); by default each request
            opens its own.
        api_key_env: The environment variable holding the key.
        max_tokens: The most tokens one reply may hold (the API requires a bound).
        max_stream_s: The longest one streamed reply may take.
        thinking_budget_tokens: With ``stream(..., thoughts=True)``: the extended-thinking
            budget sent as ``"thinking": {"type": "enabled", "budget_tokens": N}`` (at least
            1024, the API's minimum); ``max_tokens`` of that request grows by it, since the
            API counts thinking in ``max_tokens``.

    Thinking summaries: asked with ``thoughts=True``, the request enables extended thinking
    and each ``thinking_delta`` becomes a :class:`ThoughtDelta` (signature deltas are
    ignored). A request continuing a tool round (the last message is a tool result) does not
    enable thinking: the API would then require the earlier thinking blocks, with their
    signatures, which the conversation does not keep.
    """

    provider = "anthropic"
    reports_thoughts = True

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None = None,
        base_url: str = ANTHROPIC_BASE_URL,
        http: httpx.AsyncClient | None = None,
        api_key_env: str = "ANTHROPIC_API_KEY",
        max_tokens: int = 1024,
        max_stream_s: float = 600.0,
        thinking_budget_tokens: int = 1024,
    ) -> None:
        if thinking_budget_tokens < 1024:
            raise ValueError("thinking_budget_tokens must be at least 1024")
        self.model = model
        self.thinking_budget_tokens = thinking_budget_tokens
        self.base_url = base_url.rstrip("/")
        self.max_tokens = max_tokens
        self.max_stream_s = max_stream_s
        self._http = http
        self._api_key_env = api_key_env
        self._api_key = api_key if api_key is not None else env_key(api_key_env)

    @property
    def missing_key(self) -> str | None:
        """The variable to set when this provider has no key (checked at warm-up)."""
        return self._api_key_env if self._api_key is None else None

    def __repr__(self) -> str:
        return f"AnthropicLLM(model={self.model!r}, base_url={self.base_url!r})"

    def request_body(
        self,
        messages: Sequence[ChatMessage],
        tools: Sequence[ToolSpec] = (),
        *,
        thoughts: bool = False,
    ) -> dict[str, Any]:
        """The JSON body of the streamed Messages request for these inputs."""
        system, turns = _messages(messages)
        thinking = thoughts and not (messages and messages[-1].role == "tool")
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": self.max_tokens + (self.thinking_budget_tokens if thinking else 0),
            "messages": turns,
            "stream": True,
        }
        if thinking:
            body["thinking"] = {"type": "enabled", "budget_tokens": self.thinking_budget_tokens}
        if system:
            body["system"] = system
        if tools:
            body["tools"] = [
                {"name": t.name, "description": t.description, "input_schema": dict(t.parameters)}
                for t in tools
            ]
        return body

    async def stream(
        self,
        messages: Sequence[ChatMessage],
        tools: Sequence[ToolSpec] = (),
        *,
        thoughts: bool = False,
    ) -> AsyncGenerator[LLMEvent, None]:
        """Yield text deltas as written, then the tool calls, then one ``Usage``.

        With ``thoughts``, the thinking summary's deltas come too, as ``ThoughtDelta``
        (before the text, as the model writes them).

        Raises:
            ProviderError: on an HTTP error, a failed connection, an ``error`` event, or a
                stream cut before ``message_stop`` (then after the deltas already yielded).
        """
        if self._api_key is None:
            raise ProviderError(
                "unauthorized", f"no API key for Anthropic: set {self._api_key_env} or pass api_key"
            )
        state = _MessageStream(model=self.model, secret=self._api_key, thoughts=thoughts)
        async with open_response(
            self._http,
            _SERVICE,
            f"{self.base_url}/v1/messages",
            headers={
                "x-api-key": self._api_key,
                "anthropic-version": ANTHROPIC_VERSION,
                "accept": "text/event-stream",
            },
            secret=self._api_key,
            json_body=self.request_body(messages, tools, thoughts=thoughts),
        ) as response:
            events = sse_events(response, _SERVICE, max_stream_s=self.max_stream_s)
            async with aclosing(events):
                async for event in events:
                    for delta in state.feed(event.event, event.data):
                        yield delta
                    if state.done:
                        break
                if state.done:
                    await drain(events)
        for final in state.finish():
            yield final


def _build(model: str, *, base_url: str | None, api_key_env: str | None) -> AnthropicLLM:
    return AnthropicLLM(
        model, base_url=base_url or ANTHROPIC_BASE_URL, api_key_env=api_key_env or "ANTHROPIC_API_KEY"
    )


PROVIDES = (ChatModelProvider(name="anthropic", build=_build),)
