"""What both listeners share: JSON answers, error rendering, body decoding."""

from __future__ import annotations

import hmac
import logging
from typing import Any, TypeVar

import trio
from quart import Response, has_request_context, request, websocket
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException, MethodNotAllowed, RequestEntityTooLarge

from journal import JournalWriteFailed

from ..errors import InvalidRequest, JournalUnwritable, NotFound, PayloadTooLarge, RunnerError
from ..wire import ErrorBody, Issue, WireError, decode, json_bytes, parse_json

T = TypeVar("T")

log = logging.getLogger("runner.api")

_DRAIN_S = 5.0  # a body that arrives a moment after an early answer keeps its connection
MAX_BODY_BYTES = 1 << 20
"""The largest request body either listener reads (413 past it)."""


def bearer_credential(header: str) -> str | None:
    """The credential of an ``Authorization: Bearer`` header (the scheme in any case, RFC 7235)."""
    scheme, _, credential = header.strip().partition(" ")
    credential = credential.strip()
    if scheme.lower() != "bearer" or not credential:
        return None
    return credential


def bearer_matches(header: str, token: str) -> bool:
    """Whether the header carries ``token``, compared in constant time."""
    credential = bearer_credential(header)
    return credential is not None and hmac.compare_digest(credential.encode(), token.encode())


def _where() -> tuple[str, str]:
    """The method and path of the request (or WebSocket handshake) being answered."""
    if has_request_context():
        return request.method, request.path
    return "WEBSOCKET", websocket.path


def json_response(value: Any, status: int = 200) -> Response:
    """A wire type (or plain JSON value) as a compact JSON response."""
    return json_body_response(json_bytes(value), status)


def json_body_response(body: bytes, status: int = 200) -> Response:
    """JSON already encoded (``Runner.status_json``) as a response."""
    return Response(body, status=status, content_type="application/json")


def error_response(error: RunnerError) -> Response:
    return json_response(error.body(), status=error.status)


async def read_json() -> Any:
    """The request's body as JSON, or raise ``invalid_request``."""
    try:
        return parse_json(await request.get_data())
    except ValueError as exc:
        raise InvalidRequest(
            f"the body must be JSON: {exc}", issues=[Issue(path=[], message=f"is not JSON: {exc}")]
        ) from None


async def read_body(cls: type[T]) -> T:
    """Decode the request's JSON body as ``cls``, or raise ``invalid_request``."""
    value = await read_json()
    try:
        return decode(cls, value)
    except WireError as exc:
        # Quart never sees the cattrs exception group: it becomes our own 400 here.
        raise InvalidRequest(str(exc), issues=exc.issues) from None


def install_error_handlers(app: QuartTrio) -> None:
    """Every non-2xx answer is an ErrorBody; anything unexpected is a logged 500."""

    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY_BYTES
    # Werkzeug answers a path with "//" (an id ending in %2F) with a 308 to the merged path, an
    # HTML page no handler sees: unmerged, such a path matches no route and is a 404 ErrorBody.
    # Set before any route is added: each rule takes it when added.
    app.url_map.merge_slashes = False

    @app.after_request
    async def drain_body(response: Response) -> Response:
        # Hypercorn starts a keep-alive connection's next request only once this one's
        # body was read, so an early answer (401, 404, 501) must still consume it. A body
        # over the limit, or one that does not come at once, is not waited for: the
        # connection closes after the answer instead.
        drained = False
        with trio.move_on_after(_DRAIN_S):
            try:
                await request.get_data()
                drained = True
            except RequestEntityTooLarge:
                pass
        if not drained:
            response.headers["Connection"] = "close"
        return response

    @app.errorhandler(RunnerError)
    async def runner_error(error: RunnerError) -> Response:
        return error_response(error)

    @app.errorhandler(HTTPException)
    async def http_error(error: HTTPException) -> Response:
        method, path = _where()
        status = error.code or 500
        if isinstance(error, RequestEntityTooLarge):
            return error_response(PayloadTooLarge(f"the body is over {MAX_BODY_BYTES} bytes"))
        if isinstance(error, MethodNotAllowed):
            allowed = ", ".join(sorted(error.valid_methods or ()))
            body = ErrorBody(error="not_found", detail=f"{method} is not served here; allowed: {allowed}")
            return json_response(body, status=405)
        if status == 404:
            return error_response(NotFound(f"no route {path}"))
        if 400 <= status < 500:
            return error_response(InvalidRequest(error.description))
        log.error("HTTP error %s on %s %s", status, method, path)
        return json_response(ErrorBody(error="internal", detail="internal error"), status=500)

    @app.errorhandler(Exception)
    async def crash(error: Exception) -> Response:
        failed = _journal_failure(error)
        if failed is not None:
            # Logged by the journal with SQLite's reason; nothing was recorded, nothing acknowledged.
            return error_response(JournalUnwritable(f"the journal cannot write: {failed}"))
        method, path = _where()
        log.error("unhandled error on %s %s", method, path, exc_info=error)
        return json_response(ErrorBody(error="internal", detail="internal error"), status=500)


def _journal_failure(error: BaseException) -> JournalWriteFailed | None:
    """The journal failure behind ``error``, when that is all there is to it."""
    if isinstance(error, JournalWriteFailed):
        return error
    if isinstance(error, BaseExceptionGroup):
        found, rest = error.split(JournalWriteFailed)
        if found is not None and rest is None:
            leaf: BaseException = found
            while isinstance(leaf, BaseExceptionGroup):
                leaf = leaf.exceptions[0]
            return leaf if isinstance(leaf, JournalWriteFailed) else None
    return None
