"""The agent WebSocket's rows: end users, their tokens, conversations and messages.

They live in the journal's SQLite file (migration ``0002_agent_socket``) but not in its
record stream: a conversation is mutable state (it is deleted, its token is revoked),
not an append-only record. The store has its own write connection beside the
journal's writer (WAL lets both write the one file; ``busy_timeout`` orders them) and a
small pool of read-only connections. Every statement is a small sync function that takes
a connection, run in a worker thread; reads are single statements, so no reader ever
waits inside a transaction.
"""

from __future__ import annotations

import hmac
import json
import sqlite3
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import attrs
import trio

from ._journal import _connect, migrate, now_ms

_READ_POOL = 2


@attrs.frozen(kw_only=True)
class TokenRow:
    """One minted token (never its text). ``credit_limit`` is None for no limit."""

    token_id: str
    end_user_id: str
    scope: str
    created_at: int
    expires_at: int
    revoked_at: int | None
    credit_limit: float | None
    credit_spent: float

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> TokenRow:
        token_id, end_user_id, scope, created_at, expires_at, revoked_at, credit_limit, credit_spent = row
        return cls(
            token_id=token_id,
            end_user_id=end_user_id,
            scope=scope,
            created_at=created_at,
            expires_at=expires_at,
            revoked_at=revoked_at,
            credit_limit=credit_limit,
            credit_spent=credit_spent,
        )


@attrs.frozen(kw_only=True)
class ConversationRow:
    conversation_id: str
    agent_id: str
    end_user_id: str
    created_at: int
    deleted_at: int | None

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> ConversationRow:
        conversation_id, agent_id, end_user_id, created_at, deleted_at = row
        return cls(
            conversation_id=conversation_id,
            agent_id=agent_id,
            end_user_id=end_user_id,
            created_at=created_at,
            deleted_at=deleted_at,
        )


@attrs.frozen(kw_only=True)
class StoredToolCall:
    id: str
    name: str
    arguments: dict[str, Any]


@attrs.frozen(kw_only=True)
class StoredMessage:
    """One message of a conversation as the model reads it."""

    role: str
    content: str
    tool_calls: tuple[StoredToolCall, ...] = ()
    tool_call_id: str | None = None
    turn_id: str | None = None
    position: int = 0
    created_at: int = 0

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> StoredMessage:
        position, role, content, tool_calls, tool_call_id, turn_id, created_at = row
        calls = tuple(StoredToolCall(id=c["id"], name=c["name"], arguments=c["arguments"]) for c in json.loads(tool_calls or "[]"))
        return cls(
            role=role,
            content=content,
            tool_calls=calls,
            tool_call_id=tool_call_id,
            turn_id=turn_id,
            position=position,
            created_at=created_at,
        )


# -- SQL: small sync functions that take a connection ---------------------------------------

_TOKEN_COLUMNS = "token_id, end_user_id, scope, created_at, expires_at, revoked_at, credit_limit, credit_spent"
_CONVERSATION_COLUMNS = "conversation_id, agent_id, end_user_id, created_at, deleted_at"


def _in_transaction(conn: sqlite3.Connection, fn: Any, *args: Any) -> Any:
    conn.execute("BEGIN IMMEDIATE")
    try:
        result = fn(conn, *args)
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return result


def _ensure_end_user(conn: sqlite3.Connection, end_user_id: str, at: int) -> None:
    conn.execute(
        "INSERT INTO agent_end_users (end_user_id, created_at) VALUES (?, ?) ON CONFLICT DO NOTHING",
        (end_user_id, at),
    )


def _insert_token(
    conn: sqlite3.Connection, token_id: str, digest: str, end_user_id: str, expires_at: int, credit_limit: float | None, at: int
) -> TokenRow:
    _ensure_end_user(conn, end_user_id, at)
    conn.execute(
        "INSERT INTO agent_tokens (token_id, token_sha256, end_user_id, scope, created_at, expires_at, credit_limit)"
        " VALUES (?, ?, ?, 'agent', ?, ?, ?)",
        (token_id, digest, end_user_id, at, expires_at, credit_limit),
    )
    row = conn.execute(f"SELECT {_TOKEN_COLUMNS} FROM agent_tokens WHERE token_id = ?", (token_id,)).fetchone()
    return TokenRow.from_row(row)


def _find_token(conn: sqlite3.Connection, token_id: str, digest: str) -> TokenRow | None:
    row = conn.execute(
        f"SELECT token_sha256, {_TOKEN_COLUMNS} FROM agent_tokens WHERE token_id = ?", (token_id,)
    ).fetchone()
    if row is None or not hmac.compare_digest(row[0], digest):
        return None
    return TokenRow.from_row(row[1:])


def _revoke_token(conn: sqlite3.Connection, token_id: str, at: int) -> bool:
    cursor = conn.execute(
        "UPDATE agent_tokens SET revoked_at = ? WHERE token_id = ? AND revoked_at IS NULL", (at, token_id)
    )
    if cursor.rowcount:
        return True
    return conn.execute("SELECT 1 FROM agent_tokens WHERE token_id = ?", (token_id,)).fetchone() is not None


def _insert_conversation(
    conn: sqlite3.Connection, conversation_id: str, agent_id: str, end_user_id: str, at: int
) -> ConversationRow:
    _ensure_end_user(conn, end_user_id, at)
    conn.execute(
        "INSERT INTO agent_conversations (conversation_id, agent_id, end_user_id, created_at) VALUES (?, ?, ?, ?)",
        (conversation_id, agent_id, end_user_id, at),
    )
    return ConversationRow(
        conversation_id=conversation_id, agent_id=agent_id, end_user_id=end_user_id, created_at=at, deleted_at=None
    )


def _get_conversation(conn: sqlite3.Connection, conversation_id: str) -> ConversationRow | None:
    row = conn.execute(
        f"SELECT {_CONVERSATION_COLUMNS} FROM agent_conversations WHERE conversation_id = ?", (conversation_id,)
    ).fetchone()
    return ConversationRow.from_row(row) if row else None


def _delete_conversation(conn: sqlite3.Connection, conversation_id: str, at: int) -> bool:
    cursor = conn.execute(
        "UPDATE agent_conversations SET deleted_at = ? WHERE conversation_id = ? AND deleted_at IS NULL",
        (at, conversation_id),
    )
    conn.execute("DELETE FROM agent_messages WHERE conversation_id = ?", (conversation_id,))
    return cursor.rowcount > 0


def _append_messages(
    conn: sqlite3.Connection, conversation_id: str, messages: Sequence[StoredMessage], at: int
) -> int:
    last = conn.execute(
        "SELECT coalesce(max(position), 0) FROM agent_messages WHERE conversation_id = ?", (conversation_id,)
    ).fetchone()[0]
    rows = []
    for offset, message in enumerate(messages, start=1):
        calls = (
            json.dumps([attrs.asdict(c) for c in message.tool_calls], separators=(",", ":"), default=str)
            if message.tool_calls
            else None
        )
        rows.append(
            (conversation_id, last + offset, message.role, message.content, calls, message.tool_call_id, message.turn_id, at)
        )
    conn.executemany(
        "INSERT INTO agent_messages (conversation_id, position, role, content, tool_calls, tool_call_id, turn_id, created_at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        rows,
    )
    return last + len(rows)


def _load_messages(conn: sqlite3.Connection, conversation_id: str) -> list[StoredMessage]:
    rows = conn.execute(
        "SELECT position, role, content, tool_calls, tool_call_id, turn_id, created_at FROM agent_messages"
        " WHERE conversation_id = ? ORDER BY position",
        (conversation_id,),
    )
    return [StoredMessage.from_row(row) for row in rows]


class AgentStore:
    """The agent WebSocket's rows. Open it with :func:`open_agent_store`."""

    def __init__(self, writer: sqlite3.Connection, readers: list[sqlite3.Connection]) -> None:
        self._writer = writer
        self._write_lock = trio.Lock()
        self._readers = readers
        self._reader_slots = trio.Semaphore(len(readers))

    async def _write(self, fn: Any, *args: Any) -> Any:
        async with self._write_lock:
            return await trio.to_thread.run_sync(_in_transaction, self._writer, fn, *args)

    @contextmanager
    def _reader(self) -> Iterator[sqlite3.Connection]:
        conn = self._readers.pop()
        try:
            yield conn
        finally:
            self._readers.append(conn)

    async def _read(self, fn: Any, *args: Any) -> Any:
        async with self._reader_slots:

            def run() -> Any:
                with self._reader() as conn:
                    return fn(conn, *args)

            return await trio.to_thread.run_sync(run)

    async def insert_token(
        self, *, token_id: str, token_sha256: str, end_user_id: str, expires_at: int, credit_limit: float | None
    ) -> TokenRow:
        """Keep a minted token (its digest only) for ``end_user_id``, creating the person."""
        return await self._write(_insert_token, token_id, token_sha256, end_user_id, expires_at, credit_limit, now_ms())

    async def find_token(self, token_id: str, token_sha256: str) -> TokenRow | None:
        """The token with this id, if its digest matches (compared in constant time)."""
        return await self._read(_find_token, token_id, token_sha256)

    async def revoke_token(self, token_id: str) -> bool:
        """Revoke a token; False when there is no such token (revoking twice is no error)."""
        return await self._write(_revoke_token, token_id, now_ms())

    async def create_conversation(self, *, conversation_id: str, agent_id: str, end_user_id: str) -> ConversationRow:
        return await self._write(_insert_conversation, conversation_id, agent_id, end_user_id, now_ms())

    async def get_conversation(self, conversation_id: str) -> ConversationRow | None:
        return await self._read(_get_conversation, conversation_id)

    async def delete_conversation(self, conversation_id: str) -> bool:
        """Mark a conversation deleted and drop its messages; False if already gone."""
        return await self._write(_delete_conversation, conversation_id, now_ms())

    async def append_messages(self, conversation_id: str, messages: Sequence[StoredMessage]) -> int:
        """Add messages after the last one, in one transaction; return the last position."""
        if not messages:
            return 0
        return await self._write(_append_messages, conversation_id, list(messages), now_ms())

    async def load_messages(self, conversation_id: str) -> list[StoredMessage]:
        """Every message of a conversation, oldest first."""
        return await self._read(_load_messages, conversation_id)


@asynccontextmanager
async def open_agent_store(path: str | Path) -> AsyncIterator[AgentStore]:
    """Open the agent store in the SQLite file at ``path`` (migrating it if needed)."""
    path = Path(path)

    def connect() -> tuple[sqlite3.Connection, list[sqlite3.Connection]]:
        writer = _connect(path)
        migrate(writer)
        return writer, [_connect(path, readonly=True) for _ in range(_READ_POOL)]

    writer, readers = await trio.to_thread.run_sync(connect)
    try:
        yield AgentStore(writer, readers)
    finally:
        for conn in [writer, *readers]:
            conn.close()
