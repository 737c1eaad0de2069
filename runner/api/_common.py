"""What both listeners share: JSON answers, error rendering, body decoding."""

from __future__ import annotations

import logging
from typing import Any, TypeVar

from quart import Response, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException, MethodNotAllowed

from ..errors import InvalidRequest, NotFound, RunnerError
from ..wire import ErrorBody, Issue, WireError, decode, json_bytes, parse_json

T = TypeVar("T")

log = logging.getLogger("runner.api")


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
    except ValueError:
        raise InvalidRequest(
            "the body must be JSON", issues=[Issue(path=[], message="is not JSON")]
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

    @app.after_request
    async def drain_body(response: Response) -> Response:
        # Hypercorn starts a keep-alive connection's next request only once this one's
        # body was read, so an early answer (401, 404, 501) must still consume it.
        await request.get_data()
        return response

    @app.errorhandler(RunnerError)
    async def runner_error(error: RunnerError) -> Response:
        return error_response(error)

    @app.errorhandler(HTTPException)
    async def http_error(error: HTTPException) -> Response:
        status = error.code or 500
        if isinstance(error, MethodNotAllowed):
            allowed = ", ".join(sorted(error.valid_methods or ()))
            body = ErrorBody(
                error="not_found", detail=f"{request.method} is not served here; allowed: {allowed}"
            )
            return json_response(body, status=405)
        if status == 404:
            return error_response(NotFound(f"no route {request.path}"))
        if 400 <= status < 500:
            return error_response(InvalidRequest(error.description))
        log.error("HTTP error %s on %s %s", status, request.method, request.path)
        return json_response(ErrorBody(error="internal", detail="internal error"), status=500)

    @app.errorhandler(Exception)
    async def crash(error: Exception) -> Response:
        log.error("unhandled error on %s %s", request.method, request.path, exc_info=error)
        return json_response(ErrorBody(error="internal", detail="internal error"), status=500)
