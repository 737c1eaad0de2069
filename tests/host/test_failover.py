"""RunnerPool with failover: a runner that dies mid-call, its calls picked up by another.

Real runner processes on loopback (the loopback transport: the room is the runner's own, so
these show the pool's side; tests/livekit/test_failover.py shows a caller in a real room).
"""

from __future__ import annotations

import signal
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
import trio

from runner.host import (
    CallLost,
    CallMoved,
    Failover,
    FailoverEvent,
    JournalRecord,
    RunnerPool,
    StartCallRequest,
)

from ..runner_process import read_stream, records, start_runner
from .helpers import TOKEN, free_port, start

pytestmark = pytest.mark.slow

AGENT = "tests.agents:resumer"


class Host:
    """The host's side of failover: fresh tokens for rooms whose caller is still there."""

    def __init__(self, callers_gone: set[str] | None = None) -> None:
        self.callers_gone = callers_gone or set()
        self.events: list[FailoverEvent] = []
        self.told = trio.Event()

    async def rejoin(self, request: StartCallRequest) -> str | None:
        return None if request.session_id in self.callers_gone else f"fresh-{request.session_id}"

    def on_event(self, event: FailoverEvent) -> None:
        self.events.append(event)
        self.told.set()

    def failover(self, dead_after_s: float = 1.0) -> Failover:
        return Failover(
            rejoin=self.rejoin, dead_after_s=dead_after_s, probe_interval_s=0.1, on_event=self.on_event
        )

    async def wait(self, count: int) -> list[FailoverEvent]:
        with trio.fail_after(30):
            while len(self.events) < count:
                self.told = trio.Event()
                await self.told.wait()
        return self.events


def _said(session_id: str) -> object:
    return lambda lines: any(
        r["producer"] == session_id and r["body"].get("role") == "assistant" for r in records(lines)
    )


async def test_a_killed_runners_call_goes_on_elsewhere_with_its_conversation(tmp_path: Path) -> None:
    host = Host()
    port = free_port()
    async with AsyncExitStack() as stack:
        first = await stack.enter_async_context(
            start_runner(tmp_path / "first.db", "--address", f"127.0.0.1:{port}", agent=AGENT)
        )
        second = await stack.enter_async_context(start_runner(tmp_path / "second.db", agent=AGENT))
        pool = await stack.enter_async_context(
            # No silence is waited out: a killed runner's port refuses at once, and that is enough.
            RunnerPool([first.base_url, second.base_url], token=TOKEN, failover=host.failover(3600))
        )
        placed = await pool.start_call(start("c1"))
        assert placed.runner == first.base_url
        await read_stream(first, "from=0", until=_said("c1"))
        await trio.sleep(0.5)  # the pool's own follower reads the greeting too

        first.kill()
        assert await first.wait_exit() == -signal.SIGKILL
        (moved,) = await host.wait(1)
        assert moved == CallMoved(
            session_id="c1", from_runner=first.base_url, to_runner=second.base_url, turns=1
        )
        assert pool.runner_for("c1") == second.base_url
        lines = await read_stream(second, "from=0", until=_said("c1"))
        started = next(
            r["body"]["payload"] for r in records(lines) if r["body"].get("name") == "curb.started"
        )
        assert started["resumed"] == {"reason": "runner_lost", "turns": 1}
        said = [r["body"]["text"] for r in records(lines) if r["body"].get("role") == "assistant"]
        assert said == ["Sorry, the line dropped."]

        # The dead runner comes back and closes what it held: for the pool, old news.
        restarted = await stack.enter_async_context(
            start_runner(tmp_path / "first.db", "--address", f"127.0.0.1:{port}", agent=AGENT)
        )
        lines = await read_stream(
            restarted,
            "from=0",
            until=lambda ls: any(r["body"].get("name") == "curb.ended" for r in records(ls)),
        )
        crashed = next(r for r in records(lines) if r["body"].get("name") == "curb.ended")
        assert crashed["body"]["payload"]["reason"] == "runner_crashed"
        record = JournalRecord(
            envelope=crashed["envelope"], producer="c1", seq=crashed["seq"], cls="conversation", at=0, body={}
        )
        assert pool.superseded(restarted.base_url, record)
        assert not pool.superseded(second.base_url, record)
        await trio.sleep(0.5)
        assert pool.runner_for("c1") == second.base_url
        assert host.events == [moved]  # told once


async def test_a_call_whose_caller_left_or_that_no_runner_takes_is_lost_with_its_reason(
    tmp_path: Path,
) -> None:
    host = Host(callers_gone={"gone"})
    async with (
        start_runner(tmp_path / "only.db", "--max-sessions", "2", agent=AGENT) as only,
        RunnerPool([only.base_url], token=TOKEN, failover=host.failover(3600)) as pool,
    ):
        await pool.start_call(start("gone"))
        await pool.start_call(start("stays"))
        only.kill()
        events = await host.wait(2)
    lost = {e.session_id: e for e in events}
    assert isinstance(lost["gone"], CallLost) and lost["gone"].reason == "caller_gone"
    assert isinstance(lost["stays"], CallLost) and lost["stays"].reason == "no_runner"
    assert lost["stays"].runner == only.base_url


async def test_a_runner_that_was_only_cut_off_gives_the_moved_call_up(tmp_path: Path) -> None:
    host = Host()
    async with AsyncExitStack() as stack:
        frozen = await stack.enter_async_context(start_runner(tmp_path / "frozen.db", agent=AGENT))
        other = await stack.enter_async_context(start_runner(tmp_path / "other.db", agent=AGENT))
        pool = await stack.enter_async_context(
            RunnerPool([frozen.base_url, other.base_url], token=TOKEN, failover=host.failover())
        )
        await pool.start_call(start("c2"))
        frozen.signal(signal.SIGSTOP)  # it stops answering, but its process and call live on
        try:
            (moved,) = await host.wait(1)
        finally:
            frozen.signal(signal.SIGCONT)
        assert isinstance(moved, CallMoved) and moved.to_runner == other.base_url
        # Once it answers again, the pool stops its copy: the room keeps one agent.
        lines = await read_stream(
            frozen, "from=0", until=lambda ls: any(r["body"].get("name") == "curb.ended" for r in records(ls))
        )
        ended = next(r["body"]["payload"] for r in records(lines) if r["body"].get("name") == "curb.ended")
        assert ended["reason"] == "moved"
        async with other.client() as client:
            assert [s["sessionId"] for s in (await client.get("/v1/runner")).json()["sessions"]] == ["c2"]
