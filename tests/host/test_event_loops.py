"""The same host code under ``asyncio.run`` and ``trio.run``: the client's concurrency is anyio's."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import trio

from runner.host import JournalRecord, RunnerPool, SessionNotFound

from ..runner_process import start_runner
from .helpers import TOKEN, start


async def _host(url: str, session_id: str) -> dict[str, Any]:
    """Place a call on a watched pool, follow it to its end, and ask for it once more."""
    async with RunnerPool([url], token=TOKEN, watch_interval_s=0.1) as pool:
        placed = await pool.start_call(start(session_id))
        names: list[str] = []
        async with pool.client(url).follow_events(from_=0, silence_timeout_s=2) as events:
            await pool.stop_call(session_id, reason="host_done")
            async for item in events:
                if isinstance(item, JournalRecord) and item.producer == session_id:
                    names.append(item.body["name"])
                    if item.body["name"] == "curb.ended":
                        reason = item.body["payload"]["reason"]
                        break
        try:
            await pool.get_call(session_id)
            gone = False
        except SessionNotFound:
            gone = True
        return {
            "runner": placed.runner == url,
            "accepted": placed.response.accepted,
            "names": names,
            "reason": reason,
            "gone": gone,
            "watched": pool.runners[0].max_sessions,
        }


@pytest.mark.slow
async def test_the_same_host_code_runs_under_asyncio_and_under_trio(tmp_path: Path) -> None:
    async with start_runner(tmp_path / "j.db", "--max-sessions", "3") as runner:
        url = runner.base_url
        under_asyncio = await trio.to_thread.run_sync(lambda: asyncio.run(_host(url, "from-asyncio")))
        under_trio = await trio.to_thread.run_sync(lambda: trio.run(_host, url, "from-trio"))
    expected = {
        "runner": True,
        "accepted": True,
        "names": ["curb.started", "curb.messages", "curb.ended"],
        "reason": "host_done",
        "gone": True,
        "watched": 3,
    }
    assert under_asyncio == expected
    assert under_trio == expected
