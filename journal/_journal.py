"""The embedded journal: one SQLite file in WAL mode, one writer, many readers.

Appends queue to a single writer thread that commits whatever is waiting as one
transaction (group commit), so a burst of concurrent appenders costs one fsync.
An append returns only after its transaction committed, and followers are woken
only then: nothing is ever streamed that a crash could take back.

The writer is a plain thread, not a Trio task handing batches to ``to_thread``: the
appends made in one pass of the Trio scheduler go onto its queue together when the
pass ends, the thread commits what is queued, and reports back with ``run_sync_soon``.
docs/journal.md says why, and docs/performance.md what each choice was measured to buy.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import errno
import fcntl
import functools
import hashlib
import json
import logging
import operator
import os
import queue
import socket
import sqlite3
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Generator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from itertools import chain, compress, count, repeat
from json.encoder import (  # type: ignore[attr-defined]  # the C encoder is real but undeclared in typeshed
    c_make_encoder,
    encode_basestring,
    encode_basestring_ascii,
)
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import attrs
import outcome
import trio

T = TypeVar("T")
R = TypeVar("R")
log = logging.getLogger("journal")

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


class Record(NamedTuple):
    """One committed record.

    A named tuple rather than a frozen attrs class: the writer makes one for every record
    it commits, and a tuple costs a fraction of that (docs/performance.md, the journal).

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
        return cls(envelope, producer, seq, klass, at, json.loads(body))


@attrs.frozen(kw_only=True)
class Entry:
    """One record for :meth:`Journal.append_many`: what :meth:`Journal.append` takes.

    Attributes:
        producer: ``runner`` or a session id.
        cls: The record class, for example ``lifecycle`` or ``conversation``.
        body: A JSON object.
        stamp: Put the record's ``seq`` and ``at`` into the body, after its ``type``.
        closes: This is the producer's terminal record.
    """

    producer: str
    cls: str
    body: Mapping[str, Any]
    stamp: bool = False
    closes: bool = False


@attrs.frozen(kw_only=True)
class Window:
    """What the journal holds right now: ``oldest`` is None when it holds nothing."""

    oldest: int | None
    head: int


class JournalClosed(Exception):
    """The journal no longer takes appends."""


class JournalUnavailable(Exception):
    """The file cannot be opened as this runner's journal. The message is one line naming it."""


class JournalWriteFailed(Exception):
    """A transaction failed and its records were not written: the message is SQLite's reason
    (``database or disk is full``, ``disk I/O error``, ...). The journal goes on; a later
    append may succeed once the cause is gone. Once the journal file was deleted or replaced
    under the runner, every append fails with this, saying so."""


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


def _connect(path: Path, *, readonly: bool = False, prepare: bool = True) -> sqlite3.Connection:
    if readonly:
        conn = sqlite3.connect(
            f"file:{path}?mode=ro", uri=True, check_same_thread=False, isolation_level=None
        )
        conn.execute("PRAGMA busy_timeout = 5000")
        return conn
    # Room for the writer's statements of every batch size (see _chunks) and the rest.
    conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None, cached_statements=256)
    if prepare:
        _prepare_connection(conn)
    return conn


@attrs.frozen
class _Ownership:
    """What makes a runner the owner of its journal, held until the journal closed."""

    fd: int
    """The journal file, ``flock``-ed: the file's identity is the one this descriptor names."""
    name: socket.socket
    """Bound to a name made of the path: it holds the path even once the file is deleted."""

    @property
    def identity(self) -> tuple[int, int]:
        status = os.fstat(self.fd)
        return status.st_dev, status.st_ino

    def release(self) -> None:
        os.close(self.fd)  # releases the flock
        self.name.close()


def file_identity(path: Path) -> tuple[int, int]:
    """The device and inode the path names now."""
    status = os.stat(path)
    return status.st_dev, status.st_ino


def file_gone(path: Path, identity: tuple[int, int]) -> str | None:
    """How the file with ``identity`` left ``path`` (``deleted``, ``replaced by another file``), or None."""
    try:
        now = file_identity(path)
    except FileNotFoundError:
        return "deleted"
    return None if now == identity else "replaced by another file"


def _path_name(path: Path) -> bytes:
    """An abstract socket name for the journal's path (Linux): one runner may hold it."""
    digest = hashlib.sha256(os.fsencode(os.path.realpath(path))).hexdigest()
    return f"\0curb-runner-journal:{digest}".encode()


def _take_ownership(path: Path) -> _Ownership:
    """Lock the journal for this process: one runner owns a journal, or none starts.

    Two locks, both released by the kernel when the process dies, however it dies. The
    path: an abstract Unix socket bound to a name made of it, taken first, so a runner
    started on the path of a file deleted under a running one is refused (and creates
    nothing). The file: an exclusive ``flock`` on it, taken before SQLite opens it (a
    runner in another network namespace does not see the socket's name). flock and
    SQLite's own POSIX locks do not interact; both are released after every connection.
    """
    in_use = JournalUnavailable(f"journal {path} is in use by another runner (one runner owns a journal)")
    name = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        name.bind(_path_name(path))
    except OSError as exc:
        name.close()
        if exc.errno == errno.EADDRINUSE:
            raise in_use from None
        raise JournalUnavailable(f"journal {path}: {exc.strerror}") from None
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        name.close()
        raise JournalUnavailable(f"journal {path}: {exc.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        name.close()
        raise in_use from None
    return _Ownership(fd, name)


def _check_file(conn: sqlite3.Connection, path: Path, known_migrations: Sequence[str]) -> None:
    """Refuse a damaged, foreign or newer file before anything is written to it.

    Raises:
        JournalUnavailable: With one line naming the file and the reason.
    """
    try:
        problems = [row[0] for row in conn.execute("PRAGMA quick_check")]
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        applied: list[str] = []
        if "_sqlite_migrations" in tables:
            applied = [
                row[0]
                for row in conn.execute(
                    "SELECT name FROM _sqlite_migrations WHERE migration_set = 'curb-runner'"
                )
            ]
    except sqlite3.DatabaseError as exc:
        raise JournalUnavailable(f"journal {path} cannot be read: {exc}") from None
    if problems != ["ok"]:
        raise JournalUnavailable(
            f"journal {path} is damaged (PRAGMA quick_check: {problems[0]}); restore it from a copy"
            " or start with another --journal"
        )
    if tables and not applied:
        raise JournalUnavailable(f"{path} is not a runner journal (an SQLite file of something else)")
    newer = [name for name in applied if name not in known_migrations]
    if newer:
        raise JournalUnavailable(
            f"journal {path} was written by a newer runner (migration {newer[0]} is unknown to this one)"
        )


def _open_writer(path: Path) -> sqlite3.Connection:
    """The write connection of an owned journal file, checked, then prepared and migrated."""
    from migrations import NAMES

    conn = _connect(path, prepare=False)
    try:
        _check_file(conn, path, NAMES)
        try:
            _prepare_connection(conn)
            migrate(conn)
        except sqlite3.Error as exc:
            raise JournalUnavailable(f"journal {path} cannot be opened for writing: {exc}") from None
    except BaseException:
        conn.close()
        raise
    return conn


def migrate(conn: sqlite3.Connection) -> None:
    """Apply the pending migrations, each in its own transaction."""
    # Imported here: only a writer migrates, and sqlite-utils (which loads numpy when it
    # can) is a tenth of a second that `runner replay` need not pay.
    from sqlite_utils import Database

    from migrations import MIGRATIONS

    MIGRATIONS.apply(Database(conn))


def rollback(conn: sqlite3.Connection) -> None:
    """Roll back what is left of a failed transaction, keeping the error that failed it.

    SQLite rolls back by itself on some errors (a full disk); a ROLLBACK then fails with
    "no transaction is active", which must not replace the real cause.
    """
    if conn.in_transaction:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")


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


def _open_named(conn: sqlite3.Connection, cls: str, name: str, exclude: Sequence[str]) -> list[Record]:
    rows = conn.execute(
        "SELECT envelope, producer, seq, class, at, body FROM records"
        " WHERE class = ? AND body ->> '$.name' = ?"
        " AND producer IN (SELECT producer FROM producers WHERE closed = 0)"
        " ORDER BY envelope",
        (cls, name),
    )
    return [Record.from_row(row) for row in rows if row[1] not in exclude]


def _no_default(value: Any) -> Any:
    raise TypeError(f"{type(value).__name__} is not JSON")


# What json.dumps(value, separators=(",", ":"), allow_nan=False) writes, without building an
# encoder per call (half the cost of an append's encoding). NaN and infinities are refused:
# SQLite's JSON functions, which build the stream's lines from the file, would reject them.
_encode_chunks = c_make_encoder(
    None, _no_default, encode_basestring_ascii, None, ":", ",", False, False, False
)


def _encode(value: Any) -> str:
    return "".join(_encode_chunks(value, 0))


# A string as SQLite's json_object() writes it: non-ASCII characters as they are.
_quote = encode_basestring


class ReaderPool:
    """Read-only connections, one per worker thread at a time.

    Each read runs in a thread on a free connection and holds it (and any read
    transaction) only for that one call: nobody waits inside a transaction.
    """

    def __init__(self, connections: list[sqlite3.Connection]) -> None:
        self.connections = connections
        self._free = list(connections)
        self._slots = trio.Semaphore(len(connections))

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(conn, *args)`` on a free connection, in a worker thread."""
        async with self._slots:

            def run() -> T:
                conn = self._free.pop()
                try:
                    return fn(conn, *args)
                finally:
                    self._free.append(conn)

            return await trio.to_thread.run_sync(run)


# What the writer needs of one record: producer, class, body, the body's JSON, stamp, closes.
# The JSON is encoded by the appender (so one bad body fails only its own append); for a
# stamped body it is everything but its type, which the writer puts first with seq and at.
_Row = tuple[str, str, Mapping[str, Any], str, bool, bool]


def _row(producer: str, cls: str, body: Mapping[str, Any], stamp: bool, closes: bool) -> _Row:
    """What the writer needs of one record, checked: a bad record fails only its own append.

    Raises:
        TypeError: ``body`` is not a JSON object, or holds a value JSON has no form for.
        ValueError: ``body`` holds NaN or an infinity, or a name is not Unicode text.
    """
    if not (producer.isascii() and cls.isascii()):
        # A lone surrogate would fail the whole transaction in SQLite: fail only this append.
        producer.encode()
        cls.encode()
    if stamp and "type" not in body:
        raise TypeError("a stamped record's body must have a type")
    text = "".join(_encode_chunks({k: v for k, v in body.items() if k != "type"} if stamp else body, 0))
    if text[0] != "{":
        raise TypeError("a record's body must be a JSON object")
    return (producer, cls, body, text, stamp, closes)


@attrs.define
class _Request:
    """One call of append or append_many, waiting for the commit of its records."""

    rows: tuple[_Row, ...]
    # The appender waiting; None once it stopped waiting (it was cancelled).
    task: trio.lowlevel.Task | None
    # Once committed: the Record of a request of one row, the list of them for several.
    result: Any = None

    def abandon(self, _: Any) -> trio.lowlevel.Abort:
        """The appender was cancelled: the records are still written, nobody is told."""
        self.task = None
        return trio.lowlevel.Abort.SUCCEEDED


def _results(batch: Sequence[_Request], records: list[Record]) -> Sequence[Any]:
    """Each request's result (see ``_Request.result``), in order."""
    if len(records) == len(batch):  # every request has one row: the usual batch
        return records
    results: list[Any] = []
    start = 0
    for request in batch:
        end = start + len(request.rows)
        results.append(records[start] if end - start == 1 else records[start:end])
        start = end
    return results


class _Woken(outcome.Outcome[None]):
    """What wakes an appender whose records committed: one shared object for all of them.

    The records go on the request (``_Request.result``): an ``outcome.Value`` made for
    each append, and spent by its one unwrap, cost about 7,000 instructions an append.
    """

    __slots__ = ()

    def unwrap(self) -> None:
        return None

    def send(self, gen: Generator[R, None, object]) -> R:
        return gen.send(None)

    async def asend(self, agen: AsyncGenerator[R, None]) -> R:
        return await agen.asend(None)


_WOKEN = _Woken()
# Looked up once: an append uses them every time.
_current_task = trio.lowlevel.current_task
_wait_task_rescheduled = trio.lowlevel.wait_task_rescheduled


# Put on the writer's queue after the last append: the thread commits what is before it and ends.
_STOP = object()


_CHUNK = 256  # rows per statement at most: 1,281 parameters, well under SQLite's limit


def _chunks(rows: int) -> Iterator[tuple[int, int]]:
    """``(start, end)`` of each statement's rows.

    Up to 64 rows go in one statement of their own size, more in multiples of 32: a batch
    takes one or two statements, and there are at most 70 distinct ones to prepare.
    """
    start = 0
    while start < rows:
        size = min(rows - start, _CHUNK)
        if size > 64:
            size -= size % 32
        yield start, start + size
        start += size


# Parameters go by column: the statement takes its values column after column, so they are
# handed over as a few concatenated columns rather than a tuple per row.
@functools.cache
def _insert_sql(rows: int) -> str:
    """?1 is the time; then the envelopes, producers, seqs, classes and bodies, ``rows`` of each."""
    values = ",".join(
        f"(?{2 + i}, ?{2 + rows + i}, ?{2 + 2 * rows + i}, ?{2 + 3 * rows + i}, ?1, ?{2 + 4 * rows + i})"
        for i in range(rows)
    )
    return f"INSERT INTO records (envelope, producer, seq, class, at, body) VALUES {values}"


@functools.cache
def _upsert_producers_sql(rows: int) -> str:
    """The producers a batch touched, then their last seq in it."""
    values = ",".join(f"(?{1 + i}, ?{1 + rows + i})" for i in range(rows))
    return (
        f"INSERT INTO producers (producer, last_seq) VALUES {values}"
        # A record after a closing one opens its producer again (a session id used for a new call).
        " ON CONFLICT (producer) DO UPDATE SET last_seq = excluded.last_seq, closed = 0"
    )


_CLOSE_PRODUCERS = "UPDATE producers SET closed = 1 WHERE producer IN (SELECT value FROM json_each(?))"

# The closed producers whose last record the retention pass is about to prune: once it is gone,
# all of theirs are (a producer's seqs rise with its envelopes), and the journal forgets them.
_FORGET_PRODUCERS = (
    "DELETE FROM producers WHERE producer IN (SELECT r.producer FROM records AS r"
    " JOIN producers AS p ON p.producer = r.producer AND p.last_seq = r.seq"
    " WHERE r.envelope <= ?1 AND p.closed = 1) RETURNING producer"
)


def _closers(producers: Sequence[str], closes: Sequence[bool]) -> list[str]:
    """The producers whose last record in the batch closes them."""
    last = dict(zip(producers, closes, strict=True))
    return [producer for producer, closed in last.items() if closed]


class _Writer:
    """The one connection that writes. Used only from the writer thread."""

    def __init__(
        self,
        conn: sqlite3.Connection,
        retention_records: int,
        *,
        path: Path,
        identity: tuple[int, int],
        fd: int,
    ) -> None:
        self.conn = conn
        self.retention_records = retention_records
        self.head = _head(conn)
        self.seqs: dict[str, int] = {}
        self.path = path
        self.identity = identity
        self._fd = fd
        self.lost: str | None = None
        """Why nothing more is written: the journal file was deleted or replaced under the runner."""

    def _check_file(self) -> None:
        """Refuse to write once the path no longer names the file this runner owns.

        Records written to a deleted file vanish when the runner stops: acknowledging them
        would be a lie. Checked before every transaction (one ``stat``, microseconds).

        Raises:
            JournalWriteFailed: The file was deleted or replaced; every later write fails too.
        """
        if self.lost is None:
            gone = file_gone(self.path, self.identity)
            if gone is None:
                return
            with contextlib.suppress(sqlite3.Error):
                # Everything into the (deleted) file itself, so one copy of it holds every record.
                self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            self.lost = (
                f"the journal file {self.path} was {gone} while this runner ran, so nothing more is"
                f" written; its records can be copied from /proc/{os.getpid()}/fd/{self._fd} until"
                " this runner stops"
            )
        raise JournalWriteFailed(self.lost)

    def _stored_seq(self, producer: str) -> int:
        """The last seq the file holds for a producer this writer has not written yet (0 if none)."""
        row = self.conn.execute("SELECT last_seq FROM producers WHERE producer = ?", (producer,)).fetchone()
        return row[0] if row else 0

    def _next_seqs(self, producers: Sequence[str]) -> tuple[list[int], dict[str, int]]:
        """The seq of each record, and each producer's last seq in the batch."""
        known = self.seqs
        try:
            # Usually every producer has one record in the batch and has written before.
            seqs = list(map(operator.add, map(known.__getitem__, producers), repeat(1)))
            last = dict(zip(producers, seqs, strict=True))
            if len(last) == len(seqs):
                return seqs, last
        except KeyError:
            pass
        last = {}
        seqs = []
        for producer in producers:
            seq = last[producer] = (
                last.get(producer) or known.get(producer) or self._stored_seq(producer)
            ) + 1
            seqs.append(seq)
        return seqs, last

    def write(self, batch: Sequence[_Request]) -> tuple[list[Record], _Lines]:
        """Commit ``batch`` as one transaction.

        Returns:
            Its records, and their stream lines (rendered when first read).
        """
        at = now_ms()
        # The batch as columns, from which the rows and the Records are built by map and zip
        # with no Python per record; the stream lines wait for a reader (_Lines).
        rows = zip(*chain.from_iterable(map(_rows_of, batch)), strict=True)
        producers, classes, given_bodies, given_texts, stamps, closes = rows
        seqs, last = self._next_seqs(producers)
        bodies, texts = _stamped(given_bodies, given_texts, stamps, seqs, at)
        first = self.head + 1
        envelopes = range(first, first + len(seqs))
        records = list(
            map(
                _new_record,
                repeat(Record),
                zip(envelopes, producers, seqs, classes, repeat(at), bodies, strict=False),  # repeat: endless
            )
        )
        self._check_file()
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            # Few statements, each stepping through many rows: the GIL is released once per
            # statement rather than once per row, so the writer seldom waits for the loop.
            for start, end in _chunks(len(seqs)):
                conn.execute(
                    _insert_sql(end - start),
                    [
                        at,
                        *envelopes[start:end],
                        *producers[start:end],
                        *seqs[start:end],
                        *classes[start:end],
                        *texts[start:end],
                    ],
                )
            touched, lasts = list(last), list(last.values())
            for start, end in _chunks(len(touched)):
                conn.execute(_upsert_producers_sql(end - start), [*touched[start:end], *lasts[start:end]])
            if True in closes:
                conn.execute(_CLOSE_PRODUCERS, (_encode(_closers(producers, closes)),))
            cut = envelopes[-1] - self.retention_records
            forgotten = conn.execute(_FORGET_PRODUCERS, (cut,)).fetchall() if cut > 0 else ()
            conn.execute("DELETE FROM records WHERE envelope <= ?", (cut,))
            conn.execute("COMMIT")
        except BaseException:
            rollback(conn)
            raise
        self.head = envelopes[-1]
        self.seqs.update(last)
        for (producer,) in forgotten:
            self.seqs.pop(producer, None)
        size = sum(map(len, texts)) + _LINE_OVERHEAD * len(seqs)
        return records, _Lines(first, at, (producers, seqs, classes, texts), size)


_rows_of = operator.attrgetter("rows")
# A Record from its six values without a Python-level __init__ (NamedTuple's takes three times as long).
_new_record = tuple.__new__


def _stamped(
    bodies: Sequence[Mapping[str, Any]],
    texts: Sequence[str],
    stamps: Sequence[bool],
    seqs: list[int],
    at: int,
) -> tuple[list[Mapping[str, Any]], list[str]]:
    """The bodies and their JSON with ``seq`` and ``at`` put in after the type, where stamped.

    Call records repeat their seq and at inside the body (the seed's host record).
    """
    bodies, texts = list(bodies), list(texts)
    for i in compress(range(len(seqs)), stamps):
        body, seq, text = bodies[i], seqs[i], texts[i]
        bodies[i] = {"type": body["type"], "seq": seq, "at": at, **body}
        head = f'{{"type":{_encode(body["type"])},"seq":{seq},"at":{at}'
        texts[i] = head + ("," + text[1:] if len(text) > 2 else "}")
    return bodies, texts


class _Quoted(dict[str, str]):
    """Producer and class names as JSON strings, each quoted once (a producer writes many records)."""

    LIMIT = 65_536  # names kept at most: a runner makes a producer per call

    def __missing__(self, name: str) -> str:
        if len(self) >= self.LIMIT:
            self.clear()
        quoted = self[name] = _quote(name)
        return quoted


# A line's length beyond its body's JSON, about: for the window's bound on its size.
_LINE_OVERHEAD = 96


class _Lines:
    """The stream lines of one commit, rendered when a follower first reads them.

    Rendered once for every follower, and never for a commit nobody reads: from what the
    commit inserted (its first envelope, its time, and the producers, seqs, classes and
    bodies' JSON of its records), exactly as SQLite's ``_LINE_SQL`` renders them from the file.
    """

    __slots__ = ("_columns", "_lines", "at", "first", "size")

    def __init__(
        self,
        first: int,
        at: int,
        columns: tuple[Sequence[Any], ...],
        size: int,
        lines: list[str] | None = None,
    ) -> None:
        self.first = first
        self.at = at
        self._columns = columns
        self._lines = lines
        self.size = size
        """About the lines' total length."""

    def __len__(self) -> int:
        return len(self._lines if self._lines is not None else self._columns[0])

    def render(self, quoted: _Quoted) -> list[str]:
        """The lines, rendered now if they were not yet."""
        if self._lines is None:
            at_body = f',"at":{self.at},"body":'
            self._lines = [
                f'{{"envelope":{envelope},"producer":{quoted[producer]},"seq":{seq},'
                f'"class":{quoted[cls]}{at_body}{text}}}'
                for envelope, producer, seq, cls, text in zip(count(self.first), *self._columns, strict=False)
            ]
            self._columns = ()
        return self._lines

    def after(self, gone: int) -> _Lines:
        """The lines after the first ``gone``."""
        size = self.size - self.size * gone // len(self)
        if self._lines is not None:
            return _Lines(self.first + gone, self.at, (), size, self._lines[gone:])
        return _Lines(self.first + gone, self.at, tuple(column[gone:] for column in self._columns), size)


class _RecentLines:
    """The newest stream lines, in memory, so followers near the head need no SQL.

    Kept as one chunk per commit (its first envelope, its lines), so that a commit
    costs the window the same small work however many records it holds. Holds at
    most ``max_lines`` lines, so never a record the file has pruned, and about
    ``max_bytes`` of them (the newest commit is kept whatever its size).
    """

    def __init__(self, max_lines: int, max_bytes: int) -> None:
        self.max_lines = max_lines
        self.max_bytes = max_bytes
        self._chunks: collections.deque[tuple[int, _Lines]] = collections.deque()
        self._lines = 0
        self._bytes = 0
        self._quoted = _Quoted()

    def add(self, first: int, lines: _Lines) -> None:
        """Keep the lines of envelopes ``first``, ``first + 1``, ..."""
        chunks = self._chunks
        chunks.append((first, lines))
        self._lines += len(lines)
        self._bytes += lines.size
        while len(chunks) > 1 and self._bytes > self.max_bytes:
            _, old = chunks.popleft()
            self._lines -= len(old)
            self._bytes -= old.size
        while self._lines > self.max_lines:
            first, old = chunks.popleft()
            excess = self._lines - self.max_lines
            self._lines -= min(excess, len(old))
            self._bytes -= old.size
            if excess < len(old):  # only part of the oldest commit goes
                rest = old.after(excess)
                chunks.appendleft((first + excess, rest))
                self._bytes += rest.size

    def get(self, after: int, limit: int) -> list[tuple[int, str]] | None:
        """Up to ``limit`` ``(envelope, line)`` pairs after ``after``; None if they start before the window."""
        chunks = self._chunks
        if not chunks or chunks[0][0] > after + 1:
            return None
        # Followers are mostly near the head: look from the newest commit back.
        i = len(chunks) - 1
        while chunks[i][0] > after + 1:
            i -= 1
        found: list[tuple[int, str]] = []
        start = after + 1 - chunks[i][0]
        while i < len(chunks) and len(found) < limit:
            first, lines = chunks[i]
            part = lines.render(self._quoted)[start : start + limit - len(found)]
            found.extend(zip(range(first + start, first + start + len(part)), part, strict=True))
            start = 0
            i += 1
        return found


class _HandOver(trio.abc.Instrument):
    """Hands a journal's appends to its writer thread at the end of each scheduler pass.

    The appends made in one pass (say, by the tasks a commit just woke) go to the thread
    together, and it is woken once for them: woken by the first, it would wait for the GIL
    while the others are being made, or take them one at a time.
    """

    def __init__(self, hand_over: Callable[[], None]) -> None:
        self._hand_over = hand_over

    def before_io_wait(self, timeout: float) -> None:
        self._hand_over()


class Journal:
    """The runner's journal. Open it with :func:`open_journal`.

    Appends from any task; one writer thread commits them in groups. Readers run
    short read transactions on a small pool of connections and wait for new records
    outside any transaction, so checkpoints are never starved.
    """

    def __init__(self, path: Path, writer: _Writer, readers: list[sqlite3.Connection]) -> None:
        self.path = path
        self._writer = writer
        self._readers = ReaderPool(readers)
        # Appends made during one pass of the Trio scheduler gather here, and go to the writer
        # thread's queue together once the pass is over (see _hand_over).
        self._gathering: list[_Request] = []
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._head = writer.head
        self.commits = 0
        """Transactions committed since the journal opened (each one fsync)."""
        self.on_commit: Callable[[int, float], None] | None = None
        """Told of each commit: its record count and the seconds it took (the runner's metrics)."""
        self._changed = trio.Event()
        self._stopped = trio.Event()
        self._recent = _RecentLines(min(writer.retention_records, _RECENT_LINES), _RECENT_BYTES)
        self._closed = False
        self.write_error: str | None = None
        """Why the last transaction failed, until one commits again."""

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

        Once appended, the record is written whether or not the caller is cancelled; a
        cancelled appender just does not learn how it fared.

        Args:
            producer: ``runner`` or a session id.
            cls: The record class, for example ``lifecycle`` or ``conversation``.
            body: A JSON object.
            stamp: Put the record's ``seq`` and ``at`` into the body, after its ``type``.
            closes: This is the producer's terminal record (see :meth:`open_producers`).

        Raises:
            JournalClosed: The journal is shutting down.
            TypeError: ``body`` is not a JSON object, or holds a value JSON has no form for.
            ValueError: ``body`` holds NaN or an infinity, or ``producer`` or ``cls`` is not
                Unicode text (a lone surrogate).
            JournalWriteFailed: The transaction this record was in failed (so did the others in it).
        """
        if self._closed:
            await trio.lowlevel.checkpoint()
            raise JournalClosed("the journal is closed")
        request = _Request((_row(producer, cls, body, stamp, closes),), _current_task())
        self._gathering.append(request)
        await _wait_task_rescheduled(request.abandon)
        record: Record = request.result
        return record

    async def append_many(self, entries: Sequence[Entry]) -> list[Record]:
        """Write several records in one transaction and return them, in order, once durable.

        For a caller that has several records at once: they commit together (all or none)
        with one fsync, and the caller waits once, where appending them one by one waits
        for a commit each. Records of other appenders may come between them; each
        producer's seq stays gapless. Cancellation is as for :meth:`append`.

        Raises:
            JournalClosed: The journal is shutting down.
            TypeError, ValueError: An entry's body or name, as for :meth:`append`; then
                none of them is written.
            JournalWriteFailed: The transaction failed; none of them was written.
        """
        if self._closed:
            await trio.lowlevel.checkpoint()
            raise JournalClosed("the journal is closed")
        rows = tuple(_row(e.producer, e.cls, e.body, e.stamp, e.closes) for e in entries)
        if not rows:
            await trio.lowlevel.checkpoint()
            return []
        request = _Request(rows, trio.lowlevel.current_task())
        self._gathering.append(request)
        await trio.lowlevel.wait_task_rescheduled(request.abandon)
        return [request.result] if len(rows) == 1 else request.result

    async def serve_writer(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the writer thread until the journal closes.

        Cancelled, it closes the journal and still waits for the thread to commit what
        was queued, so every appender learns how its record fared.
        """
        thread = threading.Thread(
            target=self._write_until_stopped,
            args=(trio.lowlevel.current_trio_token(),),
            name=f"journal writer ({self.path.name})",
            daemon=True,
        )
        thread.start()
        hand_over = _HandOver(self._hand_over)
        trio.lowlevel.add_instrument(hand_over)
        task_status.started()
        try:
            await self._stopped.wait()
        finally:
            self.close_nowait()
            with trio.CancelScope(shield=True):
                await self._stopped.wait()
                await trio.to_thread.run_sync(thread.join)
            trio.lowlevel.remove_instrument(hand_over)

    def _hand_over(self) -> None:
        """Queue what was gathered for the writer thread (see :class:`_HandOver`)."""
        if self._gathering:
            gathered, self._gathering = self._gathering, []
            self._queue.put(gathered)

    def _write_until_stopped(self, token: trio.lowlevel.TrioToken) -> None:
        """The writer thread: commit whatever is queued, one transaction at a time."""
        try:
            stop = False
            while not stop:
                item = self._queue.get()
                if item is _STOP:
                    break
                batch = list(item)
                # Everything queued now goes in this batch: one transaction, one fsync.
                stop = self._take_queued(batch)
                began = time.perf_counter()
                try:
                    result: outcome.Outcome[Any] = outcome.Value(self._writer.write(batch))
                except sqlite3.Error as exc:
                    failed = JournalWriteFailed(str(exc))
                    failed.__cause__ = exc
                    result = outcome.Error(failed)
                except Exception as exc:  # noqa: BLE001 - any failure of a write goes back to its appenders
                    result = outcome.Error(exc)
                token.run_sync_soon(self._committed, batch, result, time.perf_counter() - began)
        finally:
            # Run after every _committed above (run_sync_soon keeps order).
            token.run_sync_soon(self._writer_stopped)

    def _take_queued(self, into: list[_Request]) -> bool:
        """Move the appends queued for the writer into ``into``; True once the stop was among them."""
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return False
            if item is _STOP:
                return True
            into.extend(item)

    def _committed(self, batch: list[_Request], result: outcome.Outcome[Any], seconds: float = 0.0) -> None:
        """In the Trio thread, once a batch committed (or failed): wake followers, then appenders."""
        if isinstance(result, outcome.Error):
            if self.write_error is None:
                log.error("journal %s: a write failed: %s", self.path, result.error)
            self.write_error = str(result.error)
            # An outcome is unwrapped once, and an exception raised in several tasks would
            # gather all their tracebacks: each appender gets its own copy.
            for request in batch:
                if request.task is not None:
                    trio.lowlevel.reschedule(request.task, outcome.Error(copy.copy(result.error)))
            return
        records, lines = result.unwrap()
        if self.write_error is not None:
            log.warning("journal %s writes again (after: %s)", self.path, self.write_error)
            self.write_error = None
        # Followers read the newest lines from memory: one SQL read per commit, not per follower.
        self._recent.add(records[0].envelope, lines)
        self._head = records[-1].envelope
        self.commits += 1
        if self.on_commit is not None:
            self.on_commit(len(records), seconds)
        self._changed.set()
        self._changed = trio.Event()
        reschedule = trio.lowlevel.reschedule
        for request, got in zip(batch, _results(batch, records), strict=True):
            request.result = got
            if request.task is not None:
                reschedule(request.task, _WOKEN)

    def _writer_stopped(self) -> None:
        # Nothing should be left, but a writer thread that died must not leave appenders waiting.
        self._closed = True
        left = self._gathering
        # Nothing is queued after the stop: close_nowait puts it last and refuses appends after it.
        self._take_queued(left)
        for pending in left:
            if pending.task is not None:
                trio.lowlevel.reschedule(
                    pending.task,
                    outcome.Error(JournalClosed("the journal closed before this record was written")),
                )
        self._gathering = []
        self._stopped.set()

    def close_nowait(self) -> None:
        """Take no more appends; the writer commits what is queued, then stops."""
        if not self._closed:
            self._closed = True
            self._hand_over()
            self._queue.put(_STOP)

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

        A hole inside the window (rows deleted from the file by hand, so retained records
        stand on both sides of it) is skipped: the reader sees the envelopes jump.

        Raises:
            CursorTooOld: The record right after ``after`` was pruned (``after`` > 0).
        """
        await trio.lowlevel.checkpoint()
        # No checkpoint between this and the slice it returns: a commit may evict old lines.
        lines = self._recent.get(after, limit)
        if lines is not None:
            return lines
        rows: list[tuple[int, str]] = await self._readers.run(_read_lines, after, limit)
        if rows and after > 0 and rows[0][0] != after + 1:
            # Pruning takes the oldest first, so a pruned record leaves nothing before the
            # first row found. Raising for a hole instead would end the stream at once, and
            # its reconnect, accepted by check_cursor, would end the same way, forever.
            window = await self.window()
            if window.oldest is None or window.oldest >= rows[0][0]:
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

    async def read_open_named(self, cls: str, name: str, *, exclude: Sequence[str] = ()) -> list[Record]:
        """The retained records of class ``cls`` whose body's ``name`` is ``name``, of open producers.

        For recovery: what a crash left unanswered in the calls it left open (one pass, in order).
        """
        return await self._readers.run(_open_named, cls, name, exclude)


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

    owner = _take_ownership(path)

    def connect() -> tuple[_Writer, list[sqlite3.Connection]]:
        conn = _open_writer(path)
        readers = [_connect(path, readonly=True) for _ in range(_READ_POOL)]
        writer = _Writer(conn, retention_records, path=path, identity=owner.identity, fd=owner.fd)
        return writer, readers

    try:
        writer, readers = await trio.to_thread.run_sync(connect)
    except BaseException:
        owner.release()
        raise
    journal = Journal(path, writer, readers)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(journal.serve_writer)
            try:
                yield journal
            finally:
                journal.close_nowait()
    finally:
        for conn in [*readers, writer.conn]:  # the writer last: it folds the WAL in
            conn.close()
        owner.release()  # last: it releases the ownership


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
