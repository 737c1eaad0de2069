"""The public listener: the agent WebSocket and the REST it needs (keys and conversations).

Apps reach this listener, not the management one. Bodies are the agent API's own
(``runner.ino_wire``: snake_case, every field written); errors are the same ``ErrorBody``
as the management API's.
"""

from __future__ import annotations

import json
from contextlib import AbstractAsyncContextManager
from typing import Any

from quart import Response, request, websocket
from quart_trio import QuartTrio

from .. import ino_wire as w
from ..errors import InvalidRequest, NotFound, Unauthorized
from ..transports.websocket import AgentSocketService
from ..wire import parse_json
from ._common import bearer_credential, install_error_handlers
from ._playground import Playground, install_playground
from ._server import corked


class _QuartSocket:
    """Quart's WebSocket as the driver's :class:`~runner.transports.websocket.SocketIO`."""

    def __init__(self, socket: Any) -> None:
        self._socket = socket

    @property
    def requested_subprotocols(self) -> list[str]:
        return list(self._socket.requested_subprotocols)

    async def accept(self, subprotocol: str | None) -> None:
        await self._socket.accept(subprotocol=subprotocol)

    async def receive(self) -> str | bytes:
        message: str | bytes | None = await self._socket.receive()
        # Quart reads a message as `bytes or text`, so an empty binary one arrives as None.
        return b"" if message is None else message

    async def send(self, data: str | bytes) -> None:
        await self._socket.send(data)

    def corked(self) -> AbstractAsyncContextManager[None]:
        return corked()

    async def close(self, code: int, reason: str) -> None:
        await self._socket.close(code, reason)


def _json(value: Any, status: int = 200) -> Response:
    body = json.dumps(w.encode(value), separators=(",", ":"), default=str)
    return Response(body, status=status, content_type="application/json")


async def _body(cls: type[Any]) -> Any:
    # Bytes: decoded as text here, a body that is not UTF-8 failed outside the try (a 500).
    raw = await request.get_data()
    try:
        value = parse_json(raw) if raw.strip() else None
    except ValueError:  # UnicodeDecodeError included
        raise InvalidRequest("the body must be a JSON object") from None
    try:
        return w.decode_body(cls, value)
    except (w.FrameRejected, w.FrameInvalid) as exc:
        raise InvalidRequest(str(exc)) from None


def _bearer() -> str:
    credential = bearer_credential(request.headers.get("Authorization", ""))
    if credential is None:
        raise Unauthorized()
    return credential


def create_public_app(service: AgentSocketService, *, playground: Playground | None = None) -> QuartTrio:
    """The public app of one runner: ``/v1/ephemeral-keys``, ``/v1/agent/...``.

    With ``playground`` (``runner dev`` only), also the playground page at ``/`` and its
    ``/dev/...`` routes.
    """
    app = QuartTrio("runner.public")
    install_error_handlers(app)
    if playground is not None:
        install_playground(app, service, playground)

    def require_api_key() -> None:
        if not service.is_api_key(_bearer()):
            raise Unauthorized()

    async def end_user_or_api_key() -> str | None:
        """The end user a token speaks for; ``None`` for the API key (it may see every one)."""
        credential = _bearer()
        if service.is_api_key(credential):
            return None
        return (await service.valid_token(credential)).end_user_id

    @app.post("/v1/ephemeral-keys")
    async def mint_key() -> Response:
        require_api_key()
        body = await _body(w.EphemeralKeyRequest)
        try:
            minted = await service.mint_key(body)
        except w.FrameInvalid as exc:
            raise InvalidRequest(str(exc)) from None
        row = minted.row
        return _json(
            w.EphemeralKey(
                token=minted.token, end_user_id=row.end_user_id, expires_at=w.rfc3339(row.expires_at)
            ),
            201,
        )

    @app.post("/v1/ephemeral-keys/<token_id>/revoke")
    async def revoke_key(token_id: str) -> Response:
        require_api_key()
        if not await service.revoke(token_id):
            raise NotFound(f"no ephemeral key {token_id!r}")
        return _json(w.Revoked(token_id=token_id, revoked=True))

    @app.post("/v1/agent/sessions")
    async def create_session() -> Response:
        token = await service.valid_token(_bearer())
        await _body(w.AgentSessionRequest)
        row = await service.create_conversation(token)
        return _json(
            w.AgentSession(
                session_id=row.conversation_id,
                agent_id=row.agent_id,
                end_user_id=row.end_user_id,
                created_at=w.rfc3339(row.created_at),
            ),
            201,
        )

    @app.get("/v1/agent/sessions/<session_id>/messages")
    async def messages(session_id: str) -> Response:
        end_user = await end_user_or_api_key()
        await service.conversation_for(session_id, end_user_id=end_user)
        stored = await service.platform.transcript(session_id)
        return _json(
            w.AgentSessionMessages(
                session_id=session_id,
                messages=[
                    w.TranscriptMessage(
                        position=m.position,
                        role=m.role,
                        text=m.content,
                        turn=m.turn_id,
                        created_at=w.rfc3339(m.created_at),
                    )
                    for m in stored
                ],
            )
        )

    @app.post("/v1/agent/sessions/<session_id>/compact")
    async def compact_session(session_id: str) -> Response:
        end_user = await end_user_or_api_key()
        await service.conversation_for(session_id, end_user_id=end_user)
        await _body(w.AgentSessionRequest)
        compacted = await service.compact(session_id)
        return _json(
            w.CompactionDone(
                session_id=session_id,
                compacted=compacted is not None,
                after_seq=compacted.after_seq if compacted is not None else None,
            )
        )

    @app.delete("/v1/agent/sessions/<session_id>")
    async def delete_session(session_id: str) -> Response:
        end_user = await end_user_or_api_key()
        await service.conversation_for(session_id, end_user_id=end_user)
        await service.delete_conversation(session_id)
        return _json(w.Deleted(session_id=session_id, deleted=True))

    @app.get("/v1/agent/relations")
    async def relations() -> Response:
        end_user = await end_user_or_api_key()
        return _json(w.Relations(relations=await service.relations_for(end_user)))

    @app.websocket(w.AGENT_STREAM_PATH)
    async def agent_stream() -> None:
        socket = websocket._get_current_object()  # type: ignore[attr-defined]  # Quart's LocalProxy has it at run time, undeclared; the socket must outlive the request context
        await service.serve_socket(_QuartSocket(socket), websocket.args.get("session_id"))

    return app
