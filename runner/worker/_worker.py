"""The agent-worker socket: registration, availability, and each assigned job run as a call.

What the socket does, and why it is Trio, is told in the package's docstring
(:mod:`runner.worker`).
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections import deque
from collections.abc import Callable
from importlib import metadata
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import attrs
import trio
from livekit.protocol import agent as proto
from trio_websocket import (
    ConnectionClosed,
    ConnectionRejected,
    HandshakeError,
    WebSocketConnection,
    open_websocket_url,
)

from ..calls import END_REASON_CRASHED, Runner
from ..errors import RunnerError, Unauthorized
from ..transports.livekit import worker_token
from ..wire import (
    ResumedCall,
    StartCallRequest,
)
from ._api import AGENT_KIND, API_TIMEOUT_S, LiveKitApi
from ._failover import Failover
from ._rooms import (
    KEEPS_ROOM_RECORD,
    RESUMES_JOB_KEY,
    RESUMES_KEY,
    RoomRecords,
)

log = logging.getLogger("runner.worker")

AGENT_PATH = "/agent"
CONNECT_TIMEOUT_S = 10.0
REGISTER_TIMEOUT_S = 10.0
ASSIGNMENT_TIMEOUT_S = 7.5  # a slot promised in an availability answer is held this long
BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 10.0
CLOSE_TIMEOUT_S = 5.0
IDENTITY_PREFIX = "agent-"
# How a call that ended this way is reported to the server: anything else is a success.
_FAILED_PREFIXES = ("failed", "start_failed", END_REASON_CRASHED)


class WorkerRejected(RunnerError):
    """The LiveKit server refused the worker (bad key or secret, or no agent grant)."""

    code = "worker_rejected"


@attrs.frozen(kw_only=True)
class WorkerSetup:
    """How ``runner start`` reaches LiveKit.

    Attributes:
        url: The LiveKit server (``ws(s)://`` or ``http(s)://``); rooms are joined on the
            assignment's own URL, or on this one when the server sends none.
        api_key, api_secret: Sign the worker's token (``LIVEKIT_API_KEY`` / ``_SECRET``).
        agent_name: Explicit dispatch names it; empty takes automatic dispatch.
        ping_interval_s: How often the worker pings; no answer for two intervals is a
            lost socket.
    """

    url: str
    api_key: str
    api_secret: str
    agent_name: str = ""
    ping_interval_s: float = 5.0


def agent_url(url: str) -> str:
    """The ``/agent`` WebSocket URL of a LiveKit server URL."""
    parts = urlsplit(url)
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
    if scheme not in ("ws", "wss"):
        raise ValueError(f"a LiveKit URL is ws://, wss://, http:// or https://, got {url!r}")
    return urlunsplit((scheme, parts.netloc, parts.path.rstrip("/") + AGENT_PATH, "", ""))


def room_url(url: str) -> str:
    """The room URL the LiveKit transport joins (``ws(s)://``)."""
    parts = urlsplit(url)
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
    return urlunsplit((scheme, parts.netloc, parts.path, parts.query, ""))


def client_context_of(job: proto.Job) -> tuple[dict[str, str], dict[str, str]]:
    """The call's client context from the job, and what was refused (by source, why).

    The job's metadata counts when it is a JSON object of strings; the attributes of the
    participant a job names are a string map already. Participant attributes come first;
    the metadata's keys override them (the dispatcher's word is the later one).
    """
    context: dict[str, str] = {}
    refused: dict[str, str] = {}
    if job.HasField("participant"):
        context.update(dict(job.participant.attributes))
    if job.metadata:
        try:
            parsed = json.loads(job.metadata)
        except ValueError:
            parsed = None
            refused["metadata"] = "not JSON"
        if isinstance(parsed, dict):
            # The failover's own words, not the caller's context.
            parsed.pop(RESUMES_KEY, None)
            parsed.pop(RESUMES_JOB_KEY, None)
        if parsed is not None:
            if isinstance(parsed, dict) and all(isinstance(v, str) for v in parsed.values()):
                context.update(parsed)
            else:
                refused["metadata"] = "not a flat map of strings"
    return context, refused


def resumes_of(job: proto.Job) -> str:
    """The agent identity whose call this job picks up (a failover's re-dispatch), or ``""``."""
    try:
        parsed = json.loads(job.metadata) if job.metadata else None
    except ValueError:
        return ""
    value = parsed.get(RESUMES_KEY) if isinstance(parsed, dict) else None
    return value if isinstance(value, str) else ""


def _version() -> str:
    try:
        return metadata.version("curb-runner")
    except metadata.PackageNotFoundError:
        return "0"


class AgentWorker:
    """One runner's membership of a LiveKit agent-worker pool.

    Args:
        runner: Takes the assigned jobs as calls; its capacity and draining are the
            worker's availability.
        setup: Where and as whom to register.
    """

    def __init__(self, runner: Runner, setup: WorkerSetup) -> None:
        self.runner = runner
        self.setup = setup
        self.worker_id = ""
        self.registrations = 0
        self._url = agent_url(setup.url)
        self._outbox: deque[proto.WorkerMessage] = deque()
        self._outbox_changed = trio.Event()
        self._reserved: dict[str, float] = {}  # job id -> when the promise lapses (trio time)
        self._jobs = 0
        self._jobs_idle = trio.Event()
        self._jobs_idle.set()
        self._closing = False
        self._status_seq = 0
        self._last_status: tuple[int, bool, int] | None = None
        self.registered = False
        """Registered on an open socket now (False while it connects or reconnects)."""
        self._first_registration = trio.Event()
        self._api = LiveKitApi(setup.url, setup.api_key, setup.api_secret)
        self._background: trio.Nursery | None = None
        self._rooms = RoomRecords(self._api, runner.journal)
        self._failover = Failover(self._api, runner.journal, agent_name=setup.agent_name)
        self.room_writes = self._rooms.writes
        """Each write of a room's record: its bytes and how long it took (ms)."""
        self.failovers = self._failover.failovers
        """What this worker did about rooms whose agent left (moved or lost), oldest first."""

    # -- What the server is told ------------------------------------------------------------

    def _send_nowait(self, message: proto.WorkerMessage) -> None:
        self._outbox.append(message)
        self._outbox_changed.set()

    def _free_slots(self) -> int:
        now = trio.current_time()
        for job_id in [j for j, until in self._reserved.items() if until < now]:
            del self._reserved[job_id]
        return self.runner.config.max_sessions - len(self.runner.calls) - len(self._reserved)

    def _status_nowait(self, *, force: bool = False) -> None:
        draining = self.runner.draining
        busy = len(self.runner.calls) + len(self._reserved)
        full = draining or self._free_slots() <= 0
        state = (busy, draining, int(full))
        if not force and state == self._last_status:
            return
        self._last_status = state
        self._status_seq += 1
        self._send_nowait(
            proto.WorkerMessage(
                update_worker=proto.UpdateWorkerStatus(
                    status=proto.WS_FULL if full else proto.WS_AVAILABLE,
                    load=min(1.0, busy / self.runner.config.max_sessions),
                    job_count=len(self.runner.calls),
                    draining=draining,
                    seq=self._status_seq,
                )
            )
        )

    def _job_status_nowait(self, job_id: str, status: int, error: str = "") -> None:
        self._send_nowait(
            proto.WorkerMessage(update_job=proto.UpdateJobStatus(job_id=job_id, status=status, error=error))  # type: ignore[arg-type]  # protobuf's stub types an enum field as its enum class; the int is what it takes
        )

    # -- The service --------------------------------------------------------------------------

    async def wait_registered(self) -> None:
        """Wait until the worker first registered with the LiveKit server."""
        await self._first_registration.wait()

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Register and take jobs until the runner drained; started at once.

        An unreachable server is retried with backoff until it answers or the runner drains:
        the runner answers ``/health`` and drains on a signal meanwhile (:meth:`wait_registered`
        says when the worker is in LiveKit's pool).

        Raises:
            WorkerRejected: The server refused the worker's credentials.
        """
        try:
            await self._serve(task_status)
        finally:
            with trio.CancelScope(shield=True):
                await self._api.aclose()

    async def _serve(self, task_status: trio.TaskStatus[None]) -> None:
        async with trio.open_nursery() as nursery:
            self._background = nursery
            nursery.start_soon(self._watch_draining)
            nursery.start_soon(self._serve_socket, nursery)
            task_status.started()
            await self.runner.wait_drained()
            # Every call ended; its job's last status is queued once its task saw the end.
            await self._jobs_idle.wait()
            self._closing = True
            self._outbox_changed.set()
            if not self.registered:
                # No server to tell: stop connecting now rather than at the close deadline.
                nursery.cancel_scope.cancel()
            # The socket sends what is queued and closes; a socket that is down gets no retry.
            nursery.cancel_scope.deadline = trio.current_time() + CLOSE_TIMEOUT_S

    async def _watch_draining(self) -> None:
        await self.runner.wait_draining()
        log.info("draining: telling the LiveKit server to send no new jobs")
        self._status_nowait(force=True)

    async def _serve_socket(self, jobs: trio.Nursery) -> None:
        backoff = BACKOFF_FIRST_S

        def on_registered() -> None:
            nonlocal backoff
            backoff = BACKOFF_FIRST_S
            self.registered = True
            self._first_registration.set()

        for attempt in range(1_000_000_000):
            try:
                try:
                    await self._connect_once(jobs, on_registered)
                finally:
                    self.registered = False
            except Exception as exc:
                # The socket's tasks may report a loss as a group (a write and a read failing
                # together): it is a loss when every error in it is one.
                errors = _leaves(exc)
                refused = [
                    e for e in errors if isinstance(e, ConnectionRejected) and e.status_code in (401, 403)
                ]
                if refused:
                    raise WorkerRejected(
                        f"the LiveKit server at {self._url} refused the worker ({refused[0].status_code}):"
                        " check LIVEKIT_API_KEY and LIVEKIT_API_SECRET"
                    ) from exc
                if not all(isinstance(e, _SOCKET_LOST) for e in errors):
                    raise
                if self._closing:
                    return
                log.warning("the LiveKit worker socket was lost: %s", "; ".join(_describe(e) for e in errors))
            if self._closing:
                return
            # Jittered, so a fleet that lost its server does not come back in step.
            delay = backoff * (0.5 + random.random() / 2)
            log.info("reconnecting to the LiveKit server in %.1f s (attempt %d)", delay, attempt + 1)
            await trio.sleep(delay)
            if self._closing:
                return
            backoff = min(BACKOFF_MAX_S, backoff * 2)

    async def _connect_once(self, jobs: trio.Nursery, on_registered: Callable[[], None]) -> None:
        token = worker_token(self.setup.api_key, self.setup.api_secret)
        headers = [(b"authorization", f"Bearer {token}".encode())]
        async with open_websocket_url(
            self._url, extra_headers=headers, connect_timeout=CONNECT_TIMEOUT_S, disconnect_timeout=1.0
        ) as ws:
            await ws.send_message(
                proto.WorkerMessage(
                    register=proto.RegisterWorkerRequest(
                        type=proto.JT_ROOM,
                        agent_name=self.setup.agent_name,
                        version=_version(),
                        ping_interval=max(1, round(self.setup.ping_interval_s)),
                    )
                ).SerializeToString()
            )
            with trio.fail_after(REGISTER_TIMEOUT_S):
                answer = await _receive(ws)
                while not answer.HasField("register"):
                    answer = await _receive(ws)
            self.worker_id = answer.register.worker_id
            self.registrations += 1
            log.info(
                "registered with the LiveKit server as worker %s (agent name %r)",
                self.worker_id,
                self.setup.agent_name,
            )
            on_registered()
            # What waited for this socket: job statuses still count; pings and worker statuses
            # are stale (a fresh one follows).
            kept = [m for m in self._outbox if m.HasField("update_job")]
            self._outbox.clear()
            self._outbox.extend(kept)
            self._last_status = None
            self._status_nowait()
            heard = [trio.current_time()]
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._write, ws, nursery.cancel_scope)
                nursery.start_soon(self._ping, ws, heard)
                await self._read(ws, jobs, heard)
                nursery.cancel_scope.cancel()
            if not self._closing:
                raise _SocketLost("the server closed the socket")

    async def _write(self, ws: WebSocketConnection, scope: trio.CancelScope) -> None:
        # A message leaves the outbox only once sent: a lost socket keeps it for the next one.
        while True:
            while self._outbox:
                await ws.send_message(self._outbox[0].SerializeToString())
                self._outbox.popleft()
            if self._closing:
                with trio.move_on_after(CLOSE_TIMEOUT_S):
                    await ws.aclose()
                scope.cancel()
                return
            self._outbox_changed = trio.Event()
            await self._outbox_changed.wait()

    async def _ping(self, ws: WebSocketConnection, heard: list[float]) -> None:
        interval = self.setup.ping_interval_s
        while True:
            await trio.sleep(interval)
            if trio.current_time() - heard[0] > 2 * interval:
                log.warning("the LiveKit server did not answer for %.1f s", 2 * interval)
                await ws.aclose()
                return
            self._send_nowait(proto.WorkerMessage(ping=proto.WorkerPing(timestamp=int(time.time() * 1000))))
            self._status_nowait(force=True)

    async def _read(self, ws: WebSocketConnection, jobs: trio.Nursery, heard: list[float]) -> None:
        while True:
            try:
                message = await _receive(ws)
            except ConnectionClosed:
                return
            heard[0] = trio.current_time()
            which = message.WhichOneof("message")
            if which == "availability":
                self._on_availability(message.availability)
            elif which == "assignment":
                self._on_assignment(message.assignment, jobs)
            elif which == "termination":
                self._on_termination(message.termination.job_id)
            elif which in ("pong", "register"):
                pass
            else:
                log.info("ignored a %s message from the LiveKit server", which)

    # -- Jobs ---------------------------------------------------------------------------------

    def _on_availability(self, request: proto.AvailabilityRequest) -> None:
        job = request.job
        # Refused when draining or full; a promise holds the slot until the assignment.
        available = not self.runner.draining and self._free_slots() > 0
        if available:
            self._reserved[job.id] = trio.current_time() + ASSIGNMENT_TIMEOUT_S
        log.info("job %s in room %r: %s", job.id, job.room.name, "available" if available else "refused")
        self._send_nowait(
            proto.WorkerMessage(
                availability=proto.AvailabilityResponse(
                    job_id=job.id,
                    available=available,
                    # A re-dispatch takes the identity of the agent it replaces: should two
                    # take it, LiveKit keeps the newer one only (one agent per room).
                    participant_identity=resumes_of(job) or IDENTITY_PREFIX + job.id,
                    participant_name=self.setup.agent_name or "agent",
                )
            )
        )
        self._status_nowait()

    def _on_assignment(self, assignment: proto.JobAssignment, jobs: trio.Nursery) -> None:
        self._jobs += 1
        self._jobs_idle = trio.Event()
        jobs.start_soon(self._run_job, assignment)

    def _on_termination(self, job_id: str) -> None:
        call = self.runner.calls.get(job_id)
        log.info("the LiveKit server ended job %s%s", job_id, "" if call else " (not running here)")
        if call is not None:
            call.stop_nowait("job_terminated")

    def _report_end(self, job_id: str, reason: str) -> None:
        if reason.startswith(_FAILED_PREFIXES):
            self._job_status_nowait(job_id, proto.JS_FAILED, reason)
        else:
            self._job_status_nowait(job_id, proto.JS_SUCCESS)

    async def _run_job(self, assignment: proto.JobAssignment) -> None:
        job = assignment.job
        room = job.room.name
        try:
            context, refused = client_context_of(job)
            if refused:
                log.warning("job %s: refused as client context: %s", job.id, refused)
            origin: dict[str, Any] = {
                "jobId": job.id,
                "dispatchId": job.dispatch_id,
                "room": room,
                "agentName": job.agent_name,
                "workerId": self.worker_id,
            }
            if refused:
                origin["refused"] = refused
            resumes = resumes_of(job)
            identity = resumes or IDENTITY_PREFIX + job.id
            resume: ResumedCall | None = None
            if resumes:
                # The call another worker held: its conversation is in the room's record.
                resume, record = await self._rooms.resumed(room, resumes)
                origin["resumes"] = {"agent": resumes, "jobId": str((record or {}).get("job", ""))}
            start = StartCallRequest(
                session_id=job.id,
                realtime_url=room_url(assignment.url or self.setup.url),
                realtime_token=assignment.token,
                client_context=context,
                resume=resume,
            )
            cursor = self.runner.journal.head
            # Registered by start_call before its first checkpoint: the slot moves from the
            # promise to the call without a moment where it is counted twice or not at all.
            self._reserved.pop(job.id, None)
            try:
                call, _ = await self.runner.start_call(start, origin=origin)
            except RunnerError as exc:
                self._job_status_nowait(job.id, proto.JS_FAILED, f"{exc.code}: {exc.detail or ''}")
                return
            self._job_status_nowait(job.id, proto.JS_RUNNING)
            self._status_nowait()
            record = {
                "v": 1,
                "state": "live",
                "agent": identity,
                "agentName": job.agent_name,
                "job": job.id,
                "dispatchId": job.dispatch_id,
                "clientContext": context,
            }
            history = list(resume.history) if resume is not None else []
            # The status goes out as the call starts to end, before it leaves the room: the
            # server marks a job whose agent left the room first "failed".
            reported = False
            forgotten = trio.Event()
            carrying = trio.CancelScope()
            async with trio.open_nursery() as nursery:

                async def carry() -> None:
                    with carrying:
                        await self._rooms.carry(call, room, record, history, cursor)

                async def report_on_stop() -> None:
                    nonlocal reported
                    reason = await call.wait_stopping()
                    self._report_end(job.id, reason)
                    reported = True
                    carrying.cancel()
                    # Before the agent leaves: a room whose record is gone is not picked up.
                    if not reason.startswith(KEEPS_ROOM_RECORD):
                        await self._rooms.forget(room, job.id)
                    forgotten.set()

                nursery.start_soon(carry)
                nursery.start_soon(report_on_stop)
                await call.wait_ended()
                with trio.move_on_after(API_TIMEOUT_S):
                    await forgotten.wait()
                nursery.cancel_scope.cancel()
            if not reported:
                self._report_end(job.id, call.end_reason)
        finally:
            self._reserved.pop(job.id, None)
            self._status_nowait()
            self._jobs -= 1
            if self._jobs == 0:
                self._jobs_idle.set()

    # -- Failover: a dead worker's rooms are dispatched again (_failover.py) -------------------

    async def on_webhook(self, body: bytes, authorization: str) -> dict[str, object]:
        """A webhook of the LiveKit server (``POST /v1/livekit/webhook``): an agent that left a
        room whose record says its call was live is sent back there (in the background)."""
        from livekit import api

        receiver = api.WebhookReceiver(api.TokenVerifier(self.setup.api_key, self.setup.api_secret))
        try:
            event = receiver.receive(body.decode(errors="replace"), authorization)
        except Exception as exc:  # noqa: BLE001 - livekit-api raises bare Exceptions for a bad signature
            log.warning("a webhook with a signature that does not hold was refused: %s", exc)
            raise Unauthorized() from None
        if event.event != "participant_left" or event.participant.kind != AGENT_KIND:
            return {"taken": False}
        if self._background is None or self._closing:
            return {"taken": False}
        taken = self._failover.rescue_nowait(
            event.room.name, event.participant.identity, event.room.metadata, self._background
        )
        return {"taken": taken}


class _SocketLost(Exception):
    pass


_SOCKET_LOST = (OSError, HandshakeError, ConnectionClosed, trio.TooSlowError, _SocketLost)


def _leaves(error: BaseException) -> list[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in _leaves(inner)]
    return [error]


def _describe(error: BaseException) -> str:
    if isinstance(error, ConnectionRejected):
        return f"refused ({error.status_code})"
    return str(error) or type(error).__name__


async def _receive(ws: WebSocketConnection) -> proto.ServerMessage:
    data = await ws.get_message()
    message = proto.ServerMessage()
    if isinstance(data, str):
        raise _SocketLost("the LiveKit server sent a text frame on the worker socket")
    message.ParseFromString(data)
    return message
