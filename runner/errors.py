"""Domain errors, each carrying its HTTP status and wire code; one handler renders them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Self, cast

from .wire import PROTOCOL_VERSIONS, ErrorBody, ErrorCode, Issue


class RunnerError(Exception):
    """Base of every error the host protocol names. Subclasses set ``status`` and ``code``."""

    status = 500
    code = "internal"

    def __init__(self, detail: str | None = None) -> None:
        super().__init__(detail or self.code)
        self.detail = detail

    @property
    def wire_code(self) -> ErrorCode:
        """``code`` as ErrorBody types it: the host protocol's errors carry its codes; the agent
        API's REST answers use the same body with codes of its own (``conflict``)."""
        return cast("ErrorCode", self.code)

    def body(self) -> ErrorBody:
        return ErrorBody(error=self.wire_code, detail=self.detail)

    @classmethod
    def from_body(cls, body: ErrorBody) -> Self:
        """The error an answer's ErrorBody names, as a host reads it (the inverse of :meth:`body`)."""
        return cls(body.detail)


class Unauthorized(RunnerError):
    status = 401
    code = "unauthorized"

    def body(self) -> ErrorBody:
        # An unauthenticated caller learns nothing, not even prose.
        return ErrorBody(error=self.wire_code)


class UnknownVersion(RunnerError):
    status = 404
    code = "unknown_version"

    def __init__(self, detail: str | None = None, versions: Sequence[int] = PROTOCOL_VERSIONS) -> None:
        super().__init__(detail)
        self.versions = list(versions)

    def body(self) -> ErrorBody:
        return ErrorBody(error=self.wire_code, detail=self.detail, versions=self.versions)

    @classmethod
    def from_body(cls, body: ErrorBody) -> Self:
        return cls(body.detail, body.versions or ())


class NotFound(RunnerError):
    status = 404
    code = "not_found"


class InvalidRequest(RunnerError):
    status = 400
    code = "invalid_request"

    def __init__(self, detail: str | None = None, issues: Sequence[Issue] | None = None) -> None:
        super().__init__(detail)
        self.issues = list(issues) if issues else None

    def body(self) -> ErrorBody:
        return ErrorBody(error=self.wire_code, detail=self.detail, issues=self.issues)

    @classmethod
    def from_body(cls, body: ErrorBody) -> Self:
        return cls(body.detail, body.issues)


class PayloadTooLarge(InvalidRequest):
    """A body over the listener's limit (1 MiB): ``invalid_request`` with HTTP's own 413."""

    status = 413


class SessionNotFound(RunnerError):
    status = 404
    code = "session_not_found"


class RunnerAtCapacity(RunnerError):
    status = 409
    code = "runner_at_capacity"


class JournalUnwritable(RunnerAtCapacity):
    """The journal cannot write (a full disk, an I/O error): nothing was recorded, so nothing is
    acknowledged. On the wire it is ``runner_at_capacity`` (this runner cannot take it now; place or
    retry elsewhere, docs/operations.md), so a host reads it as :class:`RunnerAtCapacity`."""


class GenerationMismatch(RunnerError):
    status = 409
    code = "generation_mismatch"


class RunnerDraining(RunnerError):
    status = 503
    code = "runner_draining"


class StartFailed(RunnerError):
    """The runner could not start the call at all (its transport or agent failed to start)."""

    status = 502
    code = "start_failed"


class RunnerTakesNoCalls(RunnerError):
    status = 501
    code = "runner_takes_no_calls"


class CursorTooOld(RunnerError):
    status = 410
    code = "cursor_too_old"

    def __init__(self, requested: int, oldest_retained: int, detail: str | None = None) -> None:
        super().__init__(detail)
        self.requested = requested
        self.oldest_retained = oldest_retained

    def body(self) -> ErrorBody:
        return ErrorBody(
            error=self.wire_code,
            detail=self.detail,
            requested=self.requested,
            oldest_retained=self.oldest_retained,
        )

    @classmethod
    def from_body(cls, body: ErrorBody) -> Self:
        return cls(body.requested or 0, body.oldest_retained or 1, body.detail)


class NoJournal(RunnerError):
    status = 404
    code = "no_journal"


class Internal(RunnerError):
    status = 500
    code = "internal"


class _Refusal(RunnerError):
    status = 422

    def __init__(self, detail: str | None = None, issues: Sequence[Issue] | None = None) -> None:
        super().__init__(detail)
        self.issues = list(issues) if issues else None

    def body(self) -> ErrorBody:
        return ErrorBody(error=self.wire_code, detail=self.detail, issues=self.issues)

    @classmethod
    def from_body(cls, body: ErrorBody) -> Self:
        return cls(body.detail, body.issues)


class NoHandler(_Refusal):
    code = "no_handler"


class InvalidPayload(_Refusal):
    code = "invalid_payload"


class HandlerFailed(_Refusal):
    code = "handler_failed"


class InvalidSettings(_Refusal):
    code = "invalid_settings"


class NotAdjustable(RunnerError):
    status = 403
    code = "not_adjustable"

    def __init__(self, path: str, detail: str | None = None) -> None:
        super().__init__(detail or f"{path} is not adjustable")
        self.path = path

    def body(self) -> ErrorBody:
        return ErrorBody(error=self.wire_code, detail=self.detail, path=self.path)

    @classmethod
    def from_body(cls, body: ErrorBody) -> Self:
        return cls(body.path or "", body.detail)
