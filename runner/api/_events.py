"""The NDJSON events stream: committed journal records, resumable, with heartbeats."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import trio

from journal import CursorAhead, CursorTooOld, Journal, now_ms

from ..errors import CursorTooOld as CursorTooOldError
from ..errors import InvalidRequest
from ..telemetry import follow, unfollow

_BATCH = 4096

log = logging.getLogger("runner.events")


def parse_cursor(raw: str | None, head: int) -> int:
    """The exclusive cursor from ``?from=``: absent means "from now on"."""
    if raw is None:
        return head
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 19:
        raise InvalidRequest(f"from must be a non-negative integer, got {raw!r}")
    return int(raw)


async def check_cursor(journal: Journal, cursor: int) -> None:
    """410 for a cursor the window no longer covers, and for one this journal never reached.

    A cursor ahead of the head means the host kept it across a journal that was
    replaced: the records it names are not ours, so the host must resume from now
    and count what it missed, exactly the 410 contract.
    """
    try:
        await journal.check_cursor(cursor)
    except CursorTooOld as exc:
        raise CursorTooOldError(exc.requested, exc.oldest_retained, str(exc)) from None
    except CursorAhead as exc:
        window = await journal.window()
        oldest = window.oldest if window.oldest is not None else exc.head + 1
        raise CursorTooOldError(
            exc.requested,
            oldest,
            f"cursor {exc.requested} is ahead of this journal's head {exc.head}:"
            " the journal was replaced; reconnect without a cursor",
        ) from None


async def stream_lines(
    journal: Journal, cursor: int, *, heartbeat_ms: int, closing: trio.Event
) -> AsyncIterator[bytes]:
    """Yield NDJSON chunks: every committed record after ``cursor``, and pings when idle.

    Whatever is ready is sent as one chunk. The stream ends when the reader falls
    out of the retention window (its reconnect then gets 410) and, once ``closing``
    is set, after the last committed record went out.
    """
    start = cursor
    follower = follow(cursor)
    try:
        while True:
            if journal.head <= cursor:
                if closing.is_set():
                    return
                with trio.move_on_after(heartbeat_ms / 1000):
                    async with trio.open_nursery() as nursery:

                        async def stop_on_close() -> None:
                            await closing.wait()
                            nursery.cancel_scope.cancel()

                        nursery.start_soon(stop_on_close)
                        await journal.wait_past(cursor)
                        nursery.cancel_scope.cancel()
                if journal.head <= cursor:
                    if not closing.is_set():
                        yield b'{"ping":%d}\n' % now_ms()
                    continue
            try:
                rows = await journal.read_lines(cursor, _BATCH)
            except CursorTooOld:
                return
            if rows:
                cursor = rows[-1][0]
                if follower is not None:
                    follower.cursor = cursor
                yield "".join(line + "\n" for _, line in rows).encode()
    finally:
        unfollow(follower)
        # Under Hypercorn/Trio a stream learns its reader left only when a write
        # fails, so pings bound how long a dead stream lingers.
        log.debug("events stream from %d closed", start)
