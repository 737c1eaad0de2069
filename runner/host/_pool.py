"""Placing calls across many runners, and sending each call's requests to the runner that holds it."""

from __future__ import annotations

import logging
import random
from collections import deque
from collections.abc import Mapping, Sequence
from types import TracebackType

import anyio
import httpx

from ..errors import (
    GenerationMismatch,
    RunnerAtCapacity,
    RunnerDraining,
    RunnerError,
    RunnerTakesNoCalls,
    SessionNotFound,
    UnknownVersion,
)
from ..wire import (
    HistoryTurn,
    HostMessage,
    HostMessageAccepted,
    JournalRecord,
    LiveCall,
    SessionSettingsResponse,
    SessionUpdate,
    StartCallRequest,
    StartCallResponse,
    StopCallResponse,
    WireError,
)
from ._client import DEFAULT_TIMEOUT, RunnerClient, RunnerUnreachable
from ._failover import CallMover, Failover
from ._state import HeldCall, NoRunnerAvailable, PlacedCalls, Placement, RunnerState

log = logging.getLogger("runner.host")


class RunnerPool:
    """A set of runners: places calls where there is room and routes each call's requests.

    Use it with ``async with``: it watches every runner (its status every
    ``watch_interval_s`` and its events stream's lifecycle and call-ended records) until
    the block ends.

    Placement follows the protocol: ``runner_draining`` (503) and ``runner_at_capacity`` /
    ``generation_mismatch`` (409) move on to the next runner, as does any 404 (another
    protocol version) and a connection that was never made. When a start may have reached a
    runner but its answer was lost, the same start (same session id) is sent to that runner
    again, where a repeat answers ``accepted: false``; only a refused connection (the
    process is gone, and its calls with it) moves such a start on. ``start_failed`` is the
    call's own failure and is raised, not retried elsewhere.

    Args:
        urls: The runners' management addresses.
        token: One token for all, or each URL's token.
        timeout: httpx timeouts for each runner's client.
        watch_interval_s: How often to refresh each runner's status; None: never watch
            (the pool then learns only from the answers it gets).
        lost_answer_attempts: How often to resend a start whose answer was lost.
        failover: Pick up the calls of a runner that dies on the others (None: don't).
    """

    def __init__(
        self,
        urls: Sequence[str],
        *,
        token: str | Mapping[str, str],
        timeout: httpx.Timeout = DEFAULT_TIMEOUT,
        watch_interval_s: float | None = 5.0,
        lost_answer_attempts: int = 5,
        failover: Failover | None = None,
    ) -> None:
        if not urls:
            raise ValueError("a pool needs at least one runner")
        self._clients: dict[str, RunnerClient] = {}
        self._states: dict[str, RunnerState] = {}
        for raw in urls:
            url = raw.rstrip("/")
            secret = token if isinstance(token, str) else token[raw]
            self._clients[url] = RunnerClient(url, token=secret, timeout=timeout)
            self._states[url] = RunnerState(url=url)
        self._watch_interval_s = watch_interval_s
        self._lost_answer_attempts = lost_answer_attempts
        self._tasks: anyio.abc.TaskGroup | None = None
        self._calls = PlacedCalls()
        self._mover = (
            CallMover(
                failover,
                clients=self._clients,
                states=self._states,
                calls=self._calls,
                start_call=self.start_call,
            )
            if failover is not None
            else None
        )

    async def __aenter__(self) -> RunnerPool:
        if self._watch_interval_s is not None or self._mover is not None:
            self._tasks = anyio.create_task_group()
            await self._tasks.__aenter__()
            for url in self._clients:
                if self._watch_interval_s is not None:
                    self._tasks.start_soon(self._watch_status, url)
                self._tasks.start_soon(self._watch_events, url)
                if self._mover is not None:
                    self._tasks.start_soon(self._mover.watch_health, url)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            if self._tasks is not None:
                self._tasks.cancel_scope.cancel()
                await self._tasks.__aexit__(exc_type, exc, tb)
        finally:
            with anyio.CancelScope(shield=True):
                for client in self._clients.values():
                    await client.aclose()

    @property
    def runners(self) -> list[RunnerState]:
        """What the pool believes about each runner, in the order given."""
        return list(self._states.values())

    def client(self, url: str) -> RunnerClient:
        """The client of one runner of the pool (to follow its events, for example)."""
        return self._clients[url.rstrip("/")]

    def runner_for(self, session_id: str) -> str | None:
        """The runner the pool placed (or found) ``session_id`` on, if it knows one."""
        return self._calls.holders.get(session_id)

    def superseded(self, url: str, record: JournalRecord) -> bool:
        """Whether ``record`` of runner ``url`` belongs to a call that has since moved on.

        A runner that died and comes back closes the calls it held (``curb.ended``,
        ``runner_crashed``); for a call the pool moved, that record is not the call's end.
        """
        moved = self._calls.moved.get(record.producer)
        return moved is not None and moved[0] == url.rstrip("/")

    # -- Placement -----------------------------------------------------------------------------

    def _order(self) -> list[RunnerState]:
        def rank(state: RunnerState) -> tuple[int, int]:
            free = state.free
            if state.up is False:
                return (3, 0)
            if free is None:
                return (1, 0)
            return (0, -free) if free > 0 else (2, 0)

        # sorted is stable: among equals, the order the runners were given.
        return sorted((s for s in self._states.values() if s.placeable), key=rank)

    async def start_call(self, request: StartCallRequest) -> Placement:
        """Place a call on a runner with room; answers once it connected.

        Raises:
            NoRunnerAvailable: Every runner refused or could not be reached.
            RunnerUnreachable: A runner may have taken the call but never answered, even
                when asked again (``maybe_delivered``): placing it elsewhere could start it twice.
            StartFailed, InvalidRequest, Unauthorized: The call itself, or the pool's
                configuration, is at fault; another runner would answer the same.
        """
        refusals: dict[str, Exception] = {}
        for state in self._order():
            try:
                response = await self._start_on(state, request)
            except RunnerDraining as exc:
                state.draining = True
                refusals[state.url] = exc
            except RunnerAtCapacity as exc:
                state.full = True
                state.changes += 1
                refusals[state.url] = exc
            except GenerationMismatch as exc:
                refusals[state.url] = exc
            except (UnknownVersion, RunnerTakesNoCalls) as exc:
                state.incompatible = True
                refusals[state.url] = exc
            except RunnerUnreachable as exc:
                if exc.maybe_delivered:
                    raise  # the call may be there: placing it elsewhere could start it twice
                state.up = False
                refusals[state.url] = exc
            else:
                state.up = True
                self._calls.holders[request.session_id] = state.url
                if self._mover is not None and request.session_id not in self._calls.held:
                    history = request.resume.history if request.resume is not None else ()
                    self._calls.held[request.session_id] = HeldCall(request=request, history=deque(history))
                if response.accepted and state.active_sessions is not None:
                    state.active_sessions += 1
                state.changes += 1
                return Placement(runner=state.url, response=response)
        raise NoRunnerAvailable(request.session_id, refusals)

    async def _start_on(self, state: RunnerState, request: StartCallRequest) -> StartCallResponse:
        """One runner's answer to a start, resent while only its answer was lost.

        Raises:
            RunnerUnreachable: ``maybe_delivered`` false when the call is certainly not there.
        """
        client = self._clients[state.url]
        maybe_there = False
        backoff_s = 0.05
        for _ in range(self._lost_answer_attempts + 1):
            try:
                return await client.start_call(request)
            except RunnerUnreachable as exc:
                if not exc.maybe_delivered and (
                    not maybe_there or isinstance(exc.__cause__, httpx.ConnectError)
                ):
                    # Never sent, or refused after a lost answer: the process that may have
                    # taken the call is gone, and the call with it.
                    raise RunnerUnreachable(state.url, False, exc) from exc
                maybe_there = True
                await anyio.sleep(random.uniform(backoff_s / 2, backoff_s))
                backoff_s = min(2.0, backoff_s * 2)
        raise RunnerUnreachable(
            state.url, True, RuntimeError(f"no answer to {self._lost_answer_attempts + 1} starts")
        )

    # -- A placed call's requests ----------------------------------------------------------------

    async def _holder(self, session_id: str) -> str | None:
        """The runner holding ``session_id``: remembered, else found in the runners' statuses."""
        url = self._calls.holders.get(session_id)
        if url is not None:
            return url
        found: list[str] = []

        async def look(url: str) -> None:
            try:
                status = await self._clients[url].status()
            except (RunnerError, RunnerUnreachable, WireError):
                return  # an unreachable or refusing runner holds nothing we can reach
            if any(call.session_id == session_id for call in status.sessions):
                found.append(url)

        async with anyio.create_task_group() as tasks:
            for url in self._clients:
                tasks.start_soon(look, url)
        if found:
            self._calls.holders[session_id] = found[0]
            return found[0]
        return None

    async def _on_holder(self, session_id: str) -> tuple[str, RunnerClient]:
        url = await self._holder(session_id)
        if url is None:
            raise SessionNotFound(f"no runner of the pool holds {session_id!r}")
        return url, self._clients[url]

    async def get_call(self, session_id: str) -> LiveCall:
        """The call's state on the runner that holds it. Raises SessionNotFound."""
        url, client = await self._on_holder(session_id)
        try:
            return await client.get_call(session_id)
        except SessionNotFound:
            self._calls.forget(session_id, url)
            raise

    async def stop_call(
        self, session_id: str, *, reason: str | None = None, grace_ms: int = 0
    ) -> StopCallResponse:
        """Stop the call where it runs; ``stopped: false`` when no runner holds it."""
        url = await self._holder(session_id)
        if url is None:
            return StopCallResponse(session_id=session_id, stopped=False)
        response = await self._clients[url].stop_call(session_id, reason=reason, grace_ms=grace_ms)
        self._calls.forget(session_id, url)
        return response

    async def send_message(self, session_id: str, message: HostMessage) -> HostMessageAccepted:
        """Send a host message to the runner holding the call."""
        url, client = await self._on_holder(session_id)
        try:
            return await client.send_message(session_id, message)
        except SessionNotFound:
            self._calls.forget(session_id, url)
            raise

    async def update_settings(self, session_id: str, update: SessionUpdate) -> SessionSettingsResponse:
        """Change the call's live settings on the runner holding it."""
        url, client = await self._on_holder(session_id)
        try:
            return await client.update_settings(session_id, update)
        except SessionNotFound:
            self._calls.forget(session_id, url)
            raise

    # -- Watching --------------------------------------------------------------------------------

    async def refresh(self) -> None:
        """Ask every runner for ``/health`` and its status now."""
        async with anyio.create_task_group() as tasks:
            for url in self._clients:
                tasks.start_soon(self._refresh_one, url)

    async def _refresh_one(self, url: str) -> None:
        state, client = self._states[url], self._clients[url]
        changes = state.changes
        try:
            await client.health()
            status = await client.status()
        except RunnerUnreachable:
            state.up = False
            return
        except (UnknownVersion, RunnerTakesNoCalls):
            state.up, state.incompatible = True, True
            return
        except (RunnerError, WireError) as exc:
            log.warning("runner %s: status refused: %s", url, exc)
            return
        state.max_sessions = status.max_sessions  # a runner's setting: never stale
        if state.changes == changes:
            state.up, state.draining, state.full = True, status.draining, False
            state.active_sessions = status.active_sessions

    async def _watch_status(self, url: str) -> None:
        assert self._watch_interval_s is not None
        while True:
            await self._refresh_one(url)
            await anyio.sleep(self._watch_interval_s)

    async def _watch_events(self, url: str) -> None:
        client = self._clients[url]
        while True:
            try:
                async with client.follow_events(
                    on_cursor_too_old="resync", classes=("lifecycle", "conversation")
                ) as events:
                    async for item in events:
                        if isinstance(item, JournalRecord):
                            self._saw(url, item)
            except (RunnerError, WireError) as exc:
                log.warning("runner %s: events stream refused: %s", url, exc)
                await anyio.sleep(self._watch_interval_s or 5.0)

    def _saw(self, url: str, record: JournalRecord) -> None:
        state = self._states[url]
        if self.superseded(url, record):
            return  # the call lives on elsewhere: its old runner's last word on it is not news
        held = self._calls.held.get(record.producer)
        if (
            held is not None
            and record.body.get("type") == "turn"
            and self._calls.holders.get(record.producer) == url
        ):
            role, text = record.body.get("role"), record.body.get("text")
            if role in ("user", "assistant") and isinstance(text, str):
                held.history.append(HistoryTurn(role=role, text=text))
        if record.cls == "lifecycle":
            state.changes += 1
            event = record.body.get("event")
            if event == "draining":
                state.draining = True
            elif event == "ended":
                state.up = False
            elif event == "ready":
                state.up, state.draining, state.full = True, False, False
                state.active_sessions = 0
                # A restart: the calls it held died with the process before it.
                if self._mover is not None and self._tasks is not None and (lost := self._calls.held_on(url)):
                    self._tasks.start_soon(self._mover.move_calls_of, url, lost)
                for session_id in [s for s, holder in self._calls.holders.items() if holder == url]:
                    del self._calls.holders[session_id]
        elif record.body.get("name") == "curb.ended":
            payload = record.body.get("payload")
            crashed = isinstance(payload, dict) and payload.get("reason") == "runner_crashed"
            if (
                crashed
                and self._mover is not None
                and self._tasks is not None
                and record.producer in self._calls.held
            ):
                # Its runner restarted before its silence was long enough to notice.
                self._tasks.start_soon(self._mover.move_calls_of, url, [record.producer])
            else:
                self._calls.forget(record.producer, url)
            state.full = False
            state.changes += 1
            if state.active_sessions:
                state.active_sessions -= 1
