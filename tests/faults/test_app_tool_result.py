"""An app tool's result past the limit: cut, and the model told so; no closed socket, no swollen store."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import httpx
import pytest

from runner.platform import APP_TOOL_RESULT_MAX_BYTES

from ..runner_process import start_runner
from ..websocket.ino_client import RUNNER_ENV, Addresses, agent_ref, connect, public_address

pytestmark = pytest.mark.slow


async def test_a_9_mb_app_tool_result_is_cut_and_the_model_told(tmp_path: Path) -> None:
    journal = tmp_path / "j.db"
    async with start_runner(
        journal, agent=agent_ref("speaking"), env=RUNNER_ENV, ready_timeout=120
    ) as runner:
        addresses = Addresses(management=runner.address, public=public_address(runner.stderr) or "")
        api = addresses.api()
        token, session_id = await api.person("eu-big")
        big = "The spa page is open on floor two. " * 270_000  # 9.4 MB
        async with connect(addresses, token, session_id, tools=["open_page"]) as sock:
            # Written only: the built-in model says a tool's result as words, all of them.
            await sock.send("user_message", text="Please open page spa", speech=False)
            call = (await sock.until_type("tool.call"))[-1]
            await sock.send("tool.result", call_id=call["call_id"], result=big)
            frames = await sock.turn_end(timeout=60)
            # The turn ends as any other (before, a reading socket was closed 4006).
            assert frames[-1]["type"] == "turn.done", frames[-3:]
            reply = frames[-1]["message"]
            assert len(reply.encode()) < 2 * APP_TOOL_RESULT_MAX_BYTES, len(reply)
            # The socket goes on.
            assert (await sock.say("When is checkout?", speech=False))[-1]["type"] == "turn.done"
        async with httpx.AsyncClient(timeout=10) as client:
            assert (await client.get(f"http://{runner.address}/health")).status_code == 200
    with closing(sqlite3.connect(journal)) as conn:
        tool = [c for (c,) in conn.execute("SELECT content FROM agent_messages WHERE role = 'tool'")]
        kept = conn.execute("SELECT sum(length(content)) FROM agent_messages").fetchone()[0]
    assert len(tool) == 1
    # What the model got, and what the conversation keeps: the first part, and a word that it was cut.
    assert tool[0].startswith("The spa page is open on floor two.")
    assert f"it was {len(big.encode()):,} bytes" in tool[0]
    assert len(tool[0].encode()) < APP_TOOL_RESULT_MAX_BYTES + 512
    assert kept < 4 * APP_TOOL_RESULT_MAX_BYTES, kept
