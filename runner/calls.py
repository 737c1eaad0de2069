"""The runner's calls: capacity, draining, and each call's lifecycle.

A call is one Trio nursery that owns its transport session, its agent's
conversation and its stop timer. Its record is written under its own producer
(the session id): ``curb.started`` first, ``curb.ended`` always last.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, Protocol

import attrs
import trio

from journal import Entry, Journal, JournalClosed, JournalWriteFailed, now_ms

from .config import Config, Mode
from .errors import (
    GenerationMismatch,
    JournalUnwritable,
    NoHandler,
    NotAdjustable,
    RunnerAtCapacity,
    RunnerDraining,
    RunnerError,
    RunnerTakesNoCalls,
    SessionNotFound,
    StartFailed,
)
from .lifecycle import emit_lifecycle
from .logs import bind_session
from .sessions import (
    CallTarget,
    Disconnected,
    ParticipantLeft,
    Transport,
    TransportError,
    TransportEvent,
    TransportSession,
)
from .telemetry import current_metrics, enter_span, exit_span, start_span
from .wire import (
    PROTOCOL_VERSION,
    Direction,
    DrainReason,
    EffectiveSettings,
    HostMessage,
    LifecycleDraining,
    LiveCall,
    RunnerStatus,
    StartCallRequest,
    State,
    StopCallResponse,
    encode,
    json_bytes,
)

log = logging.getLogger("runner.calls")

KEEP_JSON_BYTES = 4096
START_TIMEOUT_S = 15.0
MAX_HELD_MESSAGES = 32
END_REASON_CRASHED = "runner_crashed"
STOP_GRACE_S = 5.0
# After a drain stopped its calls: how long their ends may take before the runner stops anyway.
STOP_DEADLINE_S = 10.0


def keep_json(value: Any) -> tuple[Any, bool]:
    """The record's copy of a payload: as sent up to 4 KiB of JSON, else its first 4 KiB as text."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    data = text.encode()
    if len(data) <= KEEP_JSON_BYTES:
        return value, False
    return data[:KEEP_JSON_BYTES].decode(errors="ignore"), True


@attrs.frozen(kw_only=True)
class CallContext:
    """What the call was started with, as the agent reads it before its session starts."""

    session_id: str
    direction: Direction
    client: Mapping[str, str]
    experiments: Mapping[str, str]
    deployment_id: str | None = None
    configuration_version: int | None = None


def _event_body(name: str, payload: Mapping[str, Any]) -> dict[str, Any]:
    """A conversation event's body; the journal stamps its seq and at in after the type."""
    return {"type": "event", "name": name, "payload": dict(payload)}


class CallRecord:
    """Writes one call's records: its producer is the session id."""

    def __init__(self, journal: Journal, session_id: str) -> None:
        self.journal = journal
        self.session_id = session_id

    async def event(self, name: str, payload: Mapping[str, Any]) -> None:
        """A conversation event: ``{type:"event", seq, at, name, payload}``."""
        await self.journal.append(self.session_id, "conversation", _event_body(name, payload), stamp=True)

    async def end(self, reason: str, messages: Mapping[str, Any] | None) -> None:
        """The call's last records: ``curb.messages`` (for a call with an agent), then ``curb.ended``.

        One transaction: one commit (one fsync), and a crash leaves both or neither.
        """
        last = [("curb.messages", messages)] if messages is not None else []
        last.append(("curb.ended", {"reason": reason}))
        await self.journal.append_many(
            [
                Entry(
                    producer=self.session_id,
                    cls="conversation",
                    body=_event_body(name, payload),
                    stamp=True,
                    closes=name == "curb.ended",
                )
                for name, payload in last
            ]
        )

    async def write(self, cls: str, body: Mapping[str, Any]) -> int:
        """Any other record of this call (turns, host records); returns its seq."""
        record = await self.journal.append(self.session_id, cls, body, stamp=True)
        return record.seq


class Conversation(Protocol):
    """The agent's side of one call, run by the call once its transport is connected."""

    async def run(self, session: TransportSession, events: trio.MemoryReceiveChannel[TransportEvent]) -> None:
        """Converse over ``session``, taking the caller's ``events``, until cancelled."""
        ...

    async def finish_utterance(self) -> None:
        """Take no new turns; return once the agent stopped speaking."""
        ...

    async def deliver_host(self, message: HostMessage) -> None:
        """Deliver a host message (raises a refusal: no_handler, invalid_payload, handler_failed)."""
        ...

    async def adjust(self, origin: Literal["client", "host"], update: object) -> EffectiveSettings:
        """Apply a live settings change (raises not_adjustable, invalid_settings)."""
        ...

    refused_queued_host_messages: int

    def messages_summary(self) -> dict[str, Any]:
        """The ``curb.messages`` payload, written once the conversation stopped."""
        ...


ConversationFactory = Callable[[CallContext, CallRecord], Conversation]


class StatusParts:
    """Each held call's LiveCall as JSON, in start order, for ``GET /v1/runner``.

    Calls are grouped by start order, and each group keeps its parts joined until one of
    them changes, so an answer re-joins only the groups that changed since the last one.
    """

    GROUP = 128

    def __init__(self) -> None:
        self._groups: dict[int, dict[str, bytes]] = {}
        self._joined: dict[int, bytes] = {}
        self._group_of: dict[str, int] = {}
        self._added = 0

    def set(self, session_id: str, part: bytes) -> None:
        group = self._group_of.get(session_id)
        if group is None:
            # Only the newest group takes new calls, so the groups stay in start order.
            group = self._group_of[session_id] = self._added // self.GROUP
            self._added += 1
        self._groups.setdefault(group, {})[session_id] = part
        self._joined.pop(group, None)

    def discard(self, session_id: str) -> None:
        group = self._group_of.pop(session_id, None)
        if group is None:
            return
        parts = self._groups[group]
        del parts[session_id]
        self._joined.pop(group, None)
        if not parts:
            del self._groups[group]

    def joined(self, before: bytes = b"", after: bytes = b"") -> bytes:
        """Every part, comma-separated, between ``before`` and ``after``: one copy of the whole."""
        out = [before]
        for group, parts in self._groups.items():
            joined = self._joined.get(group)
            if joined is None:
                joined = self._joined[group] = b",".join(parts.values())
            out += (joined, b",")
        if len(out) > 1:
            out.pop()
        out.append(after)
        return b"".join(out)


class Call:
    """One call. Created and run by :class:`Runner`."""

    def __init__(
        self,
        start: StartCallRequest,
        *,
        transport: Transport,
        record: CallRecord,
        context: CallContext,
        conversation_factory: ConversationFactory | None,
        origin: Mapping[str, Any] | None = None,
        statuses: StatusParts | None = None,
    ) -> None:
        self.session_id = start.session_id
        self.origin = origin
        self.end_reason = ""
        self.start = start
        self.started_at_ms = now_ms()
        self._statuses = statuses
        self.state = "starting"
        self.context = context
        self.record = record
        self.session: TransportSession | None = None
        self.conversation: Conversation | None = None
        self._transport = transport
        self._conversation_factory = conversation_factory
        self._start_outcome = trio.Event()
        self._start_error: str | None = None
        self._stop_requested = trio.Event()
        self._stop_reason = "stopped"
        self._grace_ms = 0
        self._ended = trio.Event()
        self.not_recorded: Exception | None = None
        self._stopped = trio.Event()
        # Why the last write of this call's record failed, while its curb.ended waits to be written.
        self.record_error: str | None = None
        # The curb.messages payload, once the conversation stopped; written with curb.ended.
        self._messages: dict[str, Any] | None = None
        self.connected = trio.Event()
        # Host messages: ids taken (delivered, or held for delivery), and those held while starting.
        self._taken_ids: set[str] = set()
        self._held: list[HostMessage] = []
        self._held_delivered = trio.Event()

    @property
    def state(self) -> State:
        return self._state

    @state.setter
    def state(self, state: State) -> None:
        # The runner's status keeps each call's LiveCall as JSON, rewritten only when the
        # state changes, so GET /v1/runner joins them instead of encoding every call.
        self._state = state
        if self._statuses is not None:
            self._statuses.set(self.session_id, json_bytes(self.live()))

    def live(self) -> LiveCall:
        return LiveCall(session_id=self.session_id, state=self._state, started_at_ms=self.started_at_ms)

    def stop_nowait(self, reason: str, grace_ms: int = 0) -> None:
        """Ask the call to end: the agent may finish its utterance within ``grace_ms``."""
        if not self._stop_requested.is_set():
            self._stop_reason = reason
            self._grace_ms = grace_ms
            self._stop_requested.set()

    async def wait_started(self) -> str | None:
        """Wait for the join; return None once connected, else why it failed."""
        await self._start_outcome.wait()
        return self._start_error

    async def wait_ended(self) -> None:
        await self._ended.wait()

    async def wait_stopping(self) -> str:
        """Wait until the call is asked to end; return why. It leaves its room after this."""
        await self._stop_requested.wait()
        return self._stop_reason

    @property
    def ended(self) -> bool:
        return self._ended.is_set()

    async def wait_closed(self) -> None:
        """Wait until the call stopped and its ``curb.ended`` is written.

        Raises:
            JournalUnwritable: The call stopped, but the journal cannot write its end now; the
                call writes it once the journal can (so a retried stop answers then).
        """
        await self._stopped.wait()
        while not self._ended.is_set():
            if self.record_error is not None:
                raise JournalUnwritable(
                    f"the call stopped, but its curb.ended is not written yet: the journal cannot write"
                    f" ({self.record_error}); it is written once the journal can"
                )
            with trio.move_on_after(0.05):
                await self._ended.wait()

    async def deliver_host_message(self, message: HostMessage) -> bool:
        """Deliver a host message (see :meth:`_deliver_host_message`), counted by outcome."""
        metrics = current_metrics()
        if metrics is None:
            return await self._deliver_host_message(message)
        held = self.state == "starting"
        try:
            taken = await self._deliver_host_message(message)
        except RunnerError as refusal:
            metrics.host_messages.labels(refusal.code).inc()
            raise
        metrics.host_messages.labels(("held" if held else "delivered") if taken else "repeated").inc()
        return taken

    async def _deliver_host_message(self, message: HostMessage) -> bool:
        """Deliver a host message; False when its id was already delivered to this call.

        While the call starts, up to :data:`MAX_HELD_MESSAGES` are held and delivered in
        order once it connects. A refusal does not take the id.

        Raises:
            SessionNotFound: The call ended.
            RunnerAtCapacity: Already holding as many as it may.
            NoHandler, InvalidPayload, HandlerFailed: The agent refused it.
        """
        if self.state in ("ending", "ended"):
            raise SessionNotFound(f"the call {self.session_id!r} has ended")
        if message.id in self._taken_ids:
            return False
        if self.state == "connected" and self._held:
            # Held messages go first, in order; a message sent once connected is not held.
            await self._held_delivered.wait()
        if self.state == "starting":
            if len(self._held) >= MAX_HELD_MESSAGES:
                raise RunnerAtCapacity(
                    f"{MAX_HELD_MESSAGES} messages are already held for this starting call; retry once it is connected"
                )
            self._taken_ids.add(message.id)
            self._held.append(message)
            return True
        if self.conversation is None:
            raise NoHandler("this call has no agent to take messages")
        self._taken_ids.add(message.id)
        try:
            await self.conversation.deliver_host(message)
        except BaseException:
            self._taken_ids.discard(message.id)
            raise
        return True

    async def _deliver_held(self, conversation: Conversation) -> None:
        try:
            await self._deliver_held_in_order(conversation)
        finally:
            self._held_delivered.set()

    async def _deliver_held_in_order(self, conversation: Conversation) -> None:
        while self._held:
            # A stop ends delivery between two messages; the rest stay undelivered.
            await trio.lowlevel.checkpoint()
            message = self._held[0]
            try:
                await conversation.deliver_host(message)
            except RunnerError as refusal:
                # It was already answered 202: all that is left is to say so and count it.
                log.warning(
                    "held message %s (%r) refused on delivery: %s", message.id, message.name, refusal.code
                )
                conversation.refused_queued_host_messages += 1
            finally:
                self._held.pop(0)

    async def adjust(self, origin: Literal["client", "host"], update: object) -> EffectiveSettings:
        """A live settings change; a starting call applies it once connected (it is checked now)."""
        if self.state in ("ending", "ended"):
            raise SessionNotFound(f"the call {self.session_id!r} has ended")
        if self.conversation is None:
            raise NotAdjustable("tts.voice", "this call has no agent")
        return await self.conversation.adjust(origin, update)

    async def run(self) -> None:
        """The call's whole life: ``curb.started`` first, and once it is written, ``curb.ended`` last.

        A call whose ``curb.started`` could not be written never starts: nothing of it is
        recorded, and its start is refused.
        """
        bind_session(self.session_id)
        began = trio.current_time()
        metrics = current_metrics()
        # The call's span is current for the rest of its life: its tasks' spans are its children.
        span = start_span(
            "call",
            {
                "curb.session_id": self.session_id,
                "curb.transport": self._transport.name,
                "curb.direction": self.start.direction,
            },
        )
        entered = enter_span(span)
        try:
            await self.record.event("curb.started", self._started_payload())
        except (JournalWriteFailed, JournalClosed) as exc:
            self.not_recorded = exc
            self.state = "ended"
            self._start_outcome.set()
            self._stopped.set()
            if span is not None:
                span.set_attribute("curb.end_reason", "not_recorded")
                span.end()
            exit_span(entered)
            self._ended.set()
            return
        if metrics is not None:
            metrics.calls_started.labels(self._transport.name).inc()
        log.info(
            "call %s started (transport %s, %s)",
            self.session_id,
            self._transport.name,
            self.start.direction,
        )
        reason = "ended"
        try:
            if self._conversation_factory is not None:
                try:
                    self.conversation = self._conversation_factory(self.context, self.record)
                except Exception as exc:
                    log.exception("the agent of call %s did not start", self.session_id)
                    self._start_error = f"the agent did not start: {type(exc).__name__}: {exc}"
                    reason = f"start_failed: {self._start_error}"
                    return
            reason = await self._run_connected()
        except Exception as exc:
            log.exception("call %s failed", self.session_id)
            reason = f"failed: {type(exc).__name__}"
            raise
        finally:
            self.state = "ended"
            self.end_reason = reason
            self._start_outcome.set()
            self._stopped.set()
            try:
                await self._write_ended(reason)
            finally:
                log.info(
                    "call %s ended (transport %s, reason %s) after %.1f s",
                    self.session_id,
                    self._transport.name,
                    reason,
                    trio.current_time() - began,
                )
                if metrics is not None:
                    metrics.call_ended(reason)
                if span is not None:
                    span.set_attribute("curb.end_reason", reason)
                    span.end()
                exit_span(entered)
                self._ended.set()

    async def _write_ended(self, reason: str) -> None:
        """Write ``curb.messages`` and ``curb.ended``; while the journal cannot write, retry until it can.

        The first attempt is shielded. The retries are not: a shutdown that cannot wait
        cancels them, and the next start closes the record (``runner_crashed``).
        """
        delay = 0.05
        while True:
            with trio.CancelScope(shield=True):
                try:
                    await self.record.end(reason, self._messages)
                    self.record_error = None
                    return
                except JournalClosed:
                    return
                except JournalWriteFailed as exc:
                    self.record_error = str(exc)
            await trio.sleep(delay)
            delay = min(delay * 2, 1.0)

    def _started_payload(self) -> dict[str, Any]:
        start = self.start
        payload: dict[str, Any] = {
            "clientContext": dict(start.client_context or {}),
            "direction": start.direction,
            "experiments": dict(self.context.experiments),
            "transport": self._transport.name,
        }
        if start.deployment_id is not None:
            payload["deploymentId"] = start.deployment_id
        if start.configuration_version is not None:
            payload["configurationVersion"] = start.configuration_version
        if self.origin is not None:
            payload["job"] = dict(self.origin)
        return payload

    async def _run_connected(self) -> str:
        target = CallTarget(
            session_id=self.session_id, url=self.start.realtime_url, token=self.start.realtime_token
        )
        # The join has START_TIMEOUT_S; once connected the deadline is lifted, so the
        # transport's session is an ordinary `async with` that may own a nursery.
        with trio.CancelScope(deadline=trio.current_time() + START_TIMEOUT_S) as join_scope:
            try:
                async with self._transport.open_session(target) as session:
                    join_scope.deadline = math.inf
                    self.session = session
                    self.state = "connected"
                    self.connected.set()
                    self._start_outcome.set()
                    return await self._converse(session)
            except TransportError as exc:
                if self.state != "starting":
                    return f"disconnected: {exc}"
                self._start_error = str(exc) or "the transport refused the join"
                return f"start_failed: {self._start_error}"
        self._start_error = "the transport did not connect in time"
        return f"start_failed: {self._start_error}"

    async def _converse(self, session: TransportSession) -> str:
        # The call reads the transport's events: it ends itself when the room is
        # gone, and hands everything else to the conversation.
        send, receive = trio.open_memory_channel[TransportEvent](math.inf)
        async with trio.open_nursery() as nursery:
            if self.conversation is not None:
                nursery.start_soon(self.conversation.run, session, receive)
                nursery.start_soon(self._deliver_held, self.conversation)
            else:
                self._held_delivered.set()
            nursery.start_soon(self._pump_events, session, send)
            await self._stop_requested.wait()
            self.state = "ending"
            if self.conversation is not None:
                with trio.move_on_after(self._grace_ms / 1000):
                    await self.conversation.finish_utterance()
            nursery.cancel_scope.cancel()
        if self.conversation is not None:
            # Taken once every task of the call stopped, so it counts everything.
            self._messages = self.conversation.messages_summary()
        return self._stop_reason

    async def _pump_events(
        self, session: TransportSession, send: trio.MemorySendChannel[TransportEvent]
    ) -> None:
        async with send:
            async for event in session.events:
                if isinstance(event, Disconnected):
                    self.stop_nowait(f"disconnected: {event.reason}")
                    return
                if isinstance(event, ParticipantLeft) and event.kind in ("caller", "sip"):
                    self.stop_nowait("caller_left")
                send.send_nowait(event)
        self.stop_nowait("transport_closed")


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


async def close_open_calls(journal: Journal) -> list[str]:
    """End the record of every call a crash left open, so no conversation stays truncated."""
    open_calls = await journal.open_producers(exclude=["runner"])
    # One transaction for them all: one fsync, however many calls the crash left open.
    ended = _event_body("curb.ended", {"reason": END_REASON_CRASHED})
    await journal.append_many(
        [
            Entry(producer=session_id, cls="conversation", body=ended, stamp=True, closes=True)
            for session_id in open_calls
        ]
    )
    return open_calls
