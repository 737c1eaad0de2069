"""The agent store in the journal's SQLite file: tokens kept hashed, conversations, messages,
and its writer beside the journal's."""

from __future__ import annotations

import hashlib
import sqlite3
from contextlib import closing
from pathlib import Path

import trio

from journal import StoredMessage, StoredToolCall, open_agent_store, open_journal


async def test_tokens_are_kept_only_as_digests_and_found_by_them(tmp_path: Path) -> None:
    token = "ek_0123456789abcdef_the-secret-part"
    digest = hashlib.sha256(token.encode()).hexdigest()
    async with open_journal(tmp_path / "j.db") as journal, open_agent_store(journal.path) as store:
        row = await store.insert_token(
            token_id="0123456789abcdef",
            token_sha256=digest,
            end_user_id="eu1",
            expires_at=10**13,
            credit_limit=2.5,
        )
        assert (row.end_user_id, row.scope, row.credit_limit, row.credit_spent, row.revoked_at) == (
            "eu1",
            "agent",
            2.5,
            0.0,
            None,
        )
        assert await store.find_token("0123456789abcdef", digest) == row
        assert await store.find_token("0123456789abcdef", hashlib.sha256(b"other").hexdigest()) is None
        assert await store.find_token("ffffffffffffffff", digest) is None
        assert await store.revoke_token("0123456789abcdef") is True
        assert await store.revoke_token("0123456789abcdef") is True  # again: no error
        assert await store.revoke_token("ffffffffffffffff") is False
        found = await store.find_token("0123456789abcdef", digest)
        assert found is not None and found.revoked_at is not None
    for path in tmp_path.iterdir():
        assert b"the-secret-part" not in path.read_bytes(), path


async def test_a_conversation_keeps_its_messages_in_order_until_deleted(tmp_path: Path) -> None:
    async with open_journal(tmp_path / "j.db") as journal, open_agent_store(journal.path) as store:
        row = await store.create_conversation(conversation_id="c1", agent_id="a1", end_user_id="eu1")
        assert (await store.get_conversation("c1")) == row and row.deleted_at is None
        call = StoredToolCall(id="call_1", name="weather", arguments={"city": "Oslo"})
        first = [
            StoredMessage(role="user", content="weather in Oslo", turn_id="t1"),
            StoredMessage(role="assistant", content="", tool_calls=(call,), turn_id="t1"),
        ]
        second = [
            StoredMessage(role="tool", content="snowing", tool_call_id="call_1", turn_id="t1"),
            StoredMessage(role="assistant", content="It is snowing.", turn_id="t1"),
        ]
        assert await store.append_messages("c1", first) == 2
        assert await store.append_messages("c1", second) == 4
        loaded = await store.load_messages("c1")
        assert [(m.position, m.role, m.content, m.tool_calls, m.tool_call_id) for m in loaded] == [
            (1, "user", "weather in Oslo", (), None),
            (2, "assistant", "", (call,), None),
            (3, "tool", "snowing", (), "call_1"),
            (4, "assistant", "It is snowing.", (), None),
        ]
        assert await store.delete_conversation("c1") is True
        assert await store.delete_conversation("c1") is False
        gone = await store.get_conversation("c1")
        assert gone is not None and gone.deleted_at is not None
        assert await store.load_messages("c1") == []
        assert await store.get_conversation("nope") is None


async def test_the_store_writes_beside_the_journal_writer(tmp_path: Path) -> None:
    async with open_journal(tmp_path / "j.db") as journal, open_agent_store(journal.path) as store:
        await store.create_conversation(conversation_id="c1", agent_id="a1", end_user_id="eu1")

        async def journal_writes() -> None:
            for i in range(300):
                await journal.append("runner", "lifecycle", {"event": "x", "i": i})

        async def store_writes() -> None:
            for i in range(150):
                await store.append_messages("c1", [StoredMessage(role="user", content=f"m{i}")])

        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(journal_writes)
                nursery.start_soon(store_writes)
                nursery.start_soon(store_writes)
        assert journal.head == 300
        assert [m.position for m in await store.load_messages("c1")] == list(range(1, 301))
    with closing(sqlite3.connect(tmp_path / "j.db")) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        applied = {row[0] for row in conn.execute("SELECT name FROM _sqlite_migrations")}
    assert {"0001_journal", "0002_agent_socket"} <= applied
