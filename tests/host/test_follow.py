"""runner.host's stream follower against real runner processes: restarts, kills, 410, gaps, silence."""

from __future__ import annotations

import json
import signal
import sqlite3
from pathlib import Path

import pytest
import trio

from journal import open_journal
from runner.host import (
    KNOWN_CLASSES,
    CursorTooOld,
    EventsCursor,
    FollowItem,
    HostMessage,
    JournalRecord,
    Lost,
    RunnerClient,
    SeqGap,
)
from runner.wire import decode, encode

from ..runner_process import read_stream, records, start_runner
from .helpers import TOKEN, Collector, collect, ended, free_port, journal_lines, start

MESSENGER = "tests.agents:messenger"


def records_of(items: list[FollowItem]) -> list[JournalRecord]:
    return [i for i in items if isinstance(i, JournalRecord)]


def started(items: list[FollowItem], producer: str) -> bool:
    return any(r.producer == producer and r.body.get("name") == "curb.started" for r in records_of(items))


@pytest.mark.slow
async def test_every_record_once_in_order_across_a_restart_and_a_kill(tmp_path: Path) -> None:
    journal, port = tmp_path / "j.db", free_port()
    fixed = ("--address", f"127.0.0.1:{port}", "--max-sessions", "4")
    collector = Collector()
    async with (
        RunnerClient(f"http://127.0.0.1:{port}", token=TOKEN) as client,
        client.follow_events(from_=0, max_backoff_s=0.3) as events,
        trio.open_nursery() as nursery,
    ):
        nursery.start_soon(collector.pump, events)
        async with start_runner(journal, *fixed) as runner:
            await client.start_call(start("c1"))
            await client.stop_call("c1")
            await collector.wait_for(lambda items: ended(items, "c1"))
            runner.signal(signal.SIGTERM)
            assert await runner.wait_exit() == 0
        async with start_runner(journal, *fixed) as runner:
            await client.start_call(start("c2"))
            await collector.wait_for(lambda items: started(items, "c2"))
            runner.kill()
            assert await runner.wait_exit() == -signal.SIGKILL
        async with start_runner(journal, *fixed) as runner:
            await client.start_call(start("c3"))
            await client.stop_call("c3")
            await collector.wait_for(lambda items: ended(items, "c3"))
            held = await journal_lines(
                runner,
                until=lambda rs: any(
                    r["producer"] == "c3" and r["body"].get("name") == "curb.ended" for r in rs
                ),
            )
        nursery.cancel_scope.cancel()
    items = collector.items
    got = records_of(items)
    assert got == items, "no gap and nothing lost"
    assert [encode(r) for r in got] == held
    assert [r.envelope for r in got] == list(range(1, len(got) + 1))
    # The kill's open call was closed by the next start, and the follower saw it.
    c2 = [r.body for r in got if r.producer == "c2"]
    assert c2[-1]["name"] == "curb.ended" and c2[-1]["payload"]["reason"] == "runner_crashed"
    assert [r.body["event"] for r in got if r.cls == "lifecycle"] == [
        "ready",
        "draining",
        "ended",
        "ready",
        "recovered",
        "ready",
    ]
    assert events.stats.connects >= 3 and events.stats.duplicates == 0


async def _many_host_records(client: RunnerClient, session_id: str, count: int) -> None:
    """Have the agent write ``count`` host records, and wait until they are all written."""
    keys = [f"k{n}" for n in range(count)]
    message = HostMessage(id=f"relay-{session_id}", name="relay", payload={"toHost": keys, "data": {}})
    assert (await client.send_message(session_id, message)).delivered
    # The agent's messages leave through its outbox after the answer.
    async with client.follow_events(from_=0, on_cursor_too_old="resync") as events:
        await collect(
            events, [], lambda items: any(r.body.get("name") == keys[-1] for r in records_of(items))
        )


@pytest.mark.slow
async def test_a_reader_out_of_retention_gets_410_or_resyncs_reporting_what_it_lost(tmp_path: Path) -> None:
    async with (
        start_runner(tmp_path / "j.db", "--retention", "20", agent=MESSENGER) as runner,
        RunnerClient(runner.base_url, token=TOKEN) as client,
    ):
        await client.start_call(start("c1", "loopback://x"))
        async with client.follow_events(from_=0) as events:
            await collect(events, [], lambda items: started(items, "c1"))
            saved = events.cursor
        # While the reader is away, the runner writes more than it keeps.
        await _many_host_records(client, "c1", 40)
        await client.stop_call("c1")
        held = await journal_lines(
            runner,
            until=lambda rs: any(r["producer"] == "c1" and r["body"].get("name") == "curb.ended" for r in rs),
        )
        oldest = held[0]["envelope"]
        assert oldest > saved.envelope + 1

        with pytest.raises(CursorTooOld) as too_old:
            async with client.follow_events(from_=saved) as events:
                await events.__anext__()
        assert (too_old.value.requested, too_old.value.oldest_retained) == (saved.envelope, oldest)

        async with client.follow_events(from_=saved, on_cursor_too_old="resync") as events:
            items = await collect(events, [], lambda items: ended(items, "c1"))
    assert items[0] == Lost(after=saved.envelope, before=oldest, reason="cursor_too_old")
    assert [encode(r) for r in items[1:]] == held


@pytest.mark.slow
async def test_a_record_deleted_under_the_reader_is_reported_as_a_gap(tmp_path: Path) -> None:
    journal = tmp_path / "j.db"
    async with (
        start_runner(journal, agent=MESSENGER) as runner,
        RunnerClient(runner.base_url, token=TOKEN) as client,
    ):
        await client.start_call(start("c1", "loopback://x"))
        await _many_host_records(client, "c1", 3)
        await client.stop_call("c1")
        runner.signal(signal.SIGTERM)
        assert await runner.wait_exit() == 0
    conn = sqlite3.connect(journal)
    with conn:
        envelope, seq = conn.execute(
            "SELECT envelope, seq FROM records WHERE producer = 'c1' AND json_extract(body, '$.name') = 'k1'"
        ).fetchone()
        conn.execute("DELETE FROM records WHERE envelope = ?", (envelope,))
    conn.close()
    async with (
        start_runner(journal, agent=MESSENGER) as runner,
        RunnerClient(runner.base_url, token=TOKEN) as client,
    ):
        async with client.follow_events(from_=0) as events:
            items = await collect(events, [], lambda items: ended(items, "c1"))
        # A cursor right before the hole: the stream goes on past it (it once ended at once,
        # empty, and its follower reconnected to the same cursor forever).
        async with client.follow_events(from_=envelope - 1, max_backoff_s=0.1) as before_hole:
            resumed = await collect(before_hole, [], lambda items: ended(items, "c1"))
        assert before_hole.stats.connects == 1
        raw = records(await read_stream(runner, f"from={envelope - 1}", until=bool))
    gap_at = items.index(Lost(after=envelope - 1, before=envelope + 1, reason="envelope_gap"))
    assert items[gap_at + 1] == SeqGap(producer="c1", after_seq=seq - 1, seq=seq + 1, envelope=envelope + 1)
    assert items[gap_at + 1].missing == 1
    after = items[gap_at + 2]
    assert isinstance(after, JournalRecord) and after.body["name"] == "k2"
    assert len(records_of(items)) == len(items) - 2
    # A follower that starts before the hole knows no seq yet: it reports the hole alone.
    assert resumed[0] == Lost(after=envelope - 1, before=envelope + 1, reason="envelope_gap")
    assert resumed[1:] == items[gap_at + 2 :]
    assert raw[0]["envelope"] == envelope + 1


@pytest.mark.slow
async def test_a_silent_stream_is_reconnected_and_pings_keep_it_alive(tmp_path: Path) -> None:
    async with (
        start_runner(tmp_path / "quiet.db", "--heartbeat-ms", "60000") as silent,
        start_runner(tmp_path / "pinging.db", "--heartbeat-ms", "100") as pinging,
        RunnerClient(silent.base_url, token=TOKEN) as client,
        RunnerClient(pinging.base_url, token=TOKEN) as other,
    ):
        collector = Collector()
        async with (
            client.follow_events(from_=0, silence_timeout_s=0.3) as events,
            trio.open_nursery() as nursery,
        ):
            nursery.start_soon(collector.pump, events)
            await collector.wait_for(lambda items: len(items) == 1)  # the ready record
            with trio.fail_after(10):
                while events.stats.silences < 2:
                    await trio.sleep(0.1)
            await client.start_call(start("c1"))
            await client.stop_call("c1")
            await collector.wait_for(lambda items: ended(items, "c1"))
            nursery.cancel_scope.cancel()
        items = collector.items
        envelopes = [r.envelope for r in records_of(items)]
        assert envelopes == list(range(1, len(envelopes) + 1)) and items == records_of(items)
        assert events.stats.connects >= 3

        async with other.follow_events(silence_timeout_s=1.0) as events:
            with trio.move_on_after(2.0):
                await events.__anext__()
        assert events.stats.silences == 0 and events.stats.pings >= 5 and events.stats.connects == 1


@pytest.mark.slow
async def test_a_saved_cursor_resumes_a_restarted_host_with_nothing_lost_or_repeated(tmp_path: Path) -> None:
    async with (
        start_runner(tmp_path / "j.db") as runner,
        RunnerClient(runner.base_url, token=TOKEN) as client,
    ):
        await client.start_call(start("c1"))
        await client.stop_call("c1")
        async with client.follow_events(from_=0) as events:
            first = await collect(events, [], lambda items: ended(items, "c1"))
            saved = json.dumps(encode(events.cursor))
        await client.start_call(start("c2"))
        await client.stop_call("c2")

        cursor = decode(EventsCursor, json.loads(saved))
        # c1 ended: its seq is forgotten (a later call under its id may start at seq 1).
        assert cursor.envelope == first[-1].envelope and "c1" not in cursor.seqs
        async with client.follow_events(from_=cursor) as events:
            rest = await collect(events, [], lambda items: ended(items, "c2"))
        held = await journal_lines(
            runner,
            until=lambda rs: any(r["producer"] == "c2" and r["body"]["name"] == "curb.ended" for r in rs),
        )
        assert [encode(r) for r in first + rest] == held

        # Seqs saved with the cursor drop a producer's repeats even from an older envelope.
        async with client.follow_events(from_=EventsCursor(envelope=0, seqs={"c1": 2})) as events:
            again = await collect(events, [], lambda items: ended(items, "c2"))
        assert [r.seq for r in records_of(again) if r.producer == "c1"] == [3]
        assert events.stats.duplicates == 2

        # A reader that asks for some classes counts the others it skipped.
        async with client.follow_events(from_=0, classes=("lifecycle",)) as events:
            ready = await events.__anext__()
            assert isinstance(ready, JournalRecord) and ready.body["event"] == "ready"
            with trio.move_on_after(0.5):
                await events.__anext__()
        assert events.stats.skipped == {"conversation": 6}


@pytest.mark.slow
async def test_a_session_id_used_again_once_its_records_were_pruned_starts_at_seq_1_and_is_followed(
    tmp_path: Path,
) -> None:
    async with (
        start_runner(tmp_path / "j.db", "--retention", "5") as runner,
        RunnerClient(runner.base_url, token=TOKEN) as client,
        client.follow_events(from_=0) as events,
    ):
        items: list[FollowItem] = []
        for number, session in enumerate(("again", "filler-1", "filler-2", "again"), start=1):
            await client.start_call(start(session))
            await client.stop_call(session)
            await collect(
                events,
                items,
                lambda items, n=number: (
                    sum(r.body.get("name") == "curb.ended" for r in records_of(items)) == n
                ),
            )
    again = [(r.seq, r.body["name"]) for r in records_of(items) if r.producer == "again"]
    # The first call's records left the window once it had ended: the id was forgotten, and the
    # follower (which forgets a producer's seq at its curb.ended) takes the new call's records.
    assert again == [(1, "curb.started"), (2, "curb.messages"), (3, "curb.ended")] * 2
    assert records_of(items) == items and events.stats.duplicates == 0


@pytest.mark.slow
async def test_a_class_the_protocol_does_not_name_is_skipped_and_counted_unless_asked_for(
    tmp_path: Path,
) -> None:
    # Older runners also wrote class `log`; a newer one may add others. Written to the file as
    # such a runner would have, then served by this one.
    journal = tmp_path / "j.db"
    async with open_journal(journal) as old:
        await old.append("runner", "log", {"line": "an older runner's diagnostics"})
        await old.append("runner", "metrics", {"calls": 3})
    async with (
        start_runner(journal) as runner,
        RunnerClient(runner.base_url, token=TOKEN) as client,
    ):
        async with client.follow_events(from_=0) as events:
            ready = await collect(events, [], lambda items: len(items) >= 1)
        (record,) = records_of(ready)
        assert (record.cls, record.body["event"]) == ("lifecycle", "ready")
        assert record.envelope == 3
        assert events.stats.skipped == {"log": 1, "metrics": 1}

        # A caller that knows a newer class asks for it; the rest are still skipped.
        async with client.follow_events(from_=0, classes={*KNOWN_CLASSES, "metrics"}) as events:
            got = await collect(events, [], lambda items: len(items) >= 2)
        assert [r.cls for r in records_of(got)] == ["metrics", "lifecycle"]
        assert events.stats.skipped == {"log": 1}
