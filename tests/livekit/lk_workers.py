"""``runner start`` workers as the worker tests and the failover benchmark watch them.

A worker's events stream followed from the start (:class:`Follower`), the calls it started,
its ``curb.failover`` records, and what the room itself says: its metadata's record of the call
and the agents in it.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import trio
from lk_harness import Peer
from lk_runner import Host


def failover_worker(agent_name: str, port: int) -> tuple[str, ...]:
    """``runner start`` arguments of a worker whose management listener takes the server's webhooks."""
    return ("--agent-name", agent_name, "--address", f"127.0.0.1:{port}")


def started(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every ``curb.started`` payload among ``records``, with its producer."""
    return [
        {"session": r["producer"], **r["body"]["payload"]}
        for r in records
        if r["body"].get("type") == "event" and r["body"].get("name") == "curb.started"
    ]


def failover_records(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every ``curb.failover`` payload among ``records``, with the lost job it is about."""
    return [
        {"job": r["producer"], **r["body"]["payload"]}
        for r in records
        if r["body"].get("type") == "event" and r["body"].get("name") == "curb.failover"
    ]


async def room_record(control: Peer, room: str) -> dict[str, Any]:
    """The room's metadata as a JSON object (empty when it has none)."""
    metadata = (await control.request("room_metadata", room=room))["metadata"]
    parsed: dict[str, Any] = json.loads(metadata) if metadata else {}
    return parsed


async def agents_in(control: Peer, room: str) -> list[str]:
    """The identities of the room's agents, as the server lists them."""
    listed = (await control.request("list_participants", room=room))["participants"]
    return [p["identity"] for p in listed if p["kind"] == "AGENT"]


class Follower:
    """One worker's events stream, read from the start for as long as the test runs."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self.records: list[dict[str, Any]] = []
        self._changed = trio.Event()

    @property
    def rooms(self) -> dict[str, str]:
        """Job id -> room, of every call this worker started."""
        return {call["session"]: call["job"]["room"] for call in started(self.records)}

    async def _read(self) -> None:
        async with self.host.open_events() as events:
            assert events.status == 200, events.body
            while True:
                try:
                    lines = await events.lines(count=1)
                except trio.BrokenResourceError:
                    return  # the worker was killed: its connection was reset
                if not lines:
                    return
                self.records.extend(line for line in lines if "body" in line)
                self._changed.set()
                self._changed = trio.Event()


@asynccontextmanager
async def follow(*hosts: Host) -> AsyncIterator[list[Follower]]:
    followers = [Follower(host) for host in hosts]
    async with trio.open_nursery() as nursery:
        for follower in followers:
            nursery.start_soon(follower._read)
        yield followers
        nursery.cancel_scope.cancel()


async def wait_for(followers: list[Follower], holds: Callable[[], bool], *, within: float = 30) -> None:
    """Until ``holds()``, checked each time one of ``followers`` reads a record."""
    with trio.move_on_after(within):
        while not holds():
            async with trio.open_nursery() as nursery:
                for follower in followers:

                    async def changed(f: Follower = follower) -> None:
                        await f._changed.wait()
                        nursery.cancel_scope.cancel()

                    nursery.start_soon(changed)
        return
    raise AssertionError(f"not within {within} s: {[f.rooms for f in followers]}")
