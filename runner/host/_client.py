"""A host's client for one runner: every route of the host protocol, answers as wire types.

Errors come back as the runner's own domain errors (``runner.errors``), one class per wire
code, rebuilt from the answer's ErrorBody; the ``error`` field picks the class, never
``detail``. Transport failures are :class:`RunnerUnreachable`, which says whether the request
may have reached the runner.
"""

from __future__ import annotations

import typing
from types import TracebackType
from typing import Any, Literal, TypeVar
from urllib.parse import quote

import httpx

from ..wire import (
    Health,
    HostMessage,
    HostMessageAccepted,
    LiveCall,
    RunnerStatus,
    SessionSettingsResponse,
    SessionUpdate,
    StartCallRequest,
    StartCallResponse,
    StopCallResponse,
    decode,
    encode,
    parse_json,
)
from ._errors import UnknownError, error_from_answer

if typing.TYPE_CHECKING:
    from ._follow import EventFollower, EventsCursor

T = TypeVar("T")

DEFAULT_TIMEOUT = httpx.Timeout(10.0, read=30.0)
"""A start answers once the call joined (up to 15 s on the runner), so reads wait longer."""


class RunnerUnreachable(Exception):
    """No answer came from the runner.

    Attributes:
        url: The runner's base URL.
        maybe_delivered: False when the request certainly never reached the runner (the
            connection was refused or never made), so retrying anywhere is safe; True when
            it may have arrived and only the answer was lost.
    """

    def __init__(self, url: str, maybe_delivered: bool, cause: BaseException) -> None:
        super().__init__(f"{url}: {type(cause).__name__}: {cause}")
        self.url = url
        self.maybe_delivered = maybe_delivered


def _never_sent(exc: httpx.RequestError) -> bool:
    return isinstance(
        exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout | httpx.UnsupportedProtocol
    )


class RunnerClient:
    """An async client for one runner's management API, under Trio or asyncio.

    Use it as an async context manager, or call :meth:`aclose`. Every method is one request
    and never retries on its own (a retried start is :class:`RunnerPool`'s business).

    Args:
        base_url: The runner's management address, ``http://127.0.0.1:7071``.
        token: The runner's management token (``CURB_MANAGEMENT_TOKEN``).
        timeout: httpx timeouts for every request but the events stream.
        transport: An httpx transport (for example ``httpx.AsyncHTTPTransport(retries=0)``
            with your own TLS settings).

    Raises (from every method):
        RunnerError: The runner refused; the subclass is the wire code
            (:class:`~runner.errors.RunnerDraining`, :class:`~runner.errors.CursorTooOld`, ...),
            :class:`UnknownError` for a code this client does not know.
        RunnerUnreachable: No answer came.
        WireError: An answer did not decode as its protocol type.
    """

    def __init__(
        self,
        base_url: str,
        *,
        token: str,
        timeout: httpx.Timeout = DEFAULT_TIMEOUT,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.http = httpx.AsyncClient(
            base_url=self.base_url,
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout,
            transport=transport,
        )

    async def __aenter__(self) -> RunnerClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self.http.aclose()

    def __repr__(self) -> str:
        return f"RunnerClient({self.base_url!r})"

    async def _call(
        self,
        method: Literal["GET", "POST", "PATCH", "DELETE"],
        path: str,
        answer: type[T],
        *,
        body: Any = None,
        params: dict[str, str] | None = None,
        starting: bool = False,
    ) -> T:
        try:
            response = await self.http.request(
                method, path, json=None if body is None else encode(body), params=params
            )
        except httpx.RequestError as exc:
            # Transport failures, and an answer httpx could not read (it may have been sent).
            raise RunnerUnreachable(self.base_url, not _never_sent(exc), exc) from exc
        if not 200 <= response.status_code < 300:
            raise error_from_answer(response.status_code, response.content, starting=starting)
        try:
            value = parse_json(response.content)
        except ValueError as exc:
            raise UnknownError(response.status_code, "", "the answer is not JSON") from exc
        return decode(answer, value)

    async def health(self) -> Health:
        """``GET /health`` (no token needed): the runner is up and speaks these versions."""
        return await self._call("GET", "/health", Health)

    async def status(self) -> RunnerStatus:
        """``GET /v1/runner``: capacity, draining, and the calls held."""
        return await self._call("GET", "/v1/runner", RunnerStatus)

    async def drain(self) -> RunnerStatus:
        """``POST /v1/runner/drain``: take no new calls, finish these, then exit."""
        return await self._call("POST", "/v1/runner/drain", RunnerStatus)

    async def start_call(self, request: StartCallRequest) -> StartCallResponse:
        """``POST /v1/sessions``: answers once the call connected.

        ``accepted`` is false for a repeat of a call this runner already holds, so a start
        whose answer was lost can be sent again with the same session id.

        Raises:
            RunnerDraining: Place the call on another runner.
            RunnerAtCapacity, GenerationMismatch: This runner cannot take it.
            UnknownVersion: Any 404: the runner speaks another protocol version.
            StartFailed: The call could not start (its transport or agent failed).
        """
        return await self._call("POST", "/v1/sessions", StartCallResponse, body=request, starting=True)

    async def get_call(self, session_id: str) -> LiveCall:
        """``GET /v1/sessions/{id}``. Raises SessionNotFound."""
        return await self._call("GET", _session(session_id), LiveCall)

    async def stop_call(
        self, session_id: str, *, reason: str | None = None, grace_ms: int = 0
    ) -> StopCallResponse:
        """``DELETE /v1/sessions/{id}``: answers once the call ended.

        ``stopped`` is false when the runner held no such call, so a retried stop is no error.

        Args:
            session_id: The call.
            reason: Written in its ``curb.ended`` (the runner's default: ``stopped_by_host``).
            grace_ms: 0 to 60000: how long the agent may finish its utterance.
        """
        params = {"graceMs": str(grace_ms)}
        if reason is not None:
            params["reason"] = reason
        return await self._call("DELETE", _session(session_id), StopCallResponse, params=params)

    async def send_message(self, session_id: str, message: HostMessage) -> HostMessageAccepted:
        """``POST /v1/sessions/{id}/messages``: answers once the agent's handlers ran.

        ``delivered`` is false when that id was already delivered (delivery is idempotent by id).

        Raises:
            NoHandler, InvalidPayload, HandlerFailed: The agent refused it; the id is not taken.
            RunnerAtCapacity: 32 messages already wait for the starting call.
            SessionNotFound, RunnerTakesNoCalls.
        """
        return await self._call("POST", _session(session_id) + "/messages", HostMessageAccepted, body=message)

    async def update_settings(self, session_id: str, update: SessionUpdate) -> SessionSettingsResponse:
        """``PATCH /v1/sessions/{id}``: a live settings change, all or nothing.

        Raises:
            NotAdjustable: A path the agent does not let the host change (``path`` names it).
            InvalidSettings: A value that does not fit (``issues`` say which).
        """
        return await self._call("PATCH", _session(session_id), SessionSettingsResponse, body=update)

    def follow_events(
        self,
        from_: int | EventsCursor | None = None,
        *,
        on_cursor_too_old: Literal["raise", "resync"] = "raise",
        silence_timeout_s: float = 45.0,
        classes: typing.Collection[str] | None = None,
        max_backoff_s: float = 5.0,
    ) -> EventFollower:
        """Follow ``GET /v1/runner/events``: every record once, in order, across reconnects.

        Use the result with ``async with`` and iterate it. See :class:`EventFollower`.

        Args:
            from_: Where to start: an envelope (exclusive; ``0`` replays everything still
                held), a saved :class:`EventsCursor`, or None to follow from now on.
            on_cursor_too_old: On 410, ``"raise"`` :class:`~runner.errors.CursorTooOld`, or
                ``"resync"``: yield a :class:`Lost` and go on with everything still held.
            silence_timeout_s: Reconnect when no line (record or ping) came for this long;
                keep it a comfortable multiple of the runner's ping interval (15 s).
            classes: Yield only records of these classes and count the rest as skipped
                (the protocol asks readers to skip classes they do not know). None: the
                protocol's own classes (:data:`KNOWN_CLASSES`); name a newer class here to
                receive it.
            max_backoff_s: The longest wait between reconnection attempts.
        """
        from ._follow import EventFollower

        return EventFollower(
            self,
            from_,
            on_cursor_too_old=on_cursor_too_old,
            silence_timeout_s=silence_timeout_s,
            classes=classes,
            max_backoff_s=max_backoff_s,
        )


def _session(session_id: str) -> str:
    return "/v1/sessions/" + quote(session_id, safe="")
