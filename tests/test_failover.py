"""A start with ``resume`` (docs/failover.md): the call goes on from the conversation another runner held."""

from __future__ import annotations

from pathlib import Path

import trio
import trio.lowlevel

from runner.wire import HISTORY_TURNS_MAX

from .agents import quiet, resumer
from .inprocess import call_start, events_named, follow, open_runner, refused, turns

HISTORY = [
    {"role": "assistant", "text": "Hello there."},
    {"role": "user", "text": "My name is John and I need a table for four."},
    {"role": "assistant", "text": "A table for four, John."},
]


async def test_a_resumed_call_opens_with_its_resume_line_and_knows_the_conversation(tmp_path: Path) -> None:
    async with open_runner(resumer, tmp_path) as runner, runner.client() as client, follow(runner) as stream:
        body = call_start("moved", resume={"history": HISTORY, "reason": "runner_lost"})
        assert (await client.post("/v1/sessions", json=body)).status_code == 202
        assert (await client.post("/v1/sessions", json=call_start("fresh"))).status_code == 202
        await stream.wait_for(
            lambda rs: len(turns(rs, "moved", "assistant")) and len(turns(rs, "fresh", "assistant"))
        )
        records = stream.records
        runtime = runner.runner.calls["moved"].conversation
    # Instead of the greeting, a line that shows the history arrived; a fresh call still greets.
    assert turns(records, "moved", "assistant")[0]["text"] == (
        "Sorry, the line dropped. You were saying: My name is John and I need a table for four."
    )
    assert turns(records, "fresh", "assistant")[0]["text"] == "Hello there."
    assert events_named(records, "moved", "curb.started")[0]["resumed"] == {
        "reason": "runner_lost",
        "turns": 3,
    }
    assert "resumed" not in events_named(records, "fresh", "curb.started")[0]
    # The model reads the earlier turns before this call's own.
    assert runtime is not None
    assert [(m.role, m.content) for m in runtime.history[:3]] == [(t["role"], t["text"]) for t in HISTORY]


async def test_a_history_past_its_bound_is_refused_and_starts_nothing(tmp_path: Path) -> None:
    async with open_runner(quiet, tmp_path) as runner, runner.client() as client:
        long = [{"role": "user", "text": "again"}] * (HISTORY_TURNS_MAX + 1)
        answer = await client.post("/v1/sessions", json=call_start("moved", resume={"history": long}))
        error = refused(answer, 400, "invalid_request")
        assert error["issues"][0]["path"] == ["resume", "history"]
        big = [{"role": "user", "text": "x" * 4096}] * 17  # 68 KiB of text, over 64 KiB
        answer = await client.post("/v1/sessions", json=call_start("moved", resume={"history": big}))
        refused(answer, 400, "invalid_request")
        await trio.lowlevel.checkpoint()
        assert (await client.get("/v1/runner")).json()["activeSessions"] == 0
