"""A pool's failover (docs/failover.md): the calls of a runner that dies are placed again on
the others, with the conversation so far."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Literal

import anyio
import attrs
import httpx

from ..errors import (
    RunnerError,
)
from ..wire import (
    HISTORY_BYTES_MAX,
    HISTORY_TEXT_MAX,
    HISTORY_TURNS_MAX,
    HistoryTurn,
    ResumedCall,
    StartCallRequest,
    WireError,
)
from ._client import RunnerClient, RunnerUnreachable
from ._state import NoRunnerAvailable, PlacedCalls, Placement, RunnerState

log = logging.getLogger("runner.host")


@attrs.frozen(kw_only=True)
class CallMoved:
    """A call of a runner that died goes on elsewhere.

    Attributes:
        session_id: The call.
        from_runner: The runner that stopped answering.
        to_runner: The runner that took it, with ``resume``.
        turns: The conversation's turns that travelled with it.
        dropped_turns: The oldest turns left behind to keep the history within its bound.
    """

    session_id: str
    from_runner: str
    to_runner: str
    turns: int
    dropped_turns: int = 0


@attrs.frozen(kw_only=True)
class CallLost:
    """A call of a runner that died that no runner picked up.

    Attributes:
        session_id: The call.
        runner: The runner that stopped answering.
        reason: ``caller_gone`` (``rejoin`` gave no token), ``no_runner`` (every runner
            refused or was unreachable: ``error`` says why) or ``start_failed`` (the new
            runner could not join the room).
        error: What the last refusal said, if any.
    """

    session_id: str
    runner: str
    reason: Literal["caller_gone", "no_runner", "start_failed"]
    error: str | None = None


FailoverEvent = CallMoved | CallLost


@attrs.frozen(kw_only=True)
class Failover:
    """How a pool picks up the calls of a runner that dies (docs/failover.md).

    Attributes:
        rejoin: Given the call's start, a fresh realtime token for the same room (the same
            agent identity, so a runner that was only cut off is replaced, not doubled), or
            ``None`` when the caller has left and there is nothing to pick up.
        dead_after_s: How long a runner's ``/health`` may time out before its calls are
            moved (a runner whose port refuses is dead at once): long enough that a runner
            only slowed by load is not taken for dead.
        probe_interval_s: How often ``/health`` is asked while watching for a death.
        on_event: Told of each call moved or lost, once (may be async).
    """

    rejoin: Callable[[StartCallRequest], Awaitable[str | None]]
    dead_after_s: float = attrs.field(default=5.0, validator=attrs.validators.gt(0))
    probe_interval_s: float = attrs.field(default=0.25, validator=attrs.validators.gt(0))
    on_event: Callable[[FailoverEvent], Awaitable[None] | None] | None = None


ABSENT_PROBES = 2
"""``/health`` probes in a row refused (or closed unanswered) that make a runner dead at once."""


def _absent(exc: RunnerUnreachable) -> bool:
    """No runner answered and none is slow: the connection was refused, reset or closed
    without an answer, never a timeout."""
    cause = exc.__cause__
    return isinstance(cause, httpx.TransportError) and not isinstance(cause, httpx.TimeoutException)


def bounded(history: Sequence[HistoryTurn]) -> tuple[list[HistoryTurn], int]:
    """The newest turns that fit a ``resume``'s bounds, and how many older ones were left out."""
    kept: list[HistoryTurn] = []
    size = 0
    for turn in reversed(history):
        text = turn.text.encode()[:HISTORY_TEXT_MAX].decode(errors="ignore")
        size += len(text.encode())
        if len(kept) == HISTORY_TURNS_MAX or size > HISTORY_BYTES_MAX:
            break
        kept.append(HistoryTurn(role=turn.role, text=text))
    kept.reverse()
    return kept, len(history) - len(kept)


class CallMover:
    """Watches each runner's ``/health`` and moves the calls of one that died.

    Args:
        failover: How (see :class:`Failover`).
        clients: Each runner's client.
        states: What the pool believes about each runner (a dead one is marked down).
        calls: Where the pool's calls are.
        start_call: Places a call (the pool's own placement).
    """

    def __init__(
        self,
        failover: Failover,
        *,
        clients: Mapping[str, RunnerClient],
        states: Mapping[str, RunnerState],
        calls: PlacedCalls,
        start_call: Callable[[StartCallRequest], Awaitable[Placement]],
    ) -> None:
        self._failover = failover
        self._clients = clients
        self._states = states
        self._calls = calls
        self._start_call = start_call

    async def watch_health(self, url: str) -> None:
        """Ask ``/health`` often. A runner is dead once it has gone unanswered for
        ``dead_after_s``, or sooner when it is known absent: ``ABSENT_PROBES`` probes in a row
        refused or closed without an answer (no process listens there, or a proxy in front of
        it found none), where a slow runner only times out. Then its calls move. When it
        answers again, any moved call it still holds is stopped there."""
        client = self._clients[url]
        last_answer = anyio.current_time()
        absent = 0
        dead = False
        while True:
            answered = False
            with anyio.move_on_after(max(self._failover.probe_interval_s, self._failover.dead_after_s / 2)):
                try:
                    await client.health()
                    answered = True
                except RunnerUnreachable as exc:
                    absent = absent + 1 if _absent(exc) else 0
                except (RunnerError, WireError):
                    absent = 0
            now = anyio.current_time()
            if answered:
                last_answer, absent = now, 0
                if dead:
                    dead = False
                    await self._stop_moved_on(url)
            elif not dead and (now - last_answer >= self._failover.dead_after_s or absent >= ABSENT_PROBES):
                dead = True
                self._states[url].up = False
                await self.move_calls_of(url)
            await anyio.sleep(self._failover.probe_interval_s)

    async def move_calls_of(self, url: str, sessions: Sequence[str] | None = None) -> None:
        """Move the calls held on ``url`` (or ``sessions`` of them) to the other runners."""
        sessions = self._calls.held_on(url) if sessions is None else sessions
        if sessions:
            log.warning("runner %s: lost; moving its %d call(s)", url, len(sessions))
        async with anyio.create_task_group() as tasks:
            for session_id in sessions:
                tasks.start_soon(self._move_call, url, session_id)

    async def _move_call(self, url: str, session_id: str) -> None:
        # Taken from the maps before the first await: a second notice of the same death
        # (its /health silent, its restart's ``ready``) finds nothing left to move.
        if self._calls.holders.get(session_id, url) != url or session_id not in self._calls.held:
            return
        self._calls.holders.pop(session_id, None)
        held = self._calls.held.pop(session_id)
        token = await self._failover.rejoin(held.request)
        if token is None:
            await self._tell(CallLost(session_id=session_id, runner=url, reason="caller_gone"))
            return
        history, dropped = bounded(list(held.history))
        request = attrs.evolve(
            held.request, realtime_token=token, resume=ResumedCall(history=history, reason="runner_lost")
        )
        try:
            placed = await self._start_elsewhere(request, avoid=url)
        except (NoRunnerAvailable, RunnerError, RunnerUnreachable) as exc:
            reason: Literal["no_runner", "start_failed"] = (
                "start_failed" if isinstance(exc, RunnerError) else "no_runner"
            )
            await self._tell(CallLost(session_id=session_id, runner=url, reason=reason, error=str(exc)))
            return
        self._calls.moved[session_id] = (url, placed.runner)
        log.warning(
            "call %s: moved from %s to %s with %d turns", session_id, url, placed.runner, len(history)
        )
        await self._tell(
            CallMoved(
                session_id=session_id,
                from_runner=url,
                to_runner=placed.runner,
                turns=len(history),
                dropped_turns=dropped,
            ),
        )

    async def _start_elsewhere(self, request: StartCallRequest, *, avoid: str) -> Placement:
        """Place a moved call anywhere but the runner it left, even if that one answers again."""
        state = self._states[avoid]
        incompatible, state.incompatible = state.incompatible, True  # out of _order for this start
        try:
            return await self._start_call(request)
        finally:
            state.incompatible = incompatible

    async def _stop_moved_on(self, url: str) -> None:
        """A runner thought dead answers again: any call it still holds that moved is stopped
        there, so the room never keeps two agents."""
        moved = {s for s, (old, _) in self._calls.moved.items() if old == url}
        if not moved:
            return
        try:
            status = await self._clients[url].status()
        except (RunnerError, RunnerUnreachable, WireError):
            return
        for call in status.sessions:
            if call.session_id in moved:
                try:
                    await self._clients[url].stop_call(call.session_id, reason="moved")
                except (RunnerError, RunnerUnreachable, WireError) as exc:
                    log.warning("runner %s: could not stop moved call %s: %s", url, call.session_id, exc)

    async def _tell(self, event: FailoverEvent) -> None:
        if self._failover.on_event is None:
            return
        told = self._failover.on_event(event)
        if inspect.isawaitable(told):
            await told
