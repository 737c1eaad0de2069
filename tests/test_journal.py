"""The journal on a real SQLite file: order, durability, retention, following."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import trio
import trio.testing

from journal import (
    CursorAhead,
    CursorTooOld,
    Entry,
    JournalClosed,
    JournalFile,
    JournalWriteFailed,
    Record,
    open_journal,
)


async def test_concurrent_appends_are_gapless_and_seq_is_per_producer(tmp_path: Path) -> None:
    async with open_journal(tmp_path / "j.db") as journal:
        async with trio.open_nursery() as nursery:
            for i in range(100):

                async def append(i: int = i) -> None:
                    for k in range(5):
                        await journal.append(f"p{i % 7}", "conversation", {"i": i, "k": k})

                nursery.start_soon(append)
        assert journal.head == 500
        got = await journal.read(0, 1000)
    assert [r.envelope for r in got] == list(range(1, 501))
    for producer in {r.producer for r in got}:
        seqs = [r.seq for r in got if r.producer == producer]
        assert seqs == list(range(1, len(seqs) + 1))


async def test_append_returns_only_once_committed(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    async with open_journal(path) as journal:
        record = await journal.append("runner", "lifecycle", {"event": "ready"})
        # Another connection (another process, as far as SQLite knows) sees it.
        other = sqlite3.connect(path)
        row = other.execute(
            "SELECT producer, seq, body FROM records WHERE envelope = ?", (record.envelope,)
        ).fetchone()
        other.close()
    assert row == ("runner", 1, '{"event":"ready"}')


async def test_seq_and_envelope_continue_across_reopen_and_pruning(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    async with open_journal(path, retention_records=3) as journal:
        for _ in range(5):
            await journal.append("a", "c", {})
        assert (await journal.window()).oldest == 3
    async with open_journal(path, retention_records=3) as journal:
        record = await journal.append("a", "c", {})
        window = await journal.window()
    assert (record.envelope, record.seq) == (6, 6)
    assert (window.oldest, window.head) == (4, 6)


async def test_retention_keeps_the_newest_records(tmp_path: Path) -> None:
    async with open_journal(tmp_path / "j.db", retention_records=10) as journal:
        for i in range(25):
            await journal.append("p", "c", {"i": i})
        got = await journal.read(0, 100)
    assert [r.body["i"] for r in got] == list(range(15, 25))


async def test_cursor_checks(tmp_path: Path) -> None:
    async with open_journal(tmp_path / "j.db", retention_records=5) as journal:
        for _ in range(10):
            await journal.append("p", "c", {})
        await journal.check_cursor(0)  # everything still held
        await journal.check_cursor(5)  # the record after it, 6, is the oldest
        await journal.check_cursor(10)  # at the head: follow from now
        with pytest.raises(CursorTooOld) as too_old:
            await journal.check_cursor(4)
        assert (too_old.value.requested, too_old.value.oldest_retained) == (4, 6)
        with pytest.raises(CursorAhead):
            await journal.check_cursor(11)
        with pytest.raises(CursorTooOld):
            await journal.read_lines(2)


async def test_a_follower_wakes_on_commit_without_polling(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    async with open_journal(tmp_path / "j.db") as journal:
        seen: list[int] = []

        async def follow() -> None:
            cursor = 0
            while len(seen) < 3:
                await journal.wait_past(cursor)
                rows = await journal.read_lines(cursor)
                seen.extend(envelope for envelope, _ in rows)
                cursor = seen[-1]

        async with trio.open_nursery() as nursery:
            nursery.start_soon(follow)
            await trio.sleep(3600)  # the follower waits; with the autojump clock, no poll could hide
            assert seen == []
            for _ in range(3):
                await journal.append("p", "c", {})
    assert seen == [1, 2, 3]


async def test_stream_lines_are_the_wire_records(tmp_path: Path) -> None:
    async with open_journal(tmp_path / "j.db") as journal:
        await journal.append(
            "call-1", "host", {"type": "host", "id": "a-1", "name": "x", "payload": {"q": "é"}}, stamp=True
        )
        ((envelope, line),) = await journal.read_lines(0)
    assert envelope == 1
    import json

    record = json.loads(line)
    assert list(record) == ["envelope", "producer", "seq", "class", "at", "body"]
    assert list(record["body"]) == ["type", "seq", "at", "id", "name", "payload"]
    assert record["body"]["seq"] == record["seq"] == 1
    assert record["body"]["at"] == record["at"]
    assert record["body"]["payload"] == {"q": "é"}


async def test_open_producers_are_those_without_a_closing_record(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    async with open_journal(path) as journal:
        await journal.append("a", "c", {})
        await journal.append("b", "c", {})
        await journal.append("b", "c", {"end": True}, closes=True)
        await journal.append("runner", "lifecycle", {})
    async with open_journal(path) as journal:
        assert await journal.open_producers(exclude=["runner"]) == ["a"]


async def test_a_producer_written_after_its_closing_record_is_open_again(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    async with open_journal(path) as journal:
        await journal.append("again", "c", {"call": 1}, closes=True)
        await journal.append("again", "c", {"call": 2})  # a new call under the same session id
        await journal.append_many(
            [Entry(producer="x", cls="c", body={}, closes=True), Entry(producer="x", cls="c", body={})]
        )
        await journal.append_many(
            [Entry(producer="y", cls="c", body={}), Entry(producer="y", cls="c", body={}, closes=True)]
        )
    async with open_journal(path) as journal:
        # A crash now leaves "again" and "x" open: recovery must close them.
        assert await journal.open_producers() == ["again", "x"]


def _producer_rows(path: Path) -> dict[str, tuple[int, int]]:
    conn = sqlite3.connect(path)
    try:
        return {p: (seq, closed) for p, seq, closed in conn.execute("SELECT * FROM producers")}
    finally:
        conn.close()


async def test_retention_forgets_a_closed_producer_once_all_its_records_are_pruned(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    async with open_journal(path, retention_records=4) as journal:
        await journal.append("ended", "c", {})
        await journal.append("ended", "c", {}, closes=True)
        await journal.append("open", "c", {})  # pruned, but its call goes on
        await journal.append("held", "c", {}, closes=True)  # closed, with a record still held
        for _ in range(3):
            await journal.append("runner", "lifecycle", {})
        assert (await journal.window()).oldest == 4
        assert _producer_rows(path) == {"open": (1, 0), "held": (1, 1), "runner": (3, 0)}
        # A new call under a forgotten id starts again at seq 1; the others' seqs go on.
        reused = await journal.append_many(
            [Entry(producer=p, cls="c", body={}) for p in ("ended", "held", "open")]
        )
        assert [(r.producer, r.seq) for r in reused] == [("ended", 1), ("held", 2), ("open", 2)]
    async with open_journal(path, retention_records=4) as journal:
        assert (await journal.append("ended", "c", {})).seq == 2  # forgotten in the file, not only in memory
        assert await journal.open_producers(exclude=["runner"]) == ["ended", "held", "open"]


async def test_journal_file_reads_beside_a_writer(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    async with open_journal(path) as journal:
        await journal.append("p", "c", {"n": 1})
        reader = JournalFile(path)
        assert [r.body for r in reader.read(0)] == [{"n": 1}]
        await journal.append("p", "c", {"n": 2})
        assert [r.body for r in reader.read(1)] == [{"n": 2}]
        reader.close()


async def test_lines_from_memory_and_from_the_file_are_identical(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    bodies = [
        {"type": "event", "text": 'café ☕ "q" \\ \n\t\u0001'},
        {"type": "host", "n": 1.5, "x": [1, None, True]},
    ]
    async with open_journal(path) as journal:
        for i, body in enumerate(bodies):
            await journal.append(f"call-é-{i}", "conversation", body, stamp=i == 0)
        hot = await journal.read_lines(0)  # the newest lines, from memory
        cold = JournalFile(path)
        try:
            assert cold.read_lines(0) == hot  # rendered by SQLite
        finally:
            cold.close()


async def test_a_body_that_is_not_json_fails_only_its_own_append(tmp_path: Path) -> None:
    async with open_journal(tmp_path / "j.db") as journal:
        good: list[int] = []

        async def append_good() -> None:
            good.append((await journal.append("p", "c", {"ok": True})).envelope)

        async with trio.open_nursery() as nursery:
            for _ in range(5):
                nursery.start_soon(append_good)
            with pytest.raises(TypeError):
                await journal.append("p", "c", {"bad": {1, 2}})
        assert sorted(good) == [1, 2, 3, 4, 5]


async def test_followers_miss_nothing_while_old_lines_are_evicted(tmp_path: Path) -> None:
    # More records than the in-memory window holds, written while followers read: every
    # line must reach every follower once, in order, whatever the commits evict meanwhile.
    total = 9_000
    async with open_journal(tmp_path / "j.db", retention_records=100_000) as journal:
        seen: list[list[int]] = [[] for _ in range(8)]

        async def follow(into: list[int]) -> None:
            cursor = 0
            while cursor < total:
                await journal.wait_past(cursor)
                rows = await journal.read_lines(cursor, 7)
                into.extend(envelope for envelope, _ in rows)
                cursor = rows[-1][0]

        async def write(n: int) -> None:
            for _ in range(n):
                await journal.append("p", "c", {})

        async with trio.open_nursery() as nursery:
            for into in seen:
                nursery.start_soon(follow, into)
            async with trio.open_nursery() as writers:
                for _ in range(30):
                    writers.start_soon(write, total // 30)
    for into in seen:
        assert into == list(range(1, total + 1))


async def test_the_memory_window_serves_exactly_what_the_file_holds(tmp_path: Path) -> None:
    # Commits of uneven sizes against a small retention: the window drops whole and partial
    # commits, and whatever it serves must match the file, line for line, from every cursor.
    path = tmp_path / "j.db"
    async with open_journal(path, retention_records=10) as journal:
        for size in (3, 1, 7, 2, 12, 1, 5):
            async with trio.open_nursery() as nursery:
                for k in range(size):
                    nursery.start_soon(journal.append, f"p{k}", "c", {"size": size, "k": k})
        head = journal.head
        assert head == 31
        cold = JournalFile(path)
        try:
            window = cold.window()
            assert (window.oldest, window.head) == (22, 31)
            for after in range(window.oldest - 1, head + 1):
                assert await journal.read_lines(after, 4) == cold.read_lines(after, 4)
            with pytest.raises(CursorTooOld):
                await journal.read_lines(window.oldest - 2)
        finally:
            cold.close()


async def test_a_cancelled_appender_still_gets_its_record_written(tmp_path: Path) -> None:
    async with open_journal(tmp_path / "j.db") as journal:
        with trio.CancelScope() as scope:
            scope.cancel()
            await journal.append("p", "c", {"n": 1})
        assert scope.cancelled_caught
        record = await journal.append("p", "c", {"n": 2})
        assert (record.envelope, record.seq) == (2, 2)
        assert [r.body for r in await journal.read(0)] == [{"n": 1}, {"n": 2}]


async def test_closing_commits_what_is_queued_then_refuses(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    got: list[int] = []
    async with trio.open_nursery() as nursery, open_journal(path) as journal:

        async def append(n: int) -> None:
            got.append((await journal.append("p", "c", {"n": n})).envelope)

        for n in range(20):
            nursery.start_soon(append, n)
        await trio.testing.wait_all_tasks_blocked()
        journal.close_nowait()
        with pytest.raises(JournalClosed):
            await journal.append("p", "c", {"late": True})
    assert sorted(got) == list(range(1, 21))
    cold = JournalFile(path)
    try:
        assert len(cold.read(0, 100)) == 20
    finally:
        cold.close()


async def test_a_failed_transaction_fails_its_appends_and_the_journal_goes_on(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    async with open_journal(path) as journal:
        await journal.append("p", "c", {"n": 1})
        # Another connection holds the write lock past the writer's busy timeout.
        blocker = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        blocker.execute("PRAGMA busy_timeout = 0")
        blocker.execute("BEGIN IMMEDIATE")
        journal._writer.conn.execute("PRAGMA busy_timeout = 50")
        failed: list[BaseException] = []

        async def append(n: int) -> None:
            with pytest.raises(JournalWriteFailed) as raised:
                await journal.append(f"p{n}", "c", {"n": n})
            failed.append(raised.value)

        async with trio.open_nursery() as nursery:
            for n in range(3):
                nursery.start_soon(append, n)
        # Appended in one pass, the three failed in one transaction, each with its own error.
        assert len({id(error) for error in failed}) == 3
        blocker.execute("ROLLBACK")
        blocker.close()
        record = await journal.append("p", "c", {"n": 3})
        # The failed records took neither an envelope nor a seq.
        assert (record.envelope, record.seq) == (2, 2)
        assert journal.head == 2


async def test_a_body_json_cannot_carry_is_refused(tmp_path: Path) -> None:
    async with open_journal(tmp_path / "j.db") as journal:
        with pytest.raises(ValueError):
            await journal.append("p", "c", {"x": float("nan")})
        with pytest.raises(TypeError):
            await journal.append("p", "c", ["not", "an", "object"])
        assert journal.head == 0


async def test_commits_counts_transactions(tmp_path: Path) -> None:
    async with open_journal(tmp_path / "j.db") as journal:
        await journal.append("p", "c", {})
        assert journal.commits == 1
        async with trio.open_nursery() as nursery:
            for _ in range(50):
                nursery.start_soon(journal.append, "p", "c", {})
        assert journal.head == 51
        # Fifty appenders that queued together share far fewer than fifty fsyncs.
        assert 2 <= journal.commits <= 10


async def test_append_many_commits_its_records_in_one_transaction_in_order(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    async with open_journal(path) as journal:
        await journal.append("a", "c", {"n": 0})
        commits = journal.commits
        entries = [
            Entry(producer="a", cls="c", body={"n": 1}),
            Entry(producer="b", cls="conversation", body={"type": "event", "name": "x"}, stamp=True),
            Entry(producer="a", cls="c", body={"n": 2}, closes=True),
        ]
        records = await journal.append_many(entries)
        assert journal.commits == commits + 1  # one fsync for the three
        assert [(r.envelope, r.producer, r.seq) for r in records] == [(2, "a", 2), (3, "b", 1), (4, "a", 3)]
        assert records[1].body == {"type": "event", "seq": 1, "at": records[1].at, "name": "x"}
        # What append_many returned is what the file holds.
        assert await journal.read(1) == records
        assert await journal.open_producers() == ["b"]
        assert await journal.append_many([]) == []
        assert journal.commits == commits + 1


async def test_append_many_beside_appends_keeps_every_producer_gapless(tmp_path: Path) -> None:
    async with open_journal(tmp_path / "j.db") as journal:
        got: list[list[Record]] = []

        async def many(k: int) -> None:
            entries = [Entry(producer=f"p{(k + i) % 3}", cls="c", body={"k": k, "i": i}) for i in range(4)]
            got.append(await journal.append_many(entries))

        async with trio.open_nursery() as nursery:
            for k in range(10):
                nursery.start_soon(many, k)
                nursery.start_soon(journal.append, f"p{k % 3}", "c", {"single": k})
        records = await journal.read(0, 100)
    assert [r.envelope for r in records] == list(range(1, 51))
    for producer in ("p0", "p1", "p2"):
        seqs = [r.seq for r in records if r.producer == producer]
        assert seqs == list(range(1, len(seqs) + 1))
    # Each call's records came back in the order given.
    for batch in got:
        assert [r.body["i"] for r in batch] == [0, 1, 2, 3]
        assert [r.envelope for r in batch] == sorted(r.envelope for r in batch)


async def test_append_many_with_one_bad_entry_writes_none_of_them(tmp_path: Path) -> None:
    async with open_journal(tmp_path / "j.db") as journal:
        good = Entry(producer="p", cls="c", body={"ok": True})
        with pytest.raises(ValueError):
            await journal.append_many([good, Entry(producer="p", cls="c", body={"x": float("inf")})])
        with pytest.raises(TypeError):
            await journal.append_many([good, Entry(producer="p", cls="c", body={"no": "type"}, stamp=True)])
        assert journal.head == 0
        assert await journal.read(0) == []


async def test_a_failed_append_many_writes_none_of_its_records(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    async with open_journal(path) as journal:
        blocker = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        blocker.execute("BEGIN IMMEDIATE")
        journal._writer.conn.execute("PRAGMA busy_timeout = 50")
        with pytest.raises(JournalWriteFailed):
            await journal.append_many([Entry(producer="p", cls="c", body={"n": n}) for n in range(3)])
        blocker.execute("ROLLBACK")
        blocker.close()
        records = await journal.append_many([Entry(producer="p", cls="c", body={"n": n}) for n in range(2)])
    assert [(r.envelope, r.seq) for r in records] == [(1, 1), (2, 2)]
