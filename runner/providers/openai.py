"""OpenAI (and any OpenAI-compatible endpoint): chat completions, speech and transcription.

Speaks the HTTP wire formats directly through ``httpx`` (which runs under Trio through anyio):
``POST /chat/completions`` streamed as server-sent events, ``POST /audio/speech`` streamed as raw
PCM, ``POST /audio/transcriptions`` as a multipart upload of a WAV file.

The HTTP machinery it shares with the other HTTP providers is in ``_http.py``.
"""

from __future__ import annotations

import json
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
    error_detail,
    int_or_zero,
    iterate_body,
    open_response,
    read_capped,
    redact,
    sse_events,
    transport_error,
    wav,
)
from ._registry import ChatModelProvider, RecognizerProvider, SynthesizerProvider
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

#: The voices OpenAI speech offers.
OPENAI_VOICES = (
    "alloy",
    "ash",
    "ballad",
    "coral",
    "echo",
    "fable",
    "nova",
    "onyx",
    "sage",
    "shimmer",
    "verse",
)


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
    return {"openai": "OpenAI", "kugelaudio": "KugelAudio"}.get(provider, provider)


def _auth_headers(api_key: str | None) -> dict[str, str]:
    return {"authorization": f"Bearer {api_key}"} if api_key else {}


def _resolve_key(
    api_key: str | None, api_key_env: str | None, provider: str
) -> tuple[str | None, str | None]:
    env = api_key_env if api_key_env is not None else ("OPENAI_API_KEY" if provider == "openai" else None)
    return (api_key if api_key is not None else env_key(env)), env


#: The services behind this API that always need a key (a compatible endpoint may take none).
_KEYED = ("openai", "kugelaudio")


def _missing_key(api_key: str | None, env: str | None, provider: str) -> str | None:
    """OpenAI always needs a key; a compatible endpoint only when told which variable holds it."""
    if api_key is None and (provider in _KEYED or env is not None):
        return env or "OPENAI_API_KEY"
    return None


def _require_key(api_key: str | None, env: str | None, provider: str) -> None:
    """OpenAI itself always needs a key; a compatible endpoint may take none."""
    if api_key is None and provider in _KEYED:
        raise ProviderError(
            "unauthorized",
            f"no API key for {_service_name(provider)}: set {env or 'OPENAI_API_KEY'} or pass api_key",
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
        async with open_response(
            self._http,
            service,
            f"{self.base_url}/chat/completions",
            headers={**_auth_headers(self._api_key), "accept": "text/event-stream"},
            secret=self._api_key,
            json_body=self.request_body(messages, tools),
        ) as response:
            events = sse_events(response, service, max_stream_s=self.max_stream_s)
            async with aclosing(events):
                async for event in events:
                    if event.data.strip() == "[DONE]":
                        state.done = True
                        break
                    for text in state.feed(event.data):
                        yield TextDelta(text=text)
                if state.done:
                    await drain(events)
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
        chunk = decode_json_object(data, self.service)
        if chunk.get("error"):
            kind, message = error_detail(data.encode())
            message = redact(message, self.secret)[:MAX_ERROR_MESSAGE_CHARS]
            raise ProviderError(
                "provider_failed",
                f"{self.service} failed mid-stream ({kind or 'error'}): {message}",
                retryable=True,
            )
        if isinstance(chunk.get("model"), str) and chunk["model"]:
            self.model = chunk["model"]
        texts: list[str] = []
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, Mapping) or int_or_zero(choice.get("index")) != 0:
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
                    arguments=decode_arguments(call.arguments, self.service, call.name),
                )
            )
        events.append(self.usage if self.usage is not None else Usage(model=self.model))
        return events

    def _accumulate_call(self, piece: Any) -> None:
        if not isinstance(piece, Mapping):
            raise ProviderError("provider_failed", f"{self.service} sent a malformed tool call")
        call = self.pending.setdefault(int_or_zero(piece.get("index")), _PendingCall())
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
        input_tokens=int_or_zero(raw.get("prompt_tokens")),
        output_tokens=int_or_zero(raw.get("completion_tokens")),
        cached_tokens=int_or_zero(prompt_details.get("cached_tokens"))
        if isinstance(prompt_details, Mapping)
        else 0,
        thought_tokens=int_or_zero(completion_details.get("reasoning_tokens"))
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
            open_response(
                self._http,
                service,
                f"{self.base_url}/audio/speech",
                headers=_auth_headers(self._api_key),
                secret=self._api_key,
                json_body=body,
            ) as response,
            iterate_body(response, response.aiter_bytes()) as chunks,
        ):
            while True:
                try:
                    chunk = await chunks.__anext__()
                except StopAsyncIteration:
                    break
                except httpx.TransportError as exc:
                    raise transport_error(service, exc, connected=True) from None
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

    def open_stream(self, sample_rate_hz: int) -> None:
        """None: the service takes whole utterances only (see :meth:`transcribe`)."""
        return None

    async def transcribe(self, pcm: bytes, sample_rate_hz: int, *, prompt: str = "") -> Transcript:
        """Transcribe one utterance of 16-bit little-endian mono PCM; ``prompt`` goes as the
        service's ``prompt``.

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
        if prompt:
            data["prompt"] = prompt
        files = {"file": ("audio.wav", wav(pcm, sample_rate_hz), "audio/wav")}
        async with open_response(
            self._http,
            service,
            f"{self.base_url}/audio/transcriptions",
            headers=_auth_headers(self._api_key),
            secret=self._api_key,
            files=files,
            data=data,
        ) as response:
            try:
                body = await read_capped(response, 4 * 1024 * 1024)
            except httpx.TransportError as exc:
                raise transport_error(service, exc, connected=True) from None
        payload = decode_json_object(body.decode("utf-8", "replace"), service)
        text = payload.get("text")
        if not isinstance(text, str):
            raise ProviderError("provider_failed", f"{service} sent a transcription with no text")
        return Transcript(text=text.strip(), audio_seconds=(len(pcm) // 2) / sample_rate_hz)


def _openai_llm(model: str, *, base_url: str | None, api_key_env: str | None) -> OpenAILLM:
    return OpenAILLM(model, base_url=base_url or OPENAI_BASE_URL, api_key_env=api_key_env)


def _compatible_llm(model: str, *, base_url: str | None, api_key_env: str | None) -> OpenAILLM:
    assert base_url  # needs_base_url: make_llm checked it
    return OpenAILLM(model, base_url=base_url, provider="openai-compatible", api_key_env=api_key_env)


def _openai_tts(voice: str | int | None, *, model: str | None) -> OpenAITTS:
    if voice is not None and not isinstance(voice, str):
        raise ProviderError("invalid_settings", f"OpenAI voices are names, got {voice!r}")
    return OpenAITTS(model or "gpt-4o-mini-tts", voice=voice or "alloy")


def _openai_voice_problem(voice: str | int | float) -> str | None:
    return None if voice in OPENAI_VOICES else f"OpenAI speech has no voice {voice!r}"


def _openai_stt(language: str | None) -> OpenAISTT:
    # The API takes an ISO-639-1 hint: "de-DE" means "de".
    return OpenAISTT(language=language.split("-")[0].lower() if language else None)


PROVIDES = (
    ChatModelProvider(name="openai", build=_openai_llm),
    ChatModelProvider(name="openai-compatible", build=_compatible_llm, needs_base_url=True),
    SynthesizerProvider(name="openai", build=_openai_tts, voice_problem=_openai_voice_problem),
    RecognizerProvider(name="openai", build=_openai_stt, streams=False),
)
