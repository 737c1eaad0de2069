"""The runner's calls: capacity, generation, draining, and the registry of live calls."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import trio

from journal import Journal, JournalClosed, JournalWriteFailed

from ..config import Config, Mode
from ..errors import (
    GenerationMismatch,
    JournalUnwritable,
    RunnerAtCapacity,
    RunnerDraining,
    RunnerError,
    RunnerTakesNoCalls,
    SessionNotFound,
    StartFailed,
)
from ..lifecycle import emit_lifecycle
from ..sessions import (
    CallTarget,
    Transport,
    TransportError,
)
from ..telemetry import current_metrics
from ..wire import (
    PROTOCOL_VERSION,
    DrainReason,
    LifecycleDraining,
    LiveCall,
    RunnerStatus,
    StartCallRequest,
    StopCallResponse,
    encode,
    json_bytes,
)
from ._call import Call, CallContext, ConversationFactory
from ._record import CallRecord
from ._status import StatusParts

log = logging.getLogger("runner.calls")
STOP_GRACE_S = 5.0
# After a drain stopped its calls: how long their ends may take before the runner stops anyway.
STOP_DEADLINE_S = 10.0


class _NoTransport:
    """Stands in for a missing transport: every join fails with ``detail``."""

    name = "none"

    def __init__(self, detail: str) -> None:
        self.detail = detail

    def handles(self, url: str) -> bool:
        return False

    def open_session(self, target: CallTarget) -> Any:
        raise TransportError(self.detail)


class Runner:
    """The calls one runner process holds.

    Args:
        config: Capacity and generation.
        journal: Where every call's record goes.
        transports: Tried in order; the first that handles a call's URL joins it.
        conversation_factory: Makes the agent's side of each call.
    """

    def __init__(
        self,
        config: Config,
        journal: Journal,
        *,
        transports: Sequence[Transport],
        conversation_factory: ConversationFactory | None,
        experiment_chooser: Callable[[StartCallRequest], Mapping[str, str]] | None = None,
    ) -> None:
        self.config = config
        self.journal = journal
        self.transports = list(transports)
        self.calls: dict[str, Call] = {}
        # Each held call's LiveCall as JSON, in the order of `calls`: kept by the calls.
        self._statuses = StatusParts()
        self.draining = False
        self._conversation_factory = conversation_factory
        self._experiment_chooser = experiment_chooser
        self._nursery: trio.Nursery | None = None
        self._drain_requested = trio.Event()
        self._drained = trio.Event()
        self.drain_reason: DrainReason = "drain_request"
        self._idle = trio.Event()
        self._idle.set()
        self.unclosed: list[str] = []
        """Calls whose ``curb.ended`` could not be written before the runner stopped."""

    @property
    def mode(self) -> Mode:
        return self.config.mode

    def require_managed(self) -> None:
        """Routes that place or retire calls exist only on a managed runner."""
        if self.mode != "managed":
            raise RunnerTakesNoCalls(f"a {self.mode} runner takes no calls from a host")

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Host the calls' nursery until the runner drained. Every call ends before this returns."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await self._drain_requested.wait()
            self.draining = True
            try:
                await emit_lifecycle(
                    self.journal,
                    LifecycleDraining(reason=self.drain_reason, active_sessions=len(self.calls)),
                )
            except JournalWriteFailed as exc:
                log.error("the draining record was not written: %s", exc)
            with trio.move_on_after(self.config.drain_grace_ms / 1000):
                await self._idle.wait()
            for call in list(self.calls.values()):
                call.stop_nowait(
                    "runner_draining", grace_ms=min(self.config.drain_grace_ms, int(STOP_GRACE_S * 1000))
                )
            # The deadline of the end: a call whose record cannot be closed (the journal cannot
            # write) does not hold the process; the next start closes its record.
            with trio.move_on_after(STOP_GRACE_S + STOP_DEADLINE_S):
                await self._idle.wait()
            if self.calls:
                self.unclosed = sorted(self.calls)
                log.error(
                    "%d calls could not close their record (%s); the next start closes them",
                    len(self.unclosed),
                    ", ".join(self.unclosed[:5]),
                )
                nursery.cancel_scope.cancel()
        self._drained.set()

    async def wait_drained(self) -> None:
        """Wait until the runner drained and its last call ended."""
        await self._drained.wait()

    async def wait_draining(self) -> None:
        """Wait until the runner is asked to drain (it then takes no new calls)."""
        await self._drain_requested.wait()

    def drain_nowait(self, reason: DrainReason) -> None:
        """Take no new calls, let those in progress finish, then let :meth:`serve` return."""
        if not self._drain_requested.is_set():
            self.drain_reason = reason
            self.draining = True
            self._drain_requested.set()

    def status(self) -> RunnerStatus:
        return self._status([call.live() for call in self.calls.values()])

    def status_json(self) -> bytes:
        """:meth:`status` as JSON, in one pass: the calls' parts are kept up to date as they change."""
        head = encode(self._status([]))
        del head["sessions"]
        return self._statuses.joined(json_bytes(head)[:-1] + b',"sessions":[', b"]}")

    def _status(self, sessions: list[LiveCall]) -> RunnerStatus:
        return RunnerStatus(
            protocol_version=PROTOCOL_VERSION,
            deployment_id=self.config.deployment_id,
            configuration_version=self.config.configuration_version,
            max_sessions=self.config.max_sessions,
            active_sessions=len(self.calls),
            draining=self.draining,
            sessions=sessions,
        )

    def get(self, session_id: str) -> Call:
        call = self.calls.get(session_id)
        if call is None:
            raise SessionNotFound(f"no call {session_id!r} on this runner")
        return call

    def _check_generation(self, start: StartCallRequest) -> None:
        config = self.config
        if None not in (config.deployment_id, start.deployment_id) and (
            config.deployment_id != start.deployment_id
        ):
            raise GenerationMismatch(
                f"this runner serves deployment {config.deployment_id!r}, not {start.deployment_id!r}"
            )
        if None not in (config.configuration_version, start.configuration_version) and (
            config.configuration_version != start.configuration_version
        ):
            raise GenerationMismatch(
                f"this runner serves configuration version {config.configuration_version},"
                f" not {start.configuration_version}"
            )

    def _transport_for(self, url: str) -> Transport:
        for transport in self.transports:
            if transport.handles(url):
                return transport
        # The call still runs its failure path, so its record says why it did not start.
        return _NoTransport(f"no transport on this runner joins {url.split(':', 1)[0]!r} URLs")

    async def start_call(
        self, start: StartCallRequest, *, origin: Mapping[str, Any] | None = None
    ) -> tuple[Call, bool]:
        """Place a call; answer once it connected. A repeat returns ``(call, False)``.

        ``origin`` says where a call not placed by a host came from (a worker's LiveKit
        job); it is written in ``curb.started`` as ``job``.

        Raises:
            RunnerDraining, GenerationMismatch, RunnerAtCapacity, StartFailed.
        """
        try:
            return await self._start_call(start, origin)
        except RunnerError as refusal:
            metrics = current_metrics()
            if metrics is not None:
                metrics.starts_refused.labels(refusal.code).inc()
            raise

    async def _start_call(
        self, start: StartCallRequest, origin: Mapping[str, Any] | None
    ) -> tuple[Call, bool]:
        # Everything up to registering the call runs without a checkpoint, so two
        # concurrent starts of one session id cannot both pass the checks.
        if self.draining:
            raise RunnerDraining("this runner is draining; place the call on another runner")
        self._check_generation(start)
        existing = self.calls.get(start.session_id)
        if existing is not None:
            return existing, False
        if len(self.calls) >= self.config.max_sessions:
            raise RunnerAtCapacity(f"this runner holds {len(self.calls)} of {self.config.max_sessions} calls")
        transport = self._transport_for(start.realtime_url)
        assert self._nursery is not None, "Runner.serve is not running"
        experiments = dict(start.experiments or {})
        if self._experiment_chooser is not None:
            experiments = dict(self._experiment_chooser(start))
        context = CallContext(
            session_id=start.session_id,
            direction=start.direction,
            client=dict(start.client_context or {}),
            experiments=experiments,
            deployment_id=start.deployment_id,
            configuration_version=start.configuration_version,
            resume=start.resume,
        )
        call = Call(
            start,
            transport=transport,
            record=CallRecord(self.journal, start.session_id),
            context=context,
            conversation_factory=self._conversation_factory,
            origin=origin,
            statuses=self._statuses,
        )
        self.calls[call.session_id] = call
        self._idle = trio.Event()
        self._nursery.start_soon(self._run_call, call)
        error = await call.wait_started()
        if call.not_recorded is not None:
            if isinstance(call.not_recorded, JournalClosed):
                raise RunnerDraining("this runner is shutting down; place the call on another runner")
            raise JournalUnwritable(
                f"the call was not started: the journal cannot write ({call.not_recorded});"
                " place it on another runner"
            )
        if error is not None:
            await call.wait_closed()
            raise StartFailed(error)
        return call, True

    async def _run_call(self, call: Call) -> None:
        try:
            await call.run()
        except Exception:  # noqa: BLE001 - one call's failure (logged by the call) never takes the runner down
            pass  # logged by the call; one call's failure never takes the runner down
        finally:
            del self.calls[call.session_id]
            self._statuses.discard(call.session_id)
            if not self.calls:
                self._idle.set()

    async def stop_call(self, session_id: str, *, reason: str, grace_ms: int) -> StopCallResponse:
        """End a call with ``reason``; answer once it ended. Stopping an unknown call is no error."""
        call = self.calls.get(session_id)
        if call is None:
            return StopCallResponse(session_id=session_id, stopped=False)
        call.stop_nowait(reason, grace_ms)
        await call.wait_closed()
        return StopCallResponse(session_id=session_id, stopped=True)
