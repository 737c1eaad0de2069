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
import re
import sqlite3
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import attrs
import trio

from ._journal import (
    JournalWriteFailed,
    ReaderPool,
    _connect,
    file_gone,
    file_identity,
    migrate,
    now_ms,
    rollback,
)

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
        calls = tuple(
            StoredToolCall(id=c["id"], name=c["name"], arguments=c["arguments"])
            for c in json.loads(tool_calls or "[]")
        )
        return cls(
            role=role,
            content=content,
            tool_calls=calls,
            tool_call_id=tool_call_id,
            turn_id=turn_id,
            position=position,
            created_at=created_at,
        )


@attrs.frozen(kw_only=True)
class KnowledgeHit:
    """A knowledge entry a search found; ``score`` is higher for a better match (0 to 1)."""

    entry_id: str
    title: str
    text: str
    score: float


@attrs.frozen(kw_only=True)
class SummaryRow:
    """The newest summary of a conversation: it covers the messages up to ``after_position``."""

    after_position: int
    summary: str
    trigger: str

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> SummaryRow:
        after_position, summary, trigger = row
        return cls(after_position=after_position, summary=summary, trigger=trigger)


@attrs.frozen(kw_only=True)
class RelationNote:
    note: str
    recorded_at: int


@attrs.frozen(kw_only=True)
class RelationRow:
    """The standing relationship of an agent with a person."""

    agent_id: str
    end_user_id: str
    conversations: int
    first_at: int
    last_at: int
    notes: tuple[RelationNote, ...]


@attrs.frozen(kw_only=True)
class UsageRow:
    """What one turn used of one kind: ``model`` (tokens), ``transcription`` or ``speech`` (seconds)."""

    kind: str
    model: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    seconds: float = 0.0
    credits: float = 0.0


@attrs.frozen(kw_only=True)
class Spent:
    """After a charge: what the token and the whole runner have spent, in credits."""

    token_spent: float
    token_limit: float | None
    runner_spent: float


# -- SQL: small sync functions that take a connection ---------------------------------------

_TOKEN_COLUMNS = (
    "token_id, end_user_id, scope, created_at, expires_at, revoked_at, credit_limit, credit_spent"
)
_CONVERSATION_COLUMNS = "conversation_id, agent_id, end_user_id, created_at, deleted_at"


T = TypeVar("T")


def _in_transaction(conn: sqlite3.Connection, fn: Callable[..., T], *args: Any) -> T:
    conn.execute("BEGIN IMMEDIATE")
    try:
        result = fn(conn, *args)
        conn.execute("COMMIT")
    except BaseException:
        rollback(conn)
        raise
    return result


def _ensure_end_user(conn: sqlite3.Connection, end_user_id: str, at: int) -> None:
    conn.execute(
        "INSERT INTO agent_end_users (end_user_id, created_at) VALUES (?, ?) ON CONFLICT DO NOTHING",
        (end_user_id, at),
    )


def _insert_token(
    conn: sqlite3.Connection,
    token_id: str,
    digest: str,
    end_user_id: str,
    expires_at: int,
    credit_limit: float | None,
    at: int,
) -> TokenRow:
    _ensure_end_user(conn, end_user_id, at)
    conn.execute(
        "INSERT INTO agent_tokens (token_id, token_sha256, end_user_id, scope, created_at, expires_at, credit_limit)"
        " VALUES (?, ?, ?, 'agent', ?, ?, ?)",
        (token_id, digest, end_user_id, at, expires_at, credit_limit),
    )
    row = conn.execute(
        f"SELECT {_TOKEN_COLUMNS} FROM agent_tokens WHERE token_id = ?", (token_id,)
    ).fetchone()
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
        conversation_id=conversation_id,
        agent_id=agent_id,
        end_user_id=end_user_id,
        created_at=at,
        deleted_at=None,
    )


def _get_conversation(conn: sqlite3.Connection, conversation_id: str) -> ConversationRow | None:
    row = conn.execute(
        f"SELECT {_CONVERSATION_COLUMNS} FROM agent_conversations WHERE conversation_id = ?",
        (conversation_id,),
    ).fetchone()
    return ConversationRow.from_row(row) if row else None


def _delete_conversation(conn: sqlite3.Connection, conversation_id: str, at: int) -> bool:
    cursor = conn.execute(
        "UPDATE agent_conversations SET deleted_at = ? WHERE conversation_id = ? AND deleted_at IS NULL",
        (at, conversation_id),
    )
    conn.execute("DELETE FROM agent_messages WHERE conversation_id = ?", (conversation_id,))
    return cursor.rowcount > 0


def _deleted(conn: sqlite3.Connection, conversation_id: str) -> bool:
    row = conn.execute(
        "SELECT deleted_at FROM agent_conversations WHERE conversation_id = ?", (conversation_id,)
    ).fetchone()
    return row is not None and row[0] is not None


def _append_messages(
    conn: sqlite3.Connection, conversation_id: str, messages: Sequence[StoredMessage], at: int
) -> int:
    if _deleted(conn, conversation_id):
        # A turn cancelled by the delete finishes after it: its words stay deleted.
        return 0
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
            (
                conversation_id,
                last + offset,
                message.role,
                message.content,
                calls,
                message.tool_call_id,
                message.turn_id,
                at,
            )
        )
    conn.executemany(
        "INSERT INTO agent_messages (conversation_id, position, role, content, tool_calls, tool_call_id, turn_id, created_at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        rows,
    )
    return int(last) + len(rows)


def _load_messages(conn: sqlite3.Connection, conversation_id: str) -> list[StoredMessage]:
    rows = conn.execute(
        "SELECT position, role, content, tool_calls, tool_call_id, turn_id, created_at FROM agent_messages"
        " WHERE conversation_id = ? ORDER BY position",
        (conversation_id,),
    )
    return [StoredMessage.from_row(row) for row in rows]


# -- Knowledge, summaries, relations, usage (migration 0003) ----------------------------------

_FTS_WORD = re.compile(r"[A-Za-z0-9]+")
_STOP_WORDS = frozenset(
    """
    about after all also and any are but can could did does for from get had has have her here him
    his how its just let like more most not now our out over please say she should some tell than
    that the their them then there these they this those too very want was were what when where
    which who whom why will with would you your
    """.split()
)


def _insert_knowledge(
    conn: sqlite3.Connection, agent_id: str, entries: Sequence[tuple[str, str, str]], at: int
) -> int:
    for entry_id, title, text in entries:
        old = conn.execute(
            "SELECT rowid, title, text FROM agent_knowledge WHERE entry_id = ?", (entry_id,)
        ).fetchone()
        if old is not None:
            conn.execute(
                "INSERT INTO agent_knowledge_fts (agent_knowledge_fts, rowid, title, text) VALUES ('delete', ?, ?, ?)",
                old,
            )
            conn.execute("DELETE FROM agent_knowledge WHERE rowid = ?", (old[0],))
        cursor = conn.execute(
            "INSERT INTO agent_knowledge (entry_id, agent_id, title, text, created_at) VALUES (?, ?, ?, ?, ?)",
            (entry_id, agent_id, title, text, at),
        )
        conn.execute(
            "INSERT INTO agent_knowledge_fts (rowid, title, text) VALUES (?, ?, ?)",
            (cursor.lastrowid, title, text),
        )
    return len(entries)


def _search_knowledge(conn: sqlite3.Connection, agent_id: str, query: str, limit: int) -> list[KnowledgeHit]:
    words = list(
        dict.fromkeys(w for w in _FTS_WORD.findall(query.lower()) if len(w) > 2 and w not in _STOP_WORDS)
    )
    if not words:
        return []
    match = " OR ".join(f'"{w}"' for w in words)
    rows = conn.execute(
        "SELECT k.entry_id, k.title, k.text, highlight(agent_knowledge_fts, 0, '[', ']')"
        " || ' ' || highlight(agent_knowledge_fts, 1, '[', ']')"
        " FROM agent_knowledge_fts JOIN agent_knowledge AS k ON k.rowid = agent_knowledge_fts.rowid"
        " WHERE agent_knowledge_fts MATCH ? AND k.agent_id = ?"
        " ORDER BY bm25(agent_knowledge_fts, 2.0, 1.0), k.entry_id LIMIT ?",
        (match, agent_id, limit),
    ).fetchall()
    hits = []
    for entry_id, title, text, marked in rows:
        # The score is the share of the query's words the entry holds (after stemming).
        found = {m.lower() for m in re.findall(r"\[([^\]]+)\]", marked)}
        matched = sum(1 for w in words if any(f.startswith(w[:4]) or w.startswith(f[:4]) for f in found))
        hits.append(
            KnowledgeHit(
                entry_id=entry_id, title=title, text=text, score=round(min(1.0, matched / len(words)), 3)
            )
        )
    return hits


def _latest_summary(conn: sqlite3.Connection, conversation_id: str) -> SummaryRow | None:
    row = conn.execute(
        "SELECT after_position, summary, trigger FROM agent_summaries WHERE conversation_id = ?"
        " ORDER BY after_position DESC LIMIT 1",
        (conversation_id,),
    ).fetchone()
    return SummaryRow.from_row(row) if row else None


def _insert_summary(
    conn: sqlite3.Connection, conversation_id: str, after_position: int, summary: str, trigger: str, at: int
) -> None:
    if _deleted(conn, conversation_id):
        return
    conn.execute(
        "INSERT OR REPLACE INTO agent_summaries (conversation_id, after_position, summary, trigger, created_at)"
        " VALUES (?, ?, ?, ?, ?)",
        (conversation_id, after_position, summary, trigger, at),
    )


def _relation(conn: sqlite3.Connection, agent_id: str, end_user_id: str) -> RelationRow | None:
    count, first, last = conn.execute(
        "SELECT count(*), min(created_at), max(created_at) FROM agent_conversations WHERE agent_id = ? AND end_user_id = ?",
        (agent_id, end_user_id),
    ).fetchone()
    if not count:
        return None
    notes = conn.execute(
        "SELECT note, recorded_at FROM agent_relation_notes WHERE agent_id = ? AND end_user_id = ? ORDER BY recorded_at, rowid",
        (agent_id, end_user_id),
    ).fetchall()
    return RelationRow(
        agent_id=agent_id,
        end_user_id=end_user_id,
        conversations=count,
        first_at=first,
        last_at=last,
        notes=tuple(RelationNote(note=n, recorded_at=at) for n, at in notes),
    )


def _relations(conn: sqlite3.Connection, agent_id: str) -> list[RelationRow]:
    people = [
        r[0]
        for r in conn.execute(
            "SELECT DISTINCT end_user_id FROM agent_conversations WHERE agent_id = ? ORDER BY end_user_id",
            (agent_id,),
        )
    ]
    return [row for person in people if (row := _relation(conn, agent_id, person)) is not None]


def _insert_relation_note(
    conn: sqlite3.Connection, agent_id: str, end_user_id: str, note: str, turn_id: str | None, at: int
) -> RelationRow | None:
    conn.execute(
        "INSERT INTO agent_relation_notes (agent_id, end_user_id, note, turn_id, recorded_at) VALUES (?, ?, ?, ?, ?)",
        (agent_id, end_user_id, note, turn_id, at),
    )
    return _relation(conn, agent_id, end_user_id)


def _charge(
    conn: sqlite3.Connection,
    conversation_id: str,
    turn_id: str,
    token_id: str,
    end_user_id: str,
    rows: Sequence[UsageRow],
    at: int,
) -> Spent:
    conn.executemany(
        "INSERT INTO agent_usage (conversation_id, turn_id, token_id, end_user_id, kind, model, input_tokens,"
        " output_tokens, seconds, credits, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [
            (
                conversation_id,
                turn_id,
                token_id,
                end_user_id,
                r.kind,
                r.model,
                r.input_tokens,
                r.output_tokens,
                r.seconds,
                r.credits,
                at,
            )
            for r in rows
        ],
    )
    conn.execute(
        "UPDATE agent_tokens SET credit_spent = credit_spent + ? WHERE token_id = ?",
        (sum(r.credits for r in rows), token_id),
    )
    spent, limit = conn.execute(
        "SELECT credit_spent, credit_limit FROM agent_tokens WHERE token_id = ?", (token_id,)
    ).fetchone() or (0.0, None)
    return Spent(token_spent=spent, token_limit=limit, runner_spent=_runner_spent(conn))


def _store_turn(
    conn: sqlite3.Connection,
    conversation_id: str,
    messages: Sequence[StoredMessage],
    turn_id: str,
    token_id: str,
    end_user_id: str,
    rows: Sequence[UsageRow],
    at: int,
) -> Spent | None:
    if messages:
        _append_messages(conn, conversation_id, messages, at)
    return _charge(conn, conversation_id, turn_id, token_id, end_user_id, rows, at) if rows else None


def _runner_spent(conn: sqlite3.Connection) -> float:
    return float(conn.execute("SELECT coalesce(sum(credits), 0) FROM agent_usage").fetchone()[0])


def _usage_of(conn: sqlite3.Connection, conversation_id: str) -> list[UsageRow]:
    rows = conn.execute(
        "SELECT kind, model, input_tokens, output_tokens, seconds, credits FROM agent_usage"
        " WHERE conversation_id = ? ORDER BY usage_id",
        (conversation_id,),
    )
    return [
        UsageRow(kind=k, model=m, input_tokens=i, output_tokens=o, seconds=s, credits=c)
        for k, m, i, o, s, c in rows
    ]


class AgentStore:
    """The agent WebSocket's rows. Open it with :func:`open_agent_store`."""

    def __init__(
        self,
        writer: sqlite3.Connection,
        readers: list[sqlite3.Connection],
        *,
        path: Path,
        identity: tuple[int, int],
    ) -> None:
        self._writer = writer
        self._write_lock = trio.Lock()
        self._readers = ReaderPool(readers)
        self._path = path
        self._identity = identity

    async def _write(self, fn: Callable[..., T], *args: Any) -> T:
        async with self._write_lock:
            gone = file_gone(self._path, self._identity)
            if gone is not None:
                # As the journal's writer: nothing is acknowledged into a file no path names.
                await trio.lowlevel.checkpoint()
                raise JournalWriteFailed(
                    f"the journal file {self._path} was {gone} while this runner ran, so nothing more is written"
                )
            try:
                return await trio.to_thread.run_sync(_in_transaction, self._writer, fn, *args)
            except sqlite3.Error as exc:
                raise JournalWriteFailed(str(exc)) from exc

    async def insert_token(
        self,
        *,
        token_id: str,
        token_sha256: str,
        end_user_id: str,
        expires_at: int,
        credit_limit: float | None,
    ) -> TokenRow:
        """Keep a minted token (its digest only) for ``end_user_id``, creating the person."""
        return await self._write(
            _insert_token, token_id, token_sha256, end_user_id, expires_at, credit_limit, now_ms()
        )

    async def find_token(self, token_id: str, token_sha256: str) -> TokenRow | None:
        """The token with this id, if its digest matches (compared in constant time)."""
        return await self._readers.run(_find_token, token_id, token_sha256)

    async def revoke_token(self, token_id: str) -> bool:
        """Revoke a token; False when there is no such token (revoking twice is no error)."""
        return await self._write(_revoke_token, token_id, now_ms())

    async def create_conversation(
        self, *, conversation_id: str, agent_id: str, end_user_id: str
    ) -> ConversationRow:
        return await self._write(_insert_conversation, conversation_id, agent_id, end_user_id, now_ms())

    async def get_conversation(self, conversation_id: str) -> ConversationRow | None:
        return await self._readers.run(_get_conversation, conversation_id)

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
        return await self._readers.run(_load_messages, conversation_id)

    # -- Knowledge, summaries, relations, usage ------------------------------------------------

    async def load_knowledge(self, agent_id: str, entries: Sequence[tuple[str, str, str]]) -> int:
        """Add ``(entry_id, title, text)`` entries to an agent's knowledge; an entry_id again replaces it."""
        return await self._write(_insert_knowledge, agent_id, list(entries), now_ms())

    async def search_knowledge(self, agent_id: str, query: str, *, limit: int = 3) -> list[KnowledgeHit]:
        """The agent's entries sharing words with ``query``, best first (SQLite FTS5, bm25)."""
        return await self._readers.run(_search_knowledge, agent_id, query, limit)

    async def latest_summary(self, conversation_id: str) -> SummaryRow | None:
        return await self._readers.run(_latest_summary, conversation_id)

    async def add_summary(
        self, conversation_id: str, *, after_position: int, summary: str, trigger: str
    ) -> None:
        """Keep a summary of the conversation's messages up to ``after_position``."""
        await self._write(_insert_summary, conversation_id, after_position, summary, trigger, now_ms())

    async def relation(self, agent_id: str, end_user_id: str) -> RelationRow | None:
        """The agent's standing relationship with a person; None if they never had a conversation."""
        return await self._readers.run(_relation, agent_id, end_user_id)

    async def relations(self, agent_id: str) -> list[RelationRow]:
        return await self._readers.run(_relations, agent_id)

    async def record_relation(
        self, agent_id: str, end_user_id: str, note: str, *, turn_id: str | None
    ) -> RelationRow | None:
        """Add what the agent recorded about a person; return the relationship as it now stands."""
        return await self._write(_insert_relation_note, agent_id, end_user_id, note, turn_id, now_ms())

    async def store_turn(
        self,
        *,
        conversation_id: str,
        messages: Sequence[StoredMessage],
        turn_id: str,
        token_id: str,
        end_user_id: str,
        rows: Sequence[UsageRow],
    ) -> Spent | None:
        """Keep a turn's messages and charge its usage in one transaction: both or neither.

        A deleted conversation keeps none of the messages; the usage is still charged (the
        providers were paid). Returns the spending after the charge, None when there was none.
        """
        return await self._write(
            _store_turn, conversation_id, list(messages), turn_id, token_id, end_user_id, list(rows), now_ms()
        )

    async def charge(
        self, *, conversation_id: str, turn_id: str, token_id: str, end_user_id: str, rows: Sequence[UsageRow]
    ) -> Spent:
        """Keep a turn's usage rows and add their credits to the token's spending, in one transaction."""
        return await self._write(
            _charge, conversation_id, turn_id, token_id, end_user_id, list(rows), now_ms()
        )

    async def runner_spent(self) -> float:
        """Credits every token of this runner has spent."""
        return await self._readers.run(_runner_spent)

    async def usage_of(self, conversation_id: str) -> list[UsageRow]:
        """A conversation's usage rows, oldest first."""
        return await self._readers.run(_usage_of, conversation_id)


@asynccontextmanager
async def open_agent_store(path: str | Path) -> AsyncIterator[AgentStore]:
    """Open the agent store in the SQLite file at ``path`` (migrating it if needed)."""
    path = Path(path)

    def connect() -> tuple[sqlite3.Connection, list[sqlite3.Connection], tuple[int, int]]:
        writer = _connect(path)
        migrate(writer)
        return writer, [_connect(path, readonly=True) for _ in range(_READ_POOL)], file_identity(path)

    writer, readers, identity = await trio.to_thread.run_sync(connect)
    try:
        yield AgentStore(writer, readers, path=path, identity=identity)
    finally:
        for conn in [*readers, writer]:
            conn.close()
