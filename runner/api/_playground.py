"""The playground: ``runner dev``'s page on the public listener, and the routes only it uses.

Served only by a dev runner, whose listeners are the author's own (loopback by default).
The page talks to the agent over the ordinary ``ino.v2`` socket; three routes stand in for
what an app's server and a host would do:

- ``POST /dev/session``: mints an ephemeral key for the person ``playground`` and opens a
  conversation with it (an app's server does this with the API key).
- ``GET /dev/events?from=N``: the journal's records, as the management events stream
  sends them (a host reads that with the management token).
- ``GET``/``PATCH /dev/sessions/{id}``: a call's effective settings with the paths the
  host may change (``adjustable``), and a live change from the host's side (the
  management ``PATCH`` path).
"""

from __future__ import annotations

import json
from importlib import resources

import attrs
import trio
from quart import Response, request
from quart_trio import QuartTrio

from journal import Journal

from .. import ino_wire as w
from ..agent import AgentRuntime
from ..calls import Runner
from ..errors import NotFound
from ..transports.websocket import AgentSocketService
from ..wire import SessionSettingsResponse, converter
from ._common import json_response, read_json
from ._events import check_cursor, parse_cursor, stream_lines

PLAYGROUND_USER = "playground"
# The page keeps one key for the whole session of work: a day, the longest a key may live.
KEY_TTL_SECONDS = 86_400
_FILES = {
    "playground.js": "text/javascript; charset=utf-8",
    "vad.js": "text/javascript; charset=utf-8",
    "playground.css": "text/css; charset=utf-8",
}


@attrs.frozen(kw_only=True)
class Playground:
    """What the page's routes need from the runner that serves it."""

    runner: Runner
    journal: Journal
    heartbeat_ms: int
    closing: trio.Event


def _asset(name: str) -> bytes:
    return resources.files("runner").joinpath("playground", name).read_bytes()


def install_playground(app: QuartTrio, service: AgentSocketService, playground: Playground) -> None:
    """Add the page (``/``) and its dev-only routes to the public app."""
    page = _asset("index.html")
    assets = {name: (_asset(name), kind) for name, kind in _FILES.items()}

    @app.get("/")
    async def index() -> Response:
        return Response(page, content_type="text/html; charset=utf-8")

    @app.get("/playground/<name>")
    async def asset(name: str) -> Response:
        if name not in assets:
            raise NotFound(f"no playground file {name!r}")
        body, kind = assets[name]
        return Response(body, content_type=kind)

    @app.post("/dev/session")
    async def new_session() -> Response:
        minted = await service.mint_key(
            w.EphemeralKeyRequest(end_user_id=PLAYGROUND_USER, ttl_seconds=KEY_TTL_SECONDS)
        )
        conversation = await service.create_conversation(minted.row)
        body = {
            "token": minted.token,
            "session_id": conversation.conversation_id,
            "agent": service.agent.name,
        }
        return Response(json.dumps(body), status=201, content_type="application/json")

    @app.get("/dev/events")
    async def events() -> Response:
        journal = playground.journal
        cursor = parse_cursor(request.args.get("from"), journal.head)
        await check_cursor(journal, cursor)
        response = Response(
            stream_lines(journal, cursor, heartbeat_ms=playground.heartbeat_ms, closing=playground.closing),
            content_type="application/x-ndjson",
        )
        response.timeout = None  # endless, as the management stream
        return response

    @app.get("/dev/sessions/<session_id>")
    async def settings(session_id: str) -> Response:
        call = playground.runner.get(session_id)
        conversation = call.conversation
        if not isinstance(conversation, AgentRuntime):
            raise NotFound(f"call {session_id!r} has not started its agent yet")
        body = converter.unstructure(
            SessionSettingsResponse(session_id=session_id, settings=conversation.settings())
        )
        # The page's form offers only what the host's PATCH may change (the agent's `adjustable`).
        body["adjustable"] = list(conversation.agent.adjustable["host"])
        return json_response(body)

    @app.patch("/dev/sessions/<session_id>")
    async def adjust(session_id: str) -> Response:
        call = playground.runner.get(session_id)
        settings = await call.adjust("host", await read_json())
        return json_response(SessionSettingsResponse(session_id=session_id, settings=settings))
