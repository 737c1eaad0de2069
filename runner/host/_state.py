"""What a pool knows: each runner's state, where each call is, and where a call landed."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping

import attrs

from ..wire import (
    HistoryTurn,
    StartCallRequest,
    StartCallResponse,
)


@attrs.define(kw_only=True)
class RunnerState:
    """What the pool believes about one runner, from its answers, ``/health``, ``/v1/runner``
    and its events stream's lifecycle records.

    Attributes:
        url: The runner's base URL.
        up: Whether it answered last time (None: not asked yet).
        draining: It said ``runner_draining`` or wrote a ``draining`` record; it takes no calls
            until it restarts (a ``ready`` record).
        incompatible: It speaks another protocol version, or takes no calls at all.
        full: It answered ``runner_at_capacity`` since its capacity was last seen free.
        max_sessions: From its last status.
        active_sessions: From its last status, plus the calls placed and ended since.
    """

    url: str
    up: bool | None = None
    draining: bool = False
    incompatible: bool = False
    full: bool = False
    max_sessions: int | None = None
    active_sessions: int | None = None
    # What the pool learned here (a placement, a refusal, a lifecycle record, a call ended)
    # since a status was asked for: that status is older, so it must not overwrite it.
    changes: int = attrs.field(default=0, repr=False)

    @property
    def free(self) -> int | None:
        """Calls it can still take, as far as the pool knows (None: unknown)."""
        if self.full:
            return 0
        if self.max_sessions is None or self.active_sessions is None:
            return None
        return max(0, self.max_sessions - self.active_sessions)

    @property
    def placeable(self) -> bool:
        return not self.draining and not self.incompatible


@attrs.frozen(kw_only=True)
class Placement:
    """Where a call landed. ``response.accepted`` is false when it was already there."""

    runner: str
    response: StartCallResponse


class NoRunnerAvailable(Exception):
    """Every runner refused the call, or could not be reached.

    Attributes:
        refusals: Each runner asked, and what it answered (a ``RunnerError`` or
            ``RunnerUnreachable``). Runners the pool skipped (draining, incompatible) are absent.
    """

    def __init__(self, session_id: str, refusals: Mapping[str, Exception]) -> None:
        reasons = ", ".join(f"{url}: {getattr(e, 'code', type(e).__name__)}" for url, e in refusals.items())
        super().__init__(f"no runner took {session_id!r} ({reasons or 'none could be asked'})")
        self.refusals = dict(refusals)


@attrs.define
class HeldCall:
    """What the pool keeps of a call it placed, to place it again if its runner dies."""

    request: StartCallRequest
    history: deque[HistoryTurn] = attrs.field(factory=deque)


class PlacedCalls:
    """Where a pool's calls are: the runner holding each, the calls kept to place again if
    their runner dies, and the calls that moved away from a runner."""

    def __init__(self) -> None:
        self.holders: dict[str, str] = {}
        """The runner holding each call the pool placed or found."""
        self.held: dict[str, HeldCall] = {}
        """The calls kept to place again (only with failover)."""
        self.moved: dict[str, tuple[str, str]] = {}
        """A call that moved away from a runner: (its old runner, its new one)."""

    def forget(self, session_id: str, url: str) -> None:
        """``session_id`` is no longer on ``url`` (it ended, or the runner says it has none)."""
        if self.holders.get(session_id) == url:
            del self.holders[session_id]
            self.held.pop(session_id, None)

    def held_on(self, url: str) -> list[str]:
        """The calls kept to place again whose runner is ``url``."""
        return [s for s, holder in self.holders.items() if holder == url and s in self.held]
