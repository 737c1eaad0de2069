"""Local fakes of the KugelAudio and Azure Speech APIs, speaking their real wire formats.

KugelAudio (as its Python SDK 2.7.0 speaks it): ``GET /v1/voices`` with ``Authorization:
Bearer`` / ``X-API-Key``, and the ``/ws/tts?api_key=&model_id=`` WebSocket: one JSON request
frame in, JSON frames ``{"audio": base64, "idx", "sr", "samples"}`` out, then ``{"final":
true}``; failures as ``{"error", "error_code", "code"}`` frames, a refused upgrade (403 for a
bad key) or close codes (4001, 4029, ...).

Azure Speech: ``POST /speech/recognition/conversation/cognitiveservices/v1?language=&format=``
with ``Ocp-Apim-Subscription-Key`` and a 16 kHz 16-bit mono WAV body.

Both are ASGI apps served by Hypercorn on 127.0.0.1 through ``fake_servers.open_fake_server``.
"""

from __future__ import annotations

import base64
import io
import json
import urllib.parse
import wave
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import trio
import trio.lowlevel
from fake_servers import Recorded, Reply, _FakeService, json_reply

# ------------------------------------------------------------------------------------------
# KugelAudio
# ------------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class WsRecorded:
    """One WebSocket session as the fake saw it."""

    path: str
    query: Mapping[str, str]
    headers: Mapping[str, str]
    request: Any = None


@attrs.frozen(kw_only=True)
class WsScript:
    """What the fake does with one session.

    ``reject``: answer the upgrade with this HTTP status. Otherwise accept, read the request
    frame, send ``frames`` (dicts as JSON; ``gate`` set means wait for it before each frame
    after the first), then: ``close_code`` closes with that code and ``close_reason``;
    ``crash`` makes the app fail (Hypercorn drops the session); else nothing more is sent
    and the session is closed normally once the client leaves.
    """

    reject: int | None = None
    reject_headers: tuple[tuple[str, str], ...] = ()
    reject_body: bytes = b""
    frames: tuple[Mapping[str, Any], ...] = ()
    gate: trio.Event | None = None
    close_code: int | None = None
    close_reason: str = ""
    crash: bool = False


def kugel_audio_frame(pcm: bytes, idx: int, sr: int = 24_000) -> dict[str, Any]:
    return {
        "audio": base64.b64encode(pcm).decode(),
        "idx": idx,
        "sr": sr,
        "samples": len(pcm) // 2,
    }


def kugel_final(chunks: int) -> dict[str, Any]:
    return {
        "final": True,
        "chunks": chunks,
        "total_samples": 0,
        "dur_ms": 0.0,
        "gen_ms": 12.5,
        "ttfa_ms": 80.0,
        "rtf": 0.1,
    }


class _Crash(Exception):
    """Raised inside the app to make Hypercorn drop the WebSocket without a close frame."""


class FakeKugelAudio(_FakeService):
    """``GET /v1/voices`` and the ``/ws/tts`` streaming WebSocket.

    Without a script, a session answers two audio chunks derived from the text and a final
    frame, like the service does for a short sentence.
    """

    def __init__(self, *, api_key: str, voices: Sequence[Mapping[str, Any]] = ()) -> None:
        super().__init__(api_key=api_key)
        self.voices = list(voices)
        self.sessions: list[WsRecorded] = []
        self._scripts: deque[WsScript] = deque()

    @property
    def base_url(self) -> str:
        return self.root

    def script(self, *scripts: WsScript) -> None:
        self._scripts.extend(scripts)

    def answer(self, request: Recorded) -> Reply:
        auth = request.headers.get("authorization", "")
        if auth != f"Bearer {self.api_key}" and request.headers.get("x-api-key") != self.api_key:
            return json_reply(401, {"detail": f"Invalid API key {auth}"})
        if request.method == "GET" and request.path == "/v1/voices":
            if self._replies:
                return self.next_reply()
            return json_reply(
                200, {"voices": self.voices, "total": len(self.voices), "limit": 20, "offset": 0}
            )
        return json_reply(404, {"detail": "Not Found"})

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "websocket":
            await super().__call__(scope, receive, send)
            return
        query = dict(urllib.parse.parse_qsl(scope.get("query_string", b"").decode()))
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        message = await receive()
        if message["type"] != "websocket.connect":
            return
        script = self._scripts.popleft() if self._scripts else None
        if scope["path"] != "/ws/tts":
            await _ws_reject(send, 404, (), b'{"detail": "Not Found"}')
            return
        if script is not None and script.reject is not None:
            self.sessions.append(WsRecorded(path=scope["path"], query=query, headers=headers))
            await _ws_reject(send, script.reject, script.reject_headers, script.reject_body)
            return
        if query.get("api_key") != self.api_key:
            # The service refuses a bad key on the upgrade with 403.
            self.sessions.append(WsRecorded(path=scope["path"], query=query, headers=headers))
            await _ws_reject(send, 403, (), b"Forbidden")
            return
        await send({"type": "websocket.accept"})
        message = await receive()
        if message["type"] != "websocket.receive":
            return
        request = json.loads(message.get("text") or "null")
        self.sessions.append(WsRecorded(path=scope["path"], query=query, headers=headers, request=request))
        if script is None:
            script = self._default_script(request)
        for i, frame in enumerate(script.frames):
            if i and script.gate is not None:
                await script.gate.wait()
            await send({"type": "websocket.send", "text": json.dumps(frame)})
            await trio.lowlevel.checkpoint()
        if script.crash:
            raise _Crash("scripted crash")
        if script.close_code is not None:
            await send({"type": "websocket.close", "code": script.close_code, "reason": script.close_reason})
            return
        for _ in range(100):
            message = await receive()
            if message["type"] == "websocket.disconnect":
                return

    def _default_script(self, request: Any) -> WsScript:
        if not isinstance(request, dict) or not request.get("text"):
            return WsScript(
                frames=({"error": "text is required", "error_code": "VALIDATION_ERROR", "code": 400},)
            )
        if not isinstance(request.get("voice_id"), int):
            return WsScript(
                frames=({"error": "voice_id is required", "error_code": "MISSING_VOICE_ID", "code": 400},)
            )
        rate = request.get("sample_rate", 24_000)
        text = request["text"].encode()
        first = bytes(text[: len(text) // 2]).ljust(8, b"\0")
        second = bytes(text[len(text) // 2 :]).ljust(8, b"\0")
        return WsScript(
            frames=(
                kugel_audio_frame(first, 0, rate),
                kugel_audio_frame(second, 1, rate),
                kugel_final(2),
            )
        )


async def _ws_reject(send: Any, status: int, headers: Sequence[tuple[str, str]], body: bytes) -> None:
    await send(
        {
            "type": "websocket.http.response.start",
            "status": status,
            "headers": [(k.encode(), v.encode()) for k, v in headers],
        }
    )
    await send({"type": "websocket.http.response.body", "body": body, "more_body": False})


# ------------------------------------------------------------------------------------------
# Azure Speech
# ------------------------------------------------------------------------------------------

AZURE_PATH = "/speech/recognition/conversation/cognitiveservices/v1"


@attrs.frozen(kw_only=True)
class HeardWav:
    frames: int
    rate: int
    width: int
    channels: int


def read_wav(body: bytes) -> HeardWav:
    with wave.open(io.BytesIO(body), "rb") as audio:
        return HeardWav(
            frames=audio.getnframes(),
            rate=audio.getframerate(),
            width=audio.getsampwidth(),
            channels=audio.getnchannels(),
        )


class FakeAzureSpeech(_FakeService):
    """The short-audio recognition endpoint of a speech resource.

    Without a scripted reply it answers ``Success`` with what it received
    (``"heard N frames at R Hz in xx-XX"``), so the test can check the WAV and the query.
    """

    def __init__(self, *, api_key: str) -> None:
        super().__init__(api_key=api_key)
        #: The decoded query string of each request, in order (``Recorded`` has only the path).
        self.queries: list[dict[str, str]] = []

    @property
    def base_url(self) -> str:
        return self.root

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            query = scope.get("query_string", b"").decode("latin-1")
            self.queries.append(dict(urllib.parse.parse_qsl(query)))
        await super().__call__(scope, receive, send)

    def answer(self, request: Recorded) -> Reply:
        if request.method != "POST" or request.path != AZURE_PATH:
            return json_reply(404, {"error": {"code": "404", "message": "Resource not found"}})
        if request.headers.get("ocp-apim-subscription-key") != self.api_key:
            return json_reply(
                401,
                {
                    "error": {
                        "code": "401",
                        "message": "Access denied due to invalid subscription key "
                        f"{request.headers.get('ocp-apim-subscription-key')}.",
                    }
                },
            )
        query = self.queries[-1]
        if not query.get("language"):
            return json_reply(400, {"error": {"code": "400", "message": "language missing"}})
        content_type = request.headers.get("content-type", "")
        if not content_type.startswith("audio/wav"):
            return json_reply(415, {"error": {"code": "415", "message": "Unsupported type"}})
        try:
            heard = read_wav(request.body)
        except (wave.Error, EOFError):
            return json_reply(400, {"error": {"code": "400", "message": "Invalid audio"}})
        if heard.rate != 16_000 or heard.width != 2 or heard.channels != 1:
            return json_reply(400, {"error": {"code": "400", "message": "Unsupported format"}})
        if self._replies:
            return self.next_reply()
        text = f"heard {heard.frames} frames at {heard.rate} Hz in {query['language']}"
        return json_reply(
            200,
            {
                "RecognitionStatus": "Success",
                "DisplayText": text,
                "Offset": 0,
                "Duration": heard.frames * 10_000_000 // heard.rate,
            },
        )
