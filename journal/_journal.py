"""The embedded journal: one SQLite file in WAL mode, one writer, many readers.

Appends queue to a single writer task that commits whatever is waiting as one
transaction (group commit), so a burst of concurrent appenders costs one fsync.
An append returns only after its transaction committed, and followers are woken
only then: nothing is ever streamed that a crash could take back.
"""

from __future__ import annotations

import collections
import itertools
import json
import math
import sqlite3
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import trio
from sqlite_utils import Database

from migrations import MIGRATIONS

DEFAULT_RETENTION_RECORDS = 4096
_RECENT_LINES = 4096
_RECENT_BYTES = 8 << 20
_READ_POOL = 4

# The stream's line for a record, built by SQLite from the stored JSON body, so a
# body is never decoded and encoded again on its way to a follower.
_LINE_SQL = (
    "json_object('envelope', envelope, 'producer', producer, 'seq', seq,"
    " 'class', class, 'at', at, 'body', json(body))"
)


@attrs.frozen(kw_only=True)
class Record:
    """One committed record.

    Attributes:
        envelope: Runner-wide, gapless, positive; the resume cursor.
        producer: Who wrote it: ``runner`` or a session id.
        seq: Gapless per producer, continuing across restarts.
        cls: The record class (``class`` on the wire).
        at: Milliseconds since the Unix epoch.
        body: The JSON object.
    """

    envelope: int
    producer: str
    seq: int
    cls: str
    at: int
    body: Mapping[str, Any]

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> Record:
        envelope, producer, seq, klass, at, body = row
        return cls(
            envelope=envelope, producer=producer, seq=seq, cls=klass, at=at, body=json.loads(body)
        )


@attrs.frozen(kw_only=True)
class Window:
    """What the journal holds right now: ``oldest`` is None when it holds nothing."""

    oldest: int | None
    head: int


class JournalClosed(Exception):
    """The journal no longer takes appends."""


class CursorTooOld(Exception):
    """The records after ``requested`` were pruned before a reader got to them."""

    def __init__(self, requested: int, oldest_retained: int) -> None:
        super().__init__(f"cursor {requested} is older than the oldest retained record {oldest_retained}")
        self.requested = requested
        self.oldest_retained = oldest_retained


class CursorAhead(Exception):
    """The cursor names records this journal never wrote (its file was replaced)."""

    def __init__(self, requested: int, head: int) -> None:
        super().__init__(f"cursor {requested} is ahead of the journal's head {head}")
        self.requested = requested
        self.head = head


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def _prepare_connection(conn: sqlite3.Connection) -> None:
    conn.execute("PRAGMA journal_mode = WAL")
    # FULL: in WAL mode every commit fsyncs the WAL, so a committed record
    # survives power loss as well as a process kill (see docs/journal.md).
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute("PRAGMA busy_timeout = 5000")
    conn.execute("PRAGMA foreign_keys = ON")


def _connect(path: Path, *, readonly: bool = False) -> sqlite3.Connection:
    if readonly:
        conn = sqlite3.connect(
            f"file:{path}?mode=ro", uri=True, check_same_thread=False, isolation_level=None
        )
        conn.execute("PRAGMA busy_timeout = 5000")
        return conn
    conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
    _prepare_connection(conn)
    return conn


def migrate(conn: sqlite3.Connection) -> None:
    """Apply the pending migrations, each in its own transaction."""
    MIGRATIONS.apply(Database(conn))


# -- SQL: small sync functions that take a connection ---------------------------------------


def _head(conn: sqlite3.Connection) -> int:
    row = conn.execute("SELECT seq FROM sqlite_sequence WHERE name = 'records'").fetchone()
    return row[0] if row else 0


def _window(conn: sqlite3.Connection) -> Window:
    conn.execute("BEGIN")
    try:
        oldest = conn.execute("SELECT min(envelope) FROM records").fetchone()[0]
        return Window(oldest=oldest, head=_head(conn))
    finally:
        conn.execute("COMMIT")


def _after(
    columns: str, after: int, limit: int, producer: str | None, klass: str | None
) -> tuple[str, list[Any]]:
    """The query for records after ``after``, optionally of one producer or class."""
    sql = f"SELECT {columns} FROM records WHERE envelope > ?"
    args: list[Any] = [after]
    if producer is not None:
        sql += " AND producer = ?"
        args.append(producer)
    if klass is not None:
        sql += " AND class = ?"
        args.append(klass)
    return sql + " ORDER BY envelope LIMIT ?", [*args, limit]


def _read_lines(
    conn: sqlite3.Connection, after: int, limit: int, producer: str | None = None, klass: str | None = None
) -> list[tuple[int, str]]:
    return conn.execute(*_after(f"envelope, {_LINE_SQL}", after, limit, producer, klass)).fetchall()


def _read_records(
    conn: sqlite3.Connection, after: int, limit: int, producer: str | None, klass: str | None
) -> list[Record]:
    sql, args = _after("envelope, producer, seq, class, at, body", after, limit, producer, klass)
    return [Record.from_row(row) for row in conn.execute(sql, args)]


def _open_producers(conn: sqlite3.Connection, exclude: Sequence[str]) -> list[str]:
    rows = conn.execute("SELECT producer FROM producers WHERE closed = 0 ORDER BY producer")
    return [row[0] for row in rows if row[0] not in exclude]


_encode = json.JSONEncoder(separators=(",", ":")).encode
# As SQLite's json_object() writes a string: non-ASCII characters as they are.
_encode_name = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


class ReaderPool:
    """Read-only connections, one per worker thread at a time.

    Each read runs in a thread on a free connection and holds it (and any read
    transaction) only for that one call: nobody waits inside a transaction.
    """

    def __init__(self, connections: list[sqlite3.Connection]) -> None:
        self.connections = connections
        self._free = list(connections)
        self._slots = trio.Semaphore(len(connections))

    async def run(self, fn: Any, *args: Any) -> Any:
        """``fn(conn, *args)`` on a free connection, in a worker thread."""
        async with self._slots:

            def run() -> Any:
                conn = self._free.pop()
                try:
                    return fn(conn, *args)
                finally:
                    self._free.append(conn)

            return await trio.to_thread.run_sync(run)


@attrs.define(kw_only=True)
class _Pending:
    producer: str
    cls: str
    body: Mapping[str, Any]
    # The body's JSON, encoded by the appender (so one bad body fails only its own append);
    # for a stamped body, everything but its type, which the writer puts first with seq and at.
    encoded: str
    stamp: bool
    closes: bool
    # Shared by every record of one batch: set once the batch committed (or failed).
    done: trio.Event
    record: Record | None = None
    error: BaseException | None = None


class _Writer:
    """The one connection that writes. Used only from the writer task's thread calls."""

    def __init__(self, conn: sqlite3.Connection, retention_records: int) -> None:
        self.conn = conn
        self.retention_records = retention_records
        self.head = _head(conn)
        self.seqs: dict[str, int] = {}

    def _next_seq(self, producer: str) -> int:
        last = self.seqs.get(producer)
        if last is None:
            row = self.conn.execute(
                "SELECT last_seq FROM producers WHERE producer = ?", (producer,)
            ).fetchone()
            last = row[0] if row else 0
        return last + 1

    def write(self, batch: Sequence[_Pending]) -> tuple[list[Record], list[tuple[int, str]]]:
        """Commit ``batch`` as one transaction; return its records and their stream lines."""
        at = now_ms()
        envelope = self.head
        seqs: dict[str, int] = {}
        rows = []
        records = []
        lines: list[tuple[int, str]] = []
        closed = []
        for item in batch:
            seq = seqs.get(item.producer) or self._next_seq(item.producer)
            seqs[item.producer] = seq + 1
            envelope += 1
            body = item.body
            text = item.encoded
            if item.stamp:
                # Call records repeat their seq and at inside the body (the seed's host record).
                body = {"type": body["type"], "seq": seq, "at": at, **body}
                head = f'{{"type":{_encode(body["type"])},"seq":{seq},"at":{at}'
                text = head + ("," + text[1:] if len(text) > 2 else "}")
            rows.append((envelope, item.producer, seq, item.cls, at, text))
            records.append(
                Record(envelope=envelope, producer=item.producer, seq=seq, cls=item.cls, at=at, body=body)
            )
            lines.append(
                (
                    envelope,
                    f'{{"envelope":{envelope},"producer":{_encode_name(item.producer)},"seq":{seq},'
                    f'"class":{_encode_name(item.cls)},"at":{at},"body":{text}}}',
                )
            )
            if item.closes:
                closed.append(item.producer)
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.executemany(
                "INSERT INTO records (envelope, producer, seq, class, at, body) VALUES (?, ?, ?, ?, ?, ?)",
                rows,
            )
            conn.executemany(
                "INSERT INTO producers (producer, last_seq) VALUES (?, ?)"
                " ON CONFLICT (producer) DO UPDATE SET last_seq = excluded.last_seq",
                [(producer, seq - 1) for producer, seq in seqs.items()],
            )
            conn.executemany(
                "UPDATE producers SET closed = 1 WHERE producer = ?", [(p,) for p in closed]
            )
            conn.execute(
                "DELETE FROM records WHERE envelope <= ?", (envelope - self.retention_records,)
            )
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        self.head = envelope
        for producer, seq in seqs.items():
            self.seqs[producer] = seq - 1
        return records, lines


class Journal:
    """The runner's journal. Open it with :func:`open_journal`.

    Appends from any task; one writer commits them in groups. Readers run short
    read transactions on a small pool of connections and wait for new records
    outside any transaction, so checkpoints are never starved.
    """

    def __init__(self, path: Path, writer: _Writer, readers: list[sqlite3.Connection]) -> None:
        self.path = path
        self._writer = writer
        self._readers = ReaderPool(readers)
        self._send, self._receive = trio.open_memory_channel[_Pending](math.inf)
        self._head = writer.head
        self._changed = trio.Event()
        self._next_done = trio.Event()
        self._recent: collections.deque[tuple[int, str]] = collections.deque()
        self._recent_bytes = 0
        self._closed = False

    @property
    def head(self) -> int:
        """The envelope of the newest committed record (0 for an empty journal)."""
        return self._head

    @property
    def retention_records(self) -> int:
        return self._writer.retention_records

    async def append(
        self,
        producer: str,
        cls: str,
        body: Mapping[str, Any],
        *,
        stamp: bool = False,
        closes: bool = False,
    ) -> Record:
        """Write one record and return it once it is durable.

        Args:
            producer: ``runner`` or a session id.
            cls: The record class, for example ``lifecycle`` or ``conversation``.
            body: A JSON object.
            stamp: Put the record's ``seq`` and ``at`` into the body, after its ``type``.
            closes: This is the producer's terminal record (see :meth:`open_producers`).

        Raises:
            JournalClosed: The journal is shutting down.
        """
        if self._closed:
            raise JournalClosed("the journal is closed")
        if stamp:
            encoded = _encode({k: v for k, v in body.items() if k != "type"})
        else:
            encoded = _encode(body)
        if not encoded.startswith("{"):
            raise TypeError("a record's body must be a JSON object")
        pending = _Pending(
            producer=producer, cls=cls, body=body, encoded=encoded, stamp=stamp, closes=closes, done=self._next_done
        )
        try:
            self._send.send_nowait(pending)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            raise JournalClosed("the journal is closed") from None
        # Once queued, the record is written whether or not we are cancelled; a cancelled
        # appender just does not learn how it fared.
        await pending.done.wait()
        if pending.error is not None:
            if isinstance(pending.error, JournalClosed):
                # Closed because we are being cancelled: say that, not the closing.
                await trio.lowlevel.checkpoint_if_cancelled()
            raise pending.error
        assert pending.record is not None
        return pending.record

    async def serve_writer(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Commit queued appends in groups until the journal closes."""
        task_status.started()
        async with self._receive:
            try:
                while True:
                    try:
                        batch = [await self._receive.receive()]
                    except trio.EndOfChannel:
                        return
                    # Everything queued goes in this batch: its appenders share one event, and
                    # appends from now on get the next one.
                    while True:
                        try:
                            batch.append(self._receive.receive_nowait())
                        except (trio.WouldBlock, trio.EndOfChannel):
                            break
                    done, self._next_done = self._next_done, trio.Event()
                    await self._commit(batch)
                    done.set()
            finally:
                # Cancelled (or closed): no append may wait for a writer that is gone.
                self._closed = True
                while True:
                    try:
                        pending = self._receive.receive_nowait()
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                    pending.error = JournalClosed("the journal closed before this record was written")
                self._next_done.set()

    async def _commit(self, batch: list[_Pending]) -> None:
        try:
            # Shielded: a batch taken off the queue is written even when the writer is being
            # cancelled, so every appender learns how its record fared.
            with trio.CancelScope(shield=True):
                records, lines = await trio.to_thread.run_sync(self._writer.write, batch)
        except Exception as exc:
            for item in batch:
                item.error = exc
            return
        for item, record in zip(batch, records, strict=True):
            item.record = record
        self._remember(lines)
        self._head = records[-1].envelope
        self._changed.set()
        self._changed = trio.Event()

    def _remember(self, lines: list[tuple[int, str]]) -> None:
        # Followers read the newest lines from memory: one SQL read per commit, not per follower.
        recent = self._recent
        recent.extend(lines)
        self._recent_bytes += sum(len(line) for _, line in lines)
        limit = min(self._writer.retention_records, _RECENT_LINES)
        while recent and (len(recent) > limit or self._recent_bytes > _RECENT_BYTES):
            self._recent_bytes -= len(recent.popleft()[1])

    def close_nowait(self) -> None:
        """Take no more appends; the writer finishes what is queued, then returns."""
        self._closed = True
        self._send.close()

    async def wait_past(self, cursor: int) -> None:
        """Wait until a record after ``cursor`` has been committed."""
        while self._head <= cursor:
            await self._changed.wait()

    async def window(self) -> Window:
        """The oldest retained envelope and the head, as committed."""
        return await self._readers.run(_window)

    async def check_cursor(self, cursor: int) -> None:
        """Raise if a reader cannot resume after ``cursor``.

        ``0`` always works: it means "everything still held".

        Raises:
            CursorTooOld: Records after the cursor were pruned.
            CursorAhead: The cursor is past this journal's head.
        """
        if cursor == 0:
            return
        window = await self.window()
        if cursor > window.head:
            raise CursorAhead(cursor, window.head)
        oldest = window.oldest if window.oldest is not None else window.head + 1
        if cursor < oldest - 1:
            raise CursorTooOld(cursor, oldest)

    async def read_lines(self, after: int, limit: int = 1024) -> list[tuple[int, str]]:
        """The stream lines of committed records after ``after``: ``(envelope, json)`` pairs.

        Raises:
            CursorTooOld: The record right after ``after`` was pruned (``after`` > 0).
        """
        await trio.lowlevel.checkpoint()
        # No checkpoint between finding the start and slicing: a commit may evict old lines.
        recent = self._recent
        if recent and recent[0][0] <= after + 1:
            start = after + 1 - recent[0][0]
            return list(itertools.islice(recent, start, start + limit))
        rows: list[tuple[int, str]] = await self._readers.run(_read_lines, after, limit)
        if rows and after > 0 and rows[0][0] != after + 1:
            raise CursorTooOld(after, rows[0][0])
        return rows

    async def read(
        self,
        after: int,
        limit: int = 1024,
        *,
        producer: str | None = None,
        cls: str | None = None,
    ) -> list[Record]:
        """Committed records after ``after``, optionally of one producer or class."""
        return await self._readers.run(_read_records, after, limit, producer, cls)

    async def open_producers(self, *, exclude: Sequence[str] = ()) -> list[str]:
        """Producers whose terminal record (``closes=True``) was never written."""
        return await self._readers.run(_open_producers, exclude)


@asynccontextmanager
async def open_journal(
    path: str | Path, *, retention_records: int = DEFAULT_RETENTION_RECORDS
) -> AsyncIterator[Journal]:
    """Open (creating and migrating) the journal at ``path`` and run its writer.

    On exit, appends already queued are committed before the file is closed.
    """
    if retention_records < 1:
        raise ValueError("retention_records must be at least 1")
    path = Path(path)

    def connect() -> tuple[_Writer, list[sqlite3.Connection]]:
        conn = _connect(path)
        migrate(conn)
        readers = [_connect(path, readonly=True) for _ in range(_READ_POOL)]
        return _Writer(conn, retention_records), readers

    writer, readers = await trio.to_thread.run_sync(connect)
    journal = Journal(path, writer, readers)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(journal.serve_writer)
            try:
                yield journal
            finally:
                journal.close_nowait()
    finally:
        for conn in [writer.conn, *readers]:
            conn.close()


# -- Reading a journal file from another process (runner replay) ----------------------------


class JournalFile:
    """Read-only access to a journal file, for tools that run beside (or after) the runner."""

    def __init__(self, path: str | Path) -> None:
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"no journal at {path}")
        self._conn = _connect(path, readonly=True)

    def close(self) -> None:
        self._conn.close()

    def window(self) -> Window:
        return _window(self._conn)

    def read(
        self, after: int, limit: int = 1024, *, producer: str | None = None, cls: str | None = None
    ) -> list[Record]:
        return _read_records(self._conn, after, limit, producer, cls)

    def read_lines(
        self, after: int, limit: int = 1024, *, producer: str | None = None, cls: str | None = None
    ) -> list[tuple[int, str]]:
        return _read_lines(self._conn, after, limit, producer, cls)
