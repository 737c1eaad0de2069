"""The turns asked of an agent in a call (typed, heard, made by a key, the opening line), run
one at a time in the order they were asked for."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import Any

import trio

# How long the opening line waits for a ringing phone to be answered before it is said anyway.
ANSWER_WAIT_S = 10.0


class TurnQueue:
    """The turns asked for, run one at a time in the order they were asked for."""

    def __init__(self) -> None:
        self.queued = 0
        self.idle = trio.Event()
        self.idle.set()
        self._send, self._receive = trio.open_memory_channel[tuple[str | None, dict[str, Any]]](math.inf)

    def asked(self) -> None:
        """One more thing to wait for (a turn, or a key whose handlers may ask for one)."""
        self.queued += 1
        self.idle = trio.Event() if self.idle.is_set() else self.idle

    def done(self) -> None:
        self.queued -= 1
        if self.queued == 0:
            self.idle.set()

    def put(self, text: str | None, **options: Any) -> None:
        self.asked()
        self._send.send_nowait((text, options))

    async def serve(self, take_turn: Callable[..., Awaitable[Any]]) -> None:
        async for text, options in self._receive:
            try:
                await take_turn(text, **options)
            finally:
                self.done()

    async def put_once_answered(
        self, ringing: trio.Event, accepting: Callable[[], bool], options: dict[str, Any]
    ) -> None:
        """Queue the opening line (``take_turn(None, **options)``) once a ringing phone is
        answered (at the latest after ANSWER_WAIT_S), if the call is still ``accepting`` turns
        then: a phone that rings hears nothing."""
        with trio.move_on_after(ANSWER_WAIT_S):
            await ringing.wait()
        if accepting():
            self.put(None, **options)
