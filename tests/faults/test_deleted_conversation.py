"""A conversation deleted while one of its turns runs stays deleted: the turn writes none of its words."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from ..websocket.ino_client import connect, start_ino_runner

pytestmark = pytest.mark.slow


async def test_a_turn_cancelled_by_the_delete_writes_no_row_into_the_deleted_conversation(
    tmp_path: Path,
) -> None:
    journal = tmp_path / "j.db"
    async with start_ino_runner(journal) as (runner, addresses):
        api = addresses.api()
        token, session_id = await api.person("eu-deleted")
        async with connect(addresses, token, session_id, tools=["open_page"]) as sock:
            # The turn waits on the app's tool: delete the conversation under it.
            await sock.send("user_message", text="Please open page spa")
            await sock.until_type("tool.call")
            deleted = await api.delete(session_id, token)
            assert deleted.status_code == 200, deleted.text
            assert await sock.closed() == (4008, "the conversation was deleted")
        async with addresses.management_client() as management:
            assert (await management.post("/v1/runner/drain")).status_code == 202
        assert await runner.wait_exit() == 0
    # Read once the runner is gone, so the cancelled turn has finished whatever it would write.
    with sqlite3.connect(journal) as conn:
        words = conn.execute(
            "SELECT role, content FROM agent_messages WHERE conversation_id = ?", (session_id,)
        ).fetchall()
        (deleted_at,) = conn.execute(
            "SELECT deleted_at FROM agent_conversations WHERE conversation_id = ?", (session_id,)
        ).fetchone()
    assert deleted_at is not None
    assert words == []
