"""What an error answer of a runner stands for: the runner's own error classes, by wire code."""

from __future__ import annotations

import typing
from typing import Any

from .. import errors
from ..errors import RunnerError, UnknownVersion
from ..wire import ErrorBody, ErrorCode, WireError, decode, parse_json

CODES: tuple[str, ...] = typing.get_args(ErrorCode)


def _error_classes() -> dict[str, type[RunnerError]]:
    found: dict[str, type[RunnerError]] = {}
    for name, value in vars(errors).items():
        if (
            isinstance(value, type)
            and issubclass(value, RunnerError)
            and not name.startswith("_")
            and "code" in vars(value)
            and value.code in CODES
        ):
            found[value.code] = value
    return found


ERRORS: dict[str, type[RunnerError]] = _error_classes()
"""The error class of each wire code: ``ERRORS["runner_draining"] is RunnerDraining``."""


class UnknownError(RunnerError):
    """An error answer whose code this client does not know (a newer runner), or no ErrorBody at all.

    Attributes:
        code: The answer's ``error`` field, or ``""`` when the body had none.
        status: The answer's HTTP status.
    """

    def __init__(self, status: int, code: str, detail: str | None) -> None:
        super().__init__(detail or f"HTTP {status} {code or '(no error code)'}")
        self.status = status
        self.code = code


def error_from_answer(status: int, content: bytes, *, starting: bool = False) -> RunnerError:
    """The exception a non-2xx answer stands for.

    Args:
        status: The answer's HTTP status.
        content: Its body.
        starting: The answer is to ``POST /v1/sessions``, where any 404 means the runner
            speaks another protocol version (older runners put prose in ``error``).
    """
    try:
        value: Any = parse_json(content)
    except ValueError:
        value = None
    try:
        body: ErrorBody | None = decode(ErrorBody, value)
    except WireError:
        body = None
    if starting and status == 404:
        detail = body.detail if body is not None else None
        versions = body.versions if body is not None and body.versions else ()
        return UnknownVersion(detail or "POST /v1/sessions answered 404: another protocol version", versions)
    if body is None:
        code = value.get("error") if isinstance(value, dict) else None
        detail = value.get("detail") if isinstance(value, dict) else None
        return UnknownError(
            status,
            code if isinstance(code, str) else "",
            detail if isinstance(detail, str) else None,
        )
    return ERRORS[body.error].from_body(body)
