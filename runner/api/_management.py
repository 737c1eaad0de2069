"""The management API: the private listener a host drives (the seed's "Routes")."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import trio
from quart import Response, request, websocket
from quart_trio import QuartTrio

from journal import Journal

from ..errors import (
    InvalidRequest,
    NoJournal,
    NotFound,
    PayloadTooLarge,
    RunnerTakesNoCalls,
    Unauthorized,
    UnknownVersion,
)
from ..telemetry import Metrics
from ..wire import (
    PROTOCOL_VERSION,
    PROTOCOL_VERSIONS,
    Health,
    HostMessage,
    HostMessageAccepted,
    SessionSettingsResponse,
    StartCallRequest,
    StartCallResponse,
)
from ._common import (
    MAX_BODY_BYTES,
    bearer_matches,
    error_response,
    install_error_handlers,
    json_body_response,
    json_response,
    read_body,
    read_json,
)
from ._events import check_cursor, parse_cursor, stream_lines
from ._metrics import metrics_response

if TYPE_CHECKING:
    from ..calls import Runner

MAX_GRACE_MS = 60_000
WEBHOOK_PATH = "/v1/livekit/webhook"


def _grace_ms(raw: str | None) -> int:
    if raw is None:
        return 0
    if not (raw.isascii() and raw.isdigit()) or int(raw) > MAX_GRACE_MS:
        raise InvalidRequest(f"graceMs must be an integer from 0 to {MAX_GRACE_MS}, got {raw!r}")
    return int(raw)


def create_management_app(
    runner: Runner,
    journal: Journal,
    *,
    token: str,
    heartbeat_ms: int,
    closing: trio.Event,
    keeps_journal: bool = True,
    metrics: Metrics | None = None,
    health: Callable[[], Health] | None = None,
    livekit_webhook: Callable[[bytes, str], Awaitable[dict[str, object]]] | None = None,
) -> QuartTrio:
    """The management app of one runner.

    Args:
        runner: The calls this runner holds.
        journal: Where the events stream reads from.
        token: The bearer token every route but ``/health`` requires.
        heartbeat_ms: How long an idle stream waits before it writes a ping.
        closing: Set once the runner's terminal record is written: streams send
            what is left and finish, so the listener can close.
        metrics: Served at ``GET /v1/metrics`` (Prometheus text), behind the same token.
        keeps_journal: False for a runner that keeps no journal a host could read
            (``runner start --no-journal``): its events stream answers 404 ``no_journal``.
        health: What ``GET /health`` answers now (its state); by default the plain answer.
        livekit_webhook: A worker's receiver of the LiveKit server's webhooks, served at
            ``POST /v1/livekit/webhook`` (docs/failover.md): given the body and the
            ``Authorization`` header, it checks the server's signature (not the bearer token,
            which LiveKit does not have) and raises ``Unauthorized`` when it does not hold.
    """
    app = QuartTrio("runner.management")
    install_error_handlers(app)

    @app.before_request
    async def authenticate() -> None:
        if request.path == "/health":
            return
        if request.path == WEBHOOK_PATH and livekit_webhook is not None:
            if (request.content_length or 0) > MAX_BODY_BYTES:
                raise PayloadTooLarge(f"the body is over {MAX_BODY_BYTES} bytes")
            return  # signed by the LiveKit server: the route checks the signature
        if not bearer_matches(request.headers.get("Authorization", ""), token):
            raise Unauthorized()
        if not request.path.startswith("/v1/"):
            raise UnknownVersion(f"{request.path} is not under a protocol version; this runner speaks /v1/")
        if (request.content_length or 0) > MAX_BODY_BYTES:
            raise PayloadTooLarge(f"the body is over {MAX_BODY_BYTES} bytes")

    @app.before_websocket
    async def no_websockets() -> Response:
        # The management listener serves no WebSocket: a handshake is answered like any request.
        if not bearer_matches(websocket.headers.get("Authorization", ""), token):
            return error_response(Unauthorized())
        return error_response(NotFound(f"no WebSocket at {websocket.path}"))

    @app.get("/health")
    async def health_route() -> Response:
        if health is not None:
            return json_response(health())
        return json_response(
            Health(ok=True, protocol_version=PROTOCOL_VERSION, versions=list(PROTOCOL_VERSIONS))
        )

    if livekit_webhook is not None:
        receive = livekit_webhook

        @app.post(WEBHOOK_PATH)
        async def livekit_webhook_route() -> Response:
            body = await request.get_data(as_text=False)
            assert isinstance(body, bytes)
            answer = await receive(body, request.headers.get("Authorization", ""))
            return json_body_response(json.dumps(answer).encode())

    @app.get("/v1/runner/events")
    async def events() -> Response:
        if not keeps_journal:
            raise NoJournal("this runner keeps no journal (started with --no-journal)")
        cursor = parse_cursor(request.args.get("from"), journal.head)
        await check_cursor(journal, cursor)
        response = Response(
            stream_lines(journal, cursor, heartbeat_ms=heartbeat_ms, closing=closing),
            content_type="application/x-ndjson",
        )
        # The stream is endless: Quart would otherwise cut it after RESPONSE_TIMEOUT.
        response.timeout = None
        return response

    @app.get("/v1/metrics")
    async def scrape() -> Response:
        if metrics is None:
            raise NotFound("this runner keeps no metrics")
        return await metrics_response(metrics)

    @app.get("/v1/runner")
    async def runner_status() -> Response:
        runner.require_managed()
        return json_body_response(runner.status_json())

    @app.post("/v1/runner/drain")
    async def drain() -> Response:
        runner.require_managed()
        runner.drain_nowait("drain_request")
        return json_body_response(runner.status_json(), status=202)

    @app.post("/v1/sessions")
    async def start_call() -> Response:
        runner.require_managed()
        start = await read_body(StartCallRequest)
        call, accepted = await runner.start_call(start)
        return json_response(
            StartCallResponse(session_id=call.session_id, accepted=accepted, call=call.live()),
            status=202,
        )

    @app.get("/v1/sessions/<session_id>")
    async def get_call(session_id: str) -> Response:
        return json_response(runner.get(session_id).live())

    @app.delete("/v1/sessions/<session_id>")
    async def stop_call(session_id: str) -> Response:
        grace_ms = _grace_ms(request.args.get("graceMs"))
        reason = request.args.get("reason") or "stopped_by_host"
        return json_response(await runner.stop_call(session_id, reason=reason, grace_ms=grace_ms))

    @app.post("/v1/sessions/<session_id>/messages")
    async def host_message(session_id: str) -> Response:
        if runner.mode == "direct-join":
            raise RunnerTakesNoCalls("a direct-join runner has no host-to-agent path")
        call = runner.get(session_id)
        message = await read_body(HostMessage)
        delivered = await call.deliver_host_message(message)
        return json_response(HostMessageAccepted(id=message.id, delivered=delivered), status=202)

    @app.patch("/v1/sessions/<session_id>")
    async def adjust(session_id: str) -> Response:
        call = runner.get(session_id)
        update = await read_json()
        settings = await call.adjust("host", update)
        return json_response(SessionSettingsResponse(session_id=session_id, settings=settings))

    return app
