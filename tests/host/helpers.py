"""What the host-client tests share: real runner processes on fixed loopback ports."""

from __future__ import annotations

import socket
from collections.abc import Callable, Sequence
from typing import Any

import trio

from runner.host import EventFollower, FollowItem, JournalRecord, StartCallRequest

from ..runner_process import TOKEN, RunnerProcess, read_stream, records

__all__ = ["TOKEN", "Collector", "collect", "free_port", "journal_lines", "start", "url_of"]


def free_port() -> int:
    """A loopback port free now, so a restarted runner can listen where its hosts look."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def url_of(runner: RunnerProcess) -> str:
    return runner.base_url


def start(session_id: str, url: str = "loopback:", **fields: Any) -> StartCallRequest:
    return StartCallRequest(session_id=session_id, realtime_url=url, realtime_token="t", **fields)


async def collect(
    follower: EventFollower, into: list[FollowItem], until: Callable[[list[FollowItem]], bool]
) -> list[FollowItem]:
    """Iterate ``follower`` into ``into`` until ``until(into)`` holds (30 s at most)."""
    with trio.fail_after(30):
        if until(into):
            return into
        async for item in follower:
            into.append(item)
            if until(into):
                return into
    raise AssertionError("the follower ended")


class Collector:
    """A follower read by a task of its own, into ``items``, that a test waits on."""

    def __init__(self) -> None:
        self.items: list[FollowItem] = []
        self._changed = trio.Event()

    async def pump(self, follower: EventFollower) -> None:
        async for item in follower:
            self.items.append(item)
            self._changed.set()
            self._changed = trio.Event()

    async def wait_for(self, check: Callable[[list[FollowItem]], bool]) -> None:
        with trio.fail_after(30):
            while not check(self.items):
                await self._changed.wait()


def ended(items: Sequence[FollowItem], producer: str) -> bool:
    return any(
        isinstance(i, JournalRecord) and i.producer == producer and i.body.get("name") == "curb.ended"
        for i in items
    )


async def journal_lines(
    runner: RunnerProcess, until: Callable[[list[dict[str, Any]]], bool]
) -> list[dict[str, Any]]:
    """Every record the runner still holds, read raw from ``?from=0``."""
    return records(await read_stream(runner, "from=0", until=lambda lines: until(records(lines))))
