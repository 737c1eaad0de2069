"""runner.host.RunnerPool: placement across real runner processes, each refusal, a kill mid-start."""

from __future__ import annotations

import signal
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from runner.host import (
    GenerationMismatch,
    HostMessage,
    JournalRecord,
    NoHandler,
    NoRunnerAvailable,
    Placement,
    RunnerAtCapacity,
    RunnerClient,
    RunnerDraining,
    RunnerPool,
    RunnerUnreachable,
)

from ..runner_process import RunnerProcess, read_stream, records, start_runner
from .helpers import TOKEN, collect, ended, start


def _started(session_id: str) -> Any:
    return lambda lines: any(
        r["producer"] == session_id and r["body"].get("name") == "curb.started" for r in records(lines)
    )


async def _sessions(runner: RunnerProcess) -> list[str]:
    async with RunnerClient(runner.base_url, token=TOKEN) as client:
        return [call.session_id for call in (await client.status()).sessions]


@pytest.mark.slow
async def test_a_call_lands_once_past_a_draining_a_full_a_mismatched_and_a_killed_runner(
    tmp_path: Path,
) -> None:
    async with AsyncExitStack() as stack:
        draining, full, other, killed, good = [
            await stack.enter_async_context(start_runner(tmp_path / f"{name}.db", *extra))
            for name, extra in [
                ("draining", ()),
                ("full", ()),
                ("other", ("--deployment-id", "blue")),
                ("killed", ()),
                ("good", ()),
            ]
        ]
        async with RunnerClient(draining.base_url, token=TOKEN) as client:
            await client.start_call(start("d1"))  # so that the drain keeps it up
            await client.drain()
        async with RunnerClient(full.base_url, token=TOKEN) as client:
            await client.start_call(start("f1"))

        urls = [r.base_url for r in (draining, full, other, killed, good)]
        # A slow join keeps the start in flight long enough to kill the runner under it.
        request = start("call-x", "loopback:?connect_ms=1500", deployment_id="green")
        placed: list[Placement] = []
        async with RunnerPool(urls, token=TOKEN, watch_interval_s=None) as pool:
            async with trio.open_nursery() as nursery:

                async def place() -> None:
                    placed.append(await pool.start_call(request))

                nursery.start_soon(place)
                await read_stream(killed, "from=0", until=_started("call-x"))
                killed.kill()
                assert await killed.wait_exit() == -signal.SIGKILL

            assert placed[0].runner == good.base_url
            assert (placed[0].response.accepted, placed[0].response.call.state) == (True, "connected")
            state = {s.url: s for s in pool.runners}
            assert state[draining.base_url].draining and state[full.base_url].full
            assert state[killed.base_url].up is False and state[good.base_url].up is True
            assert pool.runner_for("call-x") == good.base_url

            assert await _sessions(good) == ["call-x"]
            assert await _sessions(full) == ["f1"]
            assert await _sessions(draining) == ["d1"]
            assert await _sessions(other) == []

            # Requests for the call go where it runs (elsewhere it would be session_not_found).
            with pytest.raises(NoHandler):
                await pool.send_message("call-x", HostMessage(id="m-1", name="note", payload={}))
            assert (await pool.get_call("call-x")).state == "connected"
            assert (await pool.stop_call("call-x")).stopped is True
            assert pool.runner_for("call-x") is None
            assert await _sessions(good) == []
        await stack.aclose()

    # The start the kill interrupted never lived on: its restarted runner closed it.
    async with start_runner(tmp_path / "killed.db") as restarted:
        lines = await read_stream(
            restarted,
            "from=0",
            until=lambda ls: any(
                r["producer"] == "call-x" and r["body"].get("name") == "curb.ended" for r in records(ls)
            ),
        )
        assert await _sessions(restarted) == []
    call_x = [r["body"] for r in records(lines) if r["producer"] == "call-x"]
    assert [b["name"] for b in call_x] == ["curb.started", "curb.ended"]
    assert call_x[-1]["payload"]["reason"] == "runner_crashed"


@pytest.mark.slow
async def test_each_refusal_moves_the_call_on(tmp_path: Path) -> None:
    async with AsyncExitStack() as stack:
        draining, full, other, good = [
            await stack.enter_async_context(start_runner(tmp_path / f"{name}.db", *extra))
            for name, extra in [
                ("draining", ()),
                ("full", ()),
                ("other", ("--deployment-id", "blue")),
                ("good", ()),
            ]
        ]
        async with RunnerClient(draining.base_url, token=TOKEN) as client:
            await client.start_call(start("d1"))
            await client.drain()
        async with RunnerClient(full.base_url, token=TOKEN) as client:
            await client.start_call(start("f1"))
        urls = [r.base_url for r in (draining, full, other)]
        async with RunnerPool(urls, token=TOKEN, watch_interval_s=None) as pool:
            with pytest.raises(NoRunnerAvailable) as none:
                await pool.start_call(start("c1", deployment_id="green"))
        refusals = none.value.refusals
        assert isinstance(refusals[draining.base_url], RunnerDraining)
        assert isinstance(refusals[full.base_url], RunnerAtCapacity)
        assert isinstance(refusals[other.base_url], GenerationMismatch)

        async with RunnerPool([*urls, good.base_url], token=TOKEN, watch_interval_s=None) as pool:
            placed = await pool.start_call(start("c1", deployment_id="green"))
        assert placed.runner == good.base_url and placed.response.accepted


@pytest.mark.slow
async def test_a_start_whose_answer_was_lost_is_resent_and_lands_once(tmp_path: Path) -> None:
    async with start_runner(tmp_path / "j.db", "--max-sessions", "2") as runner:
        # Answers come after 1.5 s; the pool reads for 0.5 s, so it loses the first one.
        impatient = httpx.Timeout(5.0, read=0.5)
        async with RunnerPool(
            [runner.base_url], token=TOKEN, watch_interval_s=None, timeout=impatient
        ) as pool:
            placed = await pool.start_call(start("c1", "loopback:?connect_ms=1500"))
        assert placed.runner == runner.base_url
        assert (placed.response.accepted, placed.response.call.state) == (False, "starting")
        lines = await read_stream(runner, "from=0", until=_started("c1"))
        async with RunnerClient(runner.base_url, token=TOKEN) as client:
            status = await client.status()
        assert [c.session_id for c in status.sessions] == ["c1"]
        assert [r["body"]["name"] for r in records(lines) if r["producer"] == "c1"] == ["curb.started"]


@pytest.mark.slow
async def test_the_pool_watches_drains_and_ends_and_finds_calls_after_a_host_restart(tmp_path: Path) -> None:
    async with (
        start_runner(tmp_path / "a.db", "--max-sessions", "2") as a,
        start_runner(tmp_path / "b.db", "--max-sessions", "2") as b,
    ):
        async with RunnerPool([a.base_url, b.base_url], token=TOKEN, watch_interval_s=0.2) as pool:
            with trio.fail_after(10):
                while any(s.free != 2 for s in pool.runners):
                    await trio.sleep(0.05)
            first = await pool.start_call(start("a1"))
            assert first.runner == a.base_url
            # With a call on a, b has more room.
            assert (await pool.start_call(start("b1"))).runner == b.base_url
            async with RunnerClient(a.base_url, token=TOKEN) as client:
                await client.drain()
            with trio.fail_after(10):
                while not pool.runners[0].draining:
                    await trio.sleep(0.05)
            assert (await pool.start_call(start("b2"))).runner == b.base_url
            # a ends once its last call ended: the pool sees its ended record.
            async with pool.client(a.base_url).follow_events(from_=0) as events:
                assert (await pool.stop_call("a1")).stopped
                items = await collect(
                    events,
                    [],
                    lambda items: any(
                        isinstance(i, JournalRecord) and i.body.get("event") == "ended" for i in items
                    ),
                )
            assert ended(items, "a1")
            with trio.fail_after(10):
                while pool.runners[0].up is not False:
                    await trio.sleep(0.05)

        # A restarted host has no map: the pool finds the call in the runners' statuses.
        async with RunnerPool([a.base_url, b.base_url], token=TOKEN, watch_interval_s=None) as pool:
            assert pool.runner_for("b2") is None
            assert (await pool.get_call("b2")).state == "connected"
            assert pool.runner_for("b2") == b.base_url
            assert (await pool.stop_call("b1")).stopped
            assert (await pool.stop_call("nobody")).stopped is False


@pytest.mark.slow
async def test_a_runner_that_never_answers_is_not_passed_over(tmp_path: Path) -> None:
    async with (
        start_runner(tmp_path / "stopped.db") as stopped,
        start_runner(tmp_path / "other.db") as other,
    ):
        stopped.signal(signal.SIGSTOP)
        try:
            impatient = httpx.Timeout(2.0, read=0.3)
            async with RunnerPool(
                [stopped.base_url, other.base_url],
                token=TOKEN,
                watch_interval_s=None,
                timeout=impatient,
                lost_answer_attempts=2,
            ) as pool:
                # The start reached a process that says nothing: it may take the call yet.
                with pytest.raises(RunnerUnreachable) as unreachable:
                    await pool.start_call(start("c1"))
            assert unreachable.value.maybe_delivered is True
            assert unreachable.value.url == stopped.base_url
        finally:
            stopped.signal(signal.SIGCONT)
        assert await _sessions(other) == []
