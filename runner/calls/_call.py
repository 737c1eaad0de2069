"""One call: a Trio nursery that owns its transport session, its agent's conversation and
its stop timer, and holds the host messages sent while it starts.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, Protocol

import attrs
import trio

from journal import JournalClosed, JournalWriteFailed, now_ms

from ..errors import (
    JournalUnwritable,
    NoHandler,
    NotAdjustable,
    RunnerAtCapacity,
    RunnerDraining,
    RunnerError,
    SessionNotFound,
)
from ..logs import bind_session, redact_userinfo
from ..sessions import (
    CallTarget,
    Disconnected,
    ParticipantLeft,
    Transport,
    TransportError,
    TransportEvent,
    TransportSession,
)
from ..telemetry import current_metrics, enter_span, exit_span, start_span
from ..wire import (
    Direction,
    EffectiveSettings,
    HostMessage,
    LiveCall,
    ResumedCall,
    StartCallRequest,
    State,
    json_bytes,
)
from ._record import CallRecord, host_message_event
from ._status import StatusParts

log = logging.getLogger("runner.calls")
# curb.messages of a call whose agent never ran (it did not connect), for the held messages it kept.
_NO_MESSAGES_SUMMARY: Mapping[str, Any] = {"undeliveredToClient": {}, "refusedQueuedHostMessages": 0}
START_TIMEOUT_S = 15.0
MAX_HELD_MESSAGES = 32


@attrs.frozen(kw_only=True)
class CallContext:
    """What the call was started with, as the agent reads it before its session starts."""

    session_id: str
    direction: Direction
    client: Mapping[str, str]
    experiments: Mapping[str, str]
    deployment_id: str | None = None
    configuration_version: int | None = None
    resume: ResumedCall | None = None


@attrs.define(eq=False)
class _Held:
    """A host message taken while its call starts: journaled (``held``) before its 202."""

    message: HostMessage
    recorded: trio.Event = attrs.Factory(trio.Event)
    ok: bool = False  # its held record was written


class HostMessages(Protocol):
    """Where a call's host messages go, and what it could not deliver."""

    refused_queued_host_messages: int

    async def deliver_host(self, message: HostMessage) -> None:
        """Deliver a host message (raises a refusal: no_handler, invalid_payload, handler_failed)."""
        ...

    def summary(self) -> dict[str, Any]:
        """The ``curb.messages`` payload, written once the conversation stopped."""
        ...


class Conversation(Protocol):
    """The agent's side of one call, run by the call once its transport is connected."""

    @property
    def messages(self) -> HostMessages:
        """The call's messages (host messages in, what could not be delivered)."""
        ...

    async def run(self, session: TransportSession, events: trio.MemoryReceiveChannel[TransportEvent]) -> None:
        """Converse over ``session``, taking the caller's ``events``, until cancelled."""
        ...

    async def finish_utterance(self) -> None:
        """Take no new turns; return once the agent stopped speaking."""
        ...

    async def adjust(self, origin: Literal["client", "host"], update: object) -> EffectiveSettings:
        """Apply a live settings change (raises not_adjustable, invalid_settings)."""
        ...


ConversationFactory = Callable[[CallContext, CallRecord], Conversation]


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
        self._held: list[_Held] = []
        self._held_delivered = trio.Event()
        # Set once curb.started was written (or refused): a held record never comes before it.
        self._start_recorded = trio.Event()

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
            if self._conversation_factory is None:
                raise NoHandler("this call has no agent to take messages")
            if len(self._held) >= MAX_HELD_MESSAGES:
                raise RunnerAtCapacity(
                    f"{MAX_HELD_MESSAGES} messages are already held for this starting call; retry once it is connected"
                )
            await self._hold(message)
            return True
        if self.conversation is None:
            raise NoHandler("this call has no agent to take messages")
        self._taken_ids.add(message.id)
        try:
            await self.conversation.messages.deliver_host(message)
        except BaseException:
            self._taken_ids.discard(message.id)
            raise
        return True

    async def _hold(self, message: HostMessage) -> None:
        """Take a message for a starting call: its ``held`` record is written before the 202.

        Its place (order, capacity, id) is taken at once; a write the journal refuses gives it
        back, and the message is refused as anything the journal cannot record.

        Raises:
            JournalUnwritable: The journal cannot write; the message was not taken.
            RunnerDraining: The runner is shutting down.
        """
        held = _Held(message)
        self._taken_ids.add(message.id)
        self._held.append(held)
        try:
            # Shielded (both waits are short: a commit or its refusal): a host that hangs up
            # does not leave a message taken but unrecorded, or recorded but not taken.
            with trio.CancelScope(shield=True):
                await self._start_recorded.wait()
                if self.not_recorded is not None:
                    raise self.not_recorded
                await self.record.event("curb.message", host_message_event(message, "held"))
            held.ok = True
        except (JournalWriteFailed, JournalClosed) as exc:
            self._taken_ids.discard(message.id)
            if held in self._held:
                self._held.remove(held)
            if isinstance(exc, JournalClosed):
                raise RunnerDraining("this runner is shutting down") from None
            raise JournalUnwritable(
                f"the message was not taken: the journal cannot write ({exc}); retry it"
            ) from None
        finally:
            held.recorded.set()

    async def _deliver_held(self, conversation: Conversation) -> None:
        try:
            await self._deliver_held_in_order(conversation)
        finally:
            self._held_delivered.set()

    async def _deliver_held_in_order(self, conversation: Conversation) -> None:
        while self._held:
            # A stop ends delivery between two messages; the rest are recorded undelivered.
            await trio.lowlevel.checkpoint()
            held = self._held[0]
            await held.recorded.wait()
            if held.ok:
                message = held.message
                try:
                    await conversation.messages.deliver_host(message)
                except RunnerError as refusal:
                    # It was already answered 202: all that is left is to say so and count it.
                    log.warning(
                        "held message %s (%r) refused on delivery: %s", message.id, message.name, refusal.code
                    )
                    conversation.messages.refused_queued_host_messages += 1
            if self._held and self._held[0] is held:
                self._held.pop(0)

    async def _undelivered_held(self, reason: str) -> list[dict[str, Any]]:
        """The ``curb.message`` of each held message the call ended without delivering.

        Waits for held records still being written (so each comes before its outcome); a
        message whose delivery was cut after its outcome record was handed to the journal
        already has one.
        """
        left, self._held = self._held, []
        undelivered = []
        for held in left:
            await held.recorded.wait()
            if held.ok and held.message.id not in self.record.host_outcomes:
                undelivered.append(host_message_event(held.message, "undelivered", reason=reason))
        return undelivered

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
            self._start_recorded.set()
            self.state = "ended"
            self._start_outcome.set()
            self._stopped.set()
            if span is not None:
                span.set_attribute("curb.end_reason", "not_recorded")
                span.end()
            exit_span(entered)
            self._ended.set()
            return
        self._start_recorded.set()
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
            # A transport's reason may quote the realtime URL, password and all.
            reason = redact_userinfo(reason)
            self.end_reason = reason
            self._start_outcome.set()
            self._stopped.set()
            try:
                with trio.CancelScope(shield=True):  # each held record is written or refused soon
                    undelivered = await self._undelivered_held(reason)
                if self._messages is not None:
                    self._messages["undeliveredQueuedHostMessages"] = len(undelivered)
                elif undelivered:
                    # Its agent never ran (the call did not connect): the summary counts them still.
                    base = (
                        self.conversation.messages.summary()
                        if self.conversation is not None
                        else dict(_NO_MESSAGES_SUMMARY)
                    )
                    self._messages = {**base, "undeliveredQueuedHostMessages": len(undelivered)}
                if undelivered and metrics is not None:
                    metrics.host_messages.labels("undelivered").inc(len(undelivered))
                await self._write_ended(reason, undelivered)
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

    async def _write_ended(self, reason: str, undelivered: Sequence[Mapping[str, Any]] = ()) -> None:
        """Write ``curb.messages`` and ``curb.ended``; while the journal cannot write, retry until it can.

        The first attempt is shielded. The retries are not: a shutdown that cannot wait
        cancels them, and the next start closes the record (``runner_crashed``).
        """
        delay = 0.05
        while True:
            with trio.CancelScope(shield=True):
                try:
                    await self.record.end(reason, self._messages, undelivered)
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
        if start.resume is not None:
            payload["resumed"] = {"reason": start.resume.reason, "turns": len(start.resume.history)}
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
                self._start_error = redact_userinfo(str(exc)) or "the transport refused the join"
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
                if self._stop_requested.is_set():
                    # Stopped before it connected: its held messages are recorded undelivered.
                    self._held_delivered.set()
                else:
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
            self._messages = self.conversation.messages.summary()
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
