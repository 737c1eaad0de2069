"""App messages, host messages, ask_host and transfers: the seed's "App messages", "Host side"
and "Transfer on your own host".

The host side runs against a real ``runner serve`` process (``tests.agents:messenger``): every
answer is checked against ``runner/protocol.schema.json`` and every effect is read where a host
reads it, on the events stream. The client side (the caller's app) needs the caller in this
process: those tests serve the runner in-process (``tests/inprocess.py``), still over HTTP.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from runner.providers.espeak import EspeakTTS
from runner.transports import ClientRefusal
from runner.transports.loopback import LoopbackCaller

from . import agents
from .inprocess import (
    Follower,
    answer,
    call_start,
    conforms,
    ended,
    events_named,
    follow,
    host_records,
    of,
    open_runner,
    refused,
    turns,
)
from .runner_process import RunnerProcess, read_stream, start_runner
from .runner_process import records as stream_records

MESSENGER = "tests.agents:messenger"
KEEP_BYTES = 4096


@asynccontextmanager
async def messenger(
    tmp_path: Path, *extra: str, **options: Any
) -> AsyncIterator[tuple[RunnerProcess, httpx.AsyncClient]]:
    """A ``runner serve tests.agents:messenger`` process and a host client for it."""
    async with (
        start_runner(tmp_path / "j.db", *extra, agent=MESSENGER, **options) as runner,
        runner.client() as client,
    ):
        yield runner, client


async def place(client: httpx.AsyncClient, session_id: str, url: str = "loopback://x") -> None:
    answer(await client.post("/v1/sessions", json=call_start(session_id, url)), 202, "StartCallResponse")


async def stop(client: httpx.AsyncClient, session_id: str) -> None:
    assert (
        answer(await client.delete(f"/v1/sessions/{session_id}"), 200, "StopCallResponse")["stopped"] is True
    )


def message(id_: str, name: str, payload: Any = None, **extra: Any) -> dict[str, Any]:
    return {"id": id_, "name": name, "payload": {} if payload is None else payload, **extra}


async def send(client: httpx.AsyncClient, session_id: str, body: Any) -> httpx.Response:
    return await client.post(f"/v1/sessions/{session_id}/messages", json=body)


def delivered(response: httpx.Response, id_: str, was_delivered: bool = True) -> None:
    assert answer(response, 202, "HostMessageAccepted") == {"id": id_, "delivered": was_delivered}


def messages_of(records: list[dict[str, Any]], producer: str) -> list[dict[str, Any]]:
    """The outcome of each message (``held`` records, written as a starting call takes one, aside)."""
    return [m for m in events_named(records, producer, "curb.message") if m["outcome"] != "held"]


def held_of(records: list[dict[str, Any]], producer: str) -> list[str]:
    """The ids of the messages a starting call took and held, in order."""
    return [m["id"] for m in events_named(records, producer, "curb.message") if m["outcome"] == "held"]


def summary_of(records: list[dict[str, Any]], producer: str) -> dict[str, Any]:
    (summary,) = events_named(records, producer, "curb.messages")
    return summary


async def wait_ended(follower: Follower, producer: str) -> list[dict[str, Any]]:
    await follower.wait_for(lambda rs: ended(rs, producer))
    return of(follower.records, producer)


async def wait_host_record(follower: Follower, producer: str, name: str, count: int = 1) -> dict[str, Any]:
    found = await follower.wait_for(
        lambda rs: len(host_records(rs, producer, name)) >= count and host_records(rs, producer, name)
    )
    return found[count - 1]


def assert_closed_last(records: list[dict[str, Any]], producer: str) -> None:
    """The call's record ends with curb.ended, nothing after it, seqs gapless."""
    mine = of(records, producer)
    assert mine[-1]["body"].get("name") == "curb.ended", [r["body"].get("name", r["class"]) for r in mine]
    assert [r["seq"] for r in mine] == list(range(mine[0]["seq"], mine[0]["seq"] + len(mine)))


# -- Host to agent: delivery and idempotency -------------------------------------------------------


@pytest.mark.slow
async def test_a_message_is_delivered_once_by_id(tmp_path: Path) -> None:
    async with messenger(tmp_path) as (runner, client), follow(runner) as follower:
        await place(client, "c1")
        delivered(await send(client, "c1", message("m-1", "note", {"x": 1})), "m-1")
        delivered(await send(client, "c1", message("m-1", "note", {"x": 2})), "m-1", was_delivered=False)
        await stop(client, "c1")
        records = await wait_ended(follower, "c1")
    # The repeat ran no handler: one delivery, with the handler's reply.
    assert messages_of(records, "c1") == [
        {
            "from": "host",
            "key": "note",
            "id": "m-1",
            "payload": {"x": 1},
            "outcome": "delivered",
            "reply": {"seen": {"x": 1}},
        }
    ]


@pytest.mark.slow
async def test_each_refusal_leaves_its_id_free_for_a_corrected_retry(tmp_path: Path) -> None:
    async with messenger(tmp_path) as (runner, client), follow(runner) as follower:
        await place(client, "c1")

        # no_handler: nothing listens for the key from the host (claim-submitted is the client's).
        refused(await send(client, "c1", message("m-1", "nobody")), 422, "no_handler")
        refused(
            await send(client, "c1", message("m-1", "claim-submitted", {"claimId": "C-1"})), 422, "no_handler"
        )
        delivered(await send(client, "c1", message("m-1", "note", {"retry": True})), "m-1")

        # invalid_payload: the schema refused it, no handler ran; issues as [{path, message}].
        body = refused(
            await send(client, "c1", message("m-2", "lead", {"score": "high"})), 422, "invalid_payload"
        )
        assert [issue["path"] for issue in body["issues"]] == [["score"]]
        assert all(isinstance(issue["message"], str) and issue["message"] for issue in body["issues"])
        delivered(await send(client, "c1", message("m-2", "lead", {"score": 0.8})), "m-2")
        scored = await wait_host_record(follower, "c1", "lead.scored")
        assert scored["payload"] == {"score": 0.8}

        # handler_failed: the middle handler raised; the first and the last still ran.
        refused(
            await send(client, "c1", message("m-3", "flaky", {"attempt": 1, "fail": True})),
            422,
            "handler_failed",
        )
        assert (await wait_host_record(follower, "c1", "flaky.first"))["payload"] == {"attempt": 1}
        assert (await wait_host_record(follower, "c1", "flaky.last"))["payload"] == {"attempt": 1}
        delivered(await send(client, "c1", message("m-3", "flaky", {"attempt": 2})), "m-3")
        assert (await wait_host_record(follower, "c1", "flaky.last", 2))["payload"] == {"attempt": 2}

        await stop(client, "c1")
        records = await wait_ended(follower, "c1")
    assert [(m["id"], m["key"], m["outcome"]) for m in messages_of(records, "c1")] == [
        ("m-1", "nobody", "no_handler"),
        ("m-1", "claim-submitted", "no_handler"),
        ("m-1", "note", "delivered"),
        ("m-2", "lead", "invalid_payload"),
        ("m-2", "lead", "delivered"),
        ("m-3", "flaky", "handler_failed"),
        ("m-3", "flaky", "delivered"),
    ]
    # Only the invalid payload's handler never ran: one lead.scored, for the corrected retry.
    assert [h["payload"] for h in host_records(records, "c1", "lead.scored")] == [{"score": 0.8}]


@pytest.mark.slow
async def test_an_unknown_or_ended_call_is_session_not_found(tmp_path: Path) -> None:
    async with messenger(tmp_path) as (_, client):
        refused(await send(client, "nobody-here", message("m-1", "note")), 404, "session_not_found")
        await place(client, "c1")
        delivered(await send(client, "c1", message("m-1", "note")), "m-1")
        await stop(client, "c1")
        refused(await send(client, "c1", message("m-2", "note")), 404, "session_not_found")


@pytest.mark.slow
async def test_a_malformed_message_is_invalid_request(tmp_path: Path) -> None:
    cases: list[tuple[Any, list[Any] | None]] = [
        (message("x" * 129, "note"), ["id"]),
        (message("", "note"), ["id"]),
        (message("m-1", ""), ["name"]),
        (message("m-1", "n" * 257), ["name"]),
        (message("m-1", "note", [1, 2]), ["payload"]),
        (message("m-1", "note", "text"), ["payload"]),
        (message("m-1", "note", inReplyTo=""), ["inReplyTo"]),
        ({"id": "m-1", "name": "note"}, ["payload"]),
        ({"id": "m-1", "payload": {}}, ["name"]),
        ({"name": "note", "payload": {}}, ["id"]),
        ([message("m-1", "note")], None),
    ]
    async with messenger(tmp_path) as (_, client):
        await place(client, "c1")
        for body, path in cases:
            error = refused(await send(client, "c1", body), 400, "invalid_request")
            if path is not None:
                assert path in [issue["path"] for issue in error["issues"]], (body, error)
        not_json = await client.post(
            "/v1/sessions/c1/messages", content=b"{not json", headers={"content-type": "application/json"}
        )
        refused(not_json, 400, "invalid_request")
        # Python's json reads NaN and Infinity; JSON has neither, and the journal could not keep them.
        for constant in (b"NaN", b"Infinity", b"-Infinity"):
            content = b'{"id":"m-nan","name":"note","payload":{"x":' + constant + b"}}"
            not_json = await client.post(
                "/v1/sessions/c1/messages", content=content, headers={"content-type": "application/json"}
            )
            refused(not_json, 400, "invalid_request")
        # The limits are inclusive: 128 characters of id and 256 of name are a message.
        delivered(await send(client, "c1", message("i" * 128, "note")), "i" * 128)
        long_key = await send(client, "c1", message("m-2", "k" * 256))
        refused(long_key, 422, "no_handler")  # well formed: the agent just has no such key


@pytest.mark.slow
async def test_a_direct_join_runner_takes_no_host_messages_but_its_records_leave(tmp_path: Path) -> None:
    join = ("--url", "loopback://j", "--token", "t", "--session-id", "j1")
    async with (
        start_runner(tmp_path / "j.db", *join, command="join", agent="tests.agents:greets_host") as runner,
        runner.client() as client,
        follow(runner) as follower,
    ):
        joined = await wait_host_record(follower, "j1", "agent.joined")
        assert joined["payload"] == {"sessionId": "j1"} and joined["expectsReply"] is False
        refused(await send(client, "j1", message("m-1", "note")), 501, "runner_takes_no_calls")
        refused(await send(client, "j1", {"garbage": True}), 501, "runner_takes_no_calls")


# -- Held while starting ------------------------------------------------------------------------


@pytest.mark.slow
async def test_33_messages_to_a_starting_call(tmp_path: Path) -> None:
    async with messenger(tmp_path) as (runner, client), follow(runner) as follower:
        placed: list[httpx.Response] = []
        async with trio.open_nursery() as nursery:

            async def start_slow_call() -> None:
                placed.append(
                    await client.post("/v1/sessions", json=call_start("slow", "loopback://x?connect_ms=6000"))
                )

            nursery.start_soon(start_slow_call)
            with trio.fail_after(5):
                while (await client.get("/v1/sessions/slow")).status_code != 200:
                    await trio.sleep(0.01)
            answers = []
            for i in range(1, 34):
                name = "nobody" if i == 7 else "note"  # m-7 is refused once delivered
                answers.append(await send(client, "slow", message(f"m-{i}", name, {"i": i})))
            repeat = await send(client, "slow", message("m-1", "note", {"i": 1}))
            still = answer(await client.get("/v1/sessions/slow"), 200, "LiveCall")
            assert still["state"] == "starting", "the messages must reach the call while it starts"
        answer(placed[0], 202, "StartCallResponse")

        for i, response in enumerate(answers[:32], start=1):
            delivered(response, f"m-{i}")  # held, so already answered 202
        refused(answers[32], 409, "runner_at_capacity")
        delivered(repeat, "m-1", was_delivered=False)
        # The 33rd was not taken: retried once connected (and the held ones delivered), it is delivered.
        await follower.wait_for(lambda rs: len(messages_of(rs, "slow")) == 32)
        delivered(await send(client, "slow", message("m-33", "note", {"i": 33})), "m-33")
        await follower.wait_for(lambda rs: [m for m in messages_of(rs, "slow") if m["id"] == "m-33"])

        await stop(client, "slow")
        records = await wait_ended(follower, "slow")
    outcomes = [(m["id"], m["outcome"]) for m in messages_of(records, "slow")]
    assert outcomes == [(f"m-{i}", "no_handler" if i == 7 else "delivered") for i in range(1, 34)]
    assert [m["payload"] for m in messages_of(records, "slow")] == [{"i": i} for i in range(1, 34)]
    # Each held one was journaled as it was taken, before its 202 and before any delivery.
    names = [(m["id"], m["outcome"]) for m in events_named(records, "slow", "curb.message")]
    assert names[:32] == [(f"m-{i}", "held") for i in range(1, 33)]
    assert summary_of(records, "slow") == {
        "undeliveredToClient": {},
        "refusedQueuedHostMessages": 1,
        "undeliveredQueuedHostMessages": 0,
    }
    warnings = [line for line in runner.stderr if "m-7" in line and "no_handler" in line]
    assert len(warnings) == 1, runner.stderr[-20:]


@pytest.mark.slow
async def test_once_connected_a_message_is_not_refused_for_capacity(tmp_path: Path) -> None:
    async with messenger(tmp_path) as (runner, client), follow(runner) as follower:
        placed: list[httpx.Response] = []
        async with trio.open_nursery() as nursery:

            async def start_slow_call() -> None:
                placed.append(
                    await client.post("/v1/sessions", json=call_start("slow", "loopback://x?connect_ms=6000"))
                )

            nursery.start_soon(start_slow_call)
            with trio.fail_after(5):
                while (await client.get("/v1/sessions/slow")).status_code != 200:
                    await trio.sleep(0.01)
            # The first held message takes a while once delivered: its handler waits 2 s for the host.
            hold = {"key": "hold.on", "data": {}, "timeoutS": 2}
            delivered(await send(client, "slow", message("m-1", "ask", hold)), "m-1")
            for i in range(2, 33):
                delivered(await send(client, "slow", message(f"m-{i}", "note")), f"m-{i}")
            refused(await send(client, "slow", message("m-33", "note")), 409, "runner_at_capacity")
        answer(placed[0], 202, "StartCallResponse")
        await wait_host_record(follower, "slow", "hold.on")  # connected, and delivering the held ones
        # "Retry it once the call is connected": the call is connected now.
        delivered(await send(client, "slow", message("m-33", "note")), "m-33")


@pytest.mark.slow
async def test_a_call_stopped_while_its_held_messages_are_delivered_counts_them_all(tmp_path: Path) -> None:
    async with messenger(tmp_path) as (runner, client), follow(runner) as follower:
        placed: list[httpx.Response] = []
        async with trio.open_nursery() as nursery:

            async def start_slow_call() -> None:
                placed.append(
                    await client.post("/v1/sessions", json=call_start("slow", "loopback://x?connect_ms=6000"))
                )

            nursery.start_soon(start_slow_call)
            with trio.fail_after(5):
                while (await client.get("/v1/sessions/slow")).status_code != 200:
                    await trio.sleep(0.01)
            for i in range(1, 33):
                delivered(
                    await send(client, "slow", message(f"m-{i}", "nobody" if i == 32 else "note")), f"m-{i}"
                )
        answer(placed[0], 202, "StartCallResponse")
        await stop(client, "slow")  # at once: the held messages are still being delivered
        records = await wait_ended(follower, "slow")
    names = [r["body"].get("name") for r in records if r["class"] == "conversation"]
    # The summary is the agent's last word: no message is delivered after it, and it counts
    # every held message the record shows refused.
    assert names[-2:] == ["curb.messages", "curb.ended"], names
    # Every held message has one outcome: delivered, refused (counted), or undelivered (counted).
    outcomes = {m["id"]: m["outcome"] for m in messages_of(records, "slow")}
    assert sorted(outcomes) == sorted(held_of(records, "slow")) == sorted(f"m-{i}" for i in range(1, 33))
    assert len(messages_of(records, "slow")) == 32
    summary = summary_of(records, "slow")
    undelivered = [m for m in messages_of(records, "slow") if m["outcome"] == "undelivered"]
    refused_held = [
        m for m in messages_of(records, "slow") if m["outcome"] not in ("delivered", "undelivered")
    ]
    assert summary["refusedQueuedHostMessages"] == len(refused_held)
    assert summary["undeliveredQueuedHostMessages"] == len(undelivered)
    assert all(m["reason"] == "stopped_by_host" for m in undelivered), undelivered


async def _held_while_starting(
    client: httpx.AsyncClient, url: str, ids: list[str], then: Any
) -> httpx.Response:
    """Place a slow call at ``url``, send it ``ids`` while it starts (each answered 202), then ``then()``."""
    placed: list[httpx.Response] = []
    async with trio.open_nursery() as nursery:

        async def start_slow_call() -> None:
            placed.append(await client.post("/v1/sessions", json=call_start("slow", url)))

        nursery.start_soon(start_slow_call)
        with trio.fail_after(5):
            while (await client.get("/v1/sessions/slow")).status_code != 200:
                await trio.sleep(0.01)
        for id_ in ids:
            delivered(await send(client, "slow", message(id_, "note")), id_)
        assert answer(await client.get("/v1/sessions/slow"), 200, "LiveCall")["state"] == "starting"
        await then()
    return placed[0]


@pytest.mark.slow
async def test_messages_held_by_a_call_stopped_before_it_connected_are_recorded_undelivered(
    tmp_path: Path,
) -> None:
    async with messenger(tmp_path) as (runner, client), follow(runner) as follower:

        async def stop_it() -> None:
            await stop(client, "slow")

        await _held_while_starting(client, "loopback://x?connect_ms=1500", ["m-1", "m-2", "m-3"], stop_it)
        records = await wait_ended(follower, "slow")
    # Each 202 has its record, and the record says what became of the message.
    assert held_of(records, "slow") == ["m-1", "m-2", "m-3"]
    assert [(m["id"], m["outcome"], m["reason"]) for m in messages_of(records, "slow")] == [
        (f"m-{i}", "undelivered", "stopped_by_host") for i in range(1, 4)
    ]
    assert summary_of(records, "slow")["undeliveredQueuedHostMessages"] == 3
    assert_closed_last(records, "slow")


@pytest.mark.slow
async def test_messages_held_by_a_call_whose_join_fails_are_recorded_undelivered(tmp_path: Path) -> None:
    async with messenger(tmp_path) as (runner, client), follow(runner) as follower:

        async def nothing() -> None:
            pass

        placed = await _held_while_starting(
            client, "loopback://x?connect_ms=1000&fail=busy", ["m-1", "m-2"], nothing
        )
        refused(placed, 502, "start_failed")
        records = await wait_ended(follower, "slow")
    reason = "start_failed: loopback join refused: busy"
    assert held_of(records, "slow") == ["m-1", "m-2"]
    assert [(m["id"], m["outcome"], m["reason"]) for m in messages_of(records, "slow")] == [
        ("m-1", "undelivered", reason),
        ("m-2", "undelivered", reason),
    ]
    assert summary_of(records, "slow") == {
        "undeliveredToClient": {},
        "refusedQueuedHostMessages": 0,
        "undeliveredQueuedHostMessages": 2,
    }
    assert events_named(records, "slow", "curb.ended") == [{"reason": reason}]


@pytest.mark.slow
async def test_a_message_held_when_the_runner_is_killed_is_in_the_record(tmp_path: Path) -> None:
    journal = tmp_path / "j.db"
    async with start_runner(journal, agent=MESSENGER) as runner, runner.client() as client:

        async def start_slow_call() -> None:
            with pytest.raises(httpx.TransportError):  # the runner is killed while it starts
                await client.post("/v1/sessions", json=call_start("slow", "loopback://x?connect_ms=5000"))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(start_slow_call)
            with trio.fail_after(5):
                while (await client.get("/v1/sessions/slow")).status_code != 200:
                    await trio.sleep(0.01)
            delivered(await send(client, "slow", message("m-1", "note")), "m-1")
            runner.kill()
            await runner.wait_exit()
    async with start_runner(journal, agent=MESSENGER) as again:
        lines = stream_records(
            await read_stream(
                again, "from=0", until=lambda ls: [r["body"].get("event") for r in ls].count("ready") == 2
            )
        )
    # Answered 202, so journaled: the restart shows it held, then undelivered as the crash closed the call.
    assert held_of(lines, "slow") == ["m-1"]
    assert [(m["id"], m["outcome"], m["reason"]) for m in messages_of(lines, "slow")] == [
        ("m-1", "undelivered", "runner_crashed")
    ]
    names = [r["body"].get("name") for r in lines if r["producer"] == "slow"]
    assert names == ["curb.started", "curb.message", "curb.message", "curb.ended"], names
    assert events_named(lines, "slow", "curb.ended") == [{"reason": "runner_crashed"}]


# -- Ask and reply ------------------------------------------------------------------------------


@pytest.mark.slow
async def test_ask_host_round_trip_and_the_host_record_shape(tmp_path: Path) -> None:
    async with messenger(tmp_path) as (runner, client), follow(runner) as follower:
        await place(client, "c1")
        async with trio.open_nursery() as nursery:
            asked: list[httpx.Response] = []

            async def ask() -> None:
                body = message(
                    "m-1", "ask", {"key": "human.requested", "data": {"topic": "refund"}, "timeoutS": 10}
                )
                asked.append(await send(client, "c1", body))

            nursery.start_soon(ask)
            record = await follower.wait_for(
                lambda rs: [
                    r for r in of(rs, "c1") if r["class"] == "host" and r["body"]["name"] == "human.requested"
                ]
            )
            (line,) = record
            # No handler listens for human.answer: the reply resolves the ask by inReplyTo alone.
            reply = message("r-1", "human.answer", {"disposition": "allowed"}, inReplyTo=line["body"]["id"])
            delivered(await send(client, "c1", reply), "r-1")
        delivered(asked[0], "m-1")
        await stop(client, "c1")
        records = await wait_ended(follower, "c1")
    assert line["producer"] == "c1"
    assert line["body"] == {
        "type": "host",
        "seq": line["seq"],
        "at": line["at"],
        "id": line["body"]["id"],
        "name": "human.requested",
        "payload": {"topic": "refund"},
        "expectsReply": True,
    }
    conforms("HostRecordBody", line["body"])
    assert isinstance(line["body"]["id"], str) and line["body"]["id"]
    by_id = {m["id"]: m for m in messages_of(records, "c1")}
    assert by_id["r-1"]["outcome"] == "reply" and by_id["r-1"]["inReplyTo"] == line["body"]["id"]
    assert by_id["m-1"]["reply"] == {"outcome": "answered", "answer": {"disposition": "allowed"}}
    # Its seq is the call's own counter: between the records around it.
    seqs = [r["seq"] for r in of(records, "c1")]
    assert seqs == list(range(1, len(seqs) + 1))


@pytest.mark.slow
async def test_ask_host_times_out_and_a_late_reply_is_an_ordinary_message(tmp_path: Path) -> None:
    async with messenger(tmp_path) as (runner, client), follow(runner) as follower:
        await place(client, "c1")
        began = trio.current_time()
        body = message("m-1", "ask", {"key": "human.requested", "data": {"topic": "refund"}, "timeoutS": 0.5})
        delivered(await send(client, "c1", body), "m-1")
        assert trio.current_time() - began >= 0.5
        ask = await wait_host_record(follower, "c1", "human.requested")
        late = message("r-1", "human.answer", {"disposition": "allowed"}, inReplyTo=ask["id"])
        refused(await send(client, "c1", late), 422, "no_handler")  # nobody waits, nobody handles it
        late = message("r-1", "human.decision", {"disposition": "denied"}, inReplyTo=ask["id"])
        delivered(await send(client, "c1", late), "r-1")
        seen = await wait_host_record(follower, "c1", "decision.seen")
        assert seen["payload"] == {"disposition": "denied"}
        await stop(client, "c1")
        records = await wait_ended(follower, "c1")
    by_id = {(m["id"], m["outcome"]): m for m in messages_of(records, "c1")}
    assert by_id[("m-1", "delivered")]["reply"] == {"outcome": "timeout"}
    assert ("r-1", "no_handler") in by_id and ("r-1", "delivered") in by_id
    assert not [m for m in messages_of(records, "c1") if m["outcome"] == "reply"]


@pytest.mark.slow
async def test_ask_host_is_unavailable_once_the_call_ends(tmp_path: Path) -> None:
    async with messenger(tmp_path) as (runner, client), follow(runner) as follower:
        await place(client, "c1")
        asked: list[httpx.Response] = []
        async with trio.open_nursery() as nursery:

            async def ask() -> None:
                body = message("m-1", "ask", {"key": "human.requested", "data": {}, "timeoutS": 30})
                asked.append(await send(client, "c1", body))

            nursery.start_soon(ask)
            await wait_host_record(follower, "c1", "human.requested")
            with trio.fail_after(5):  # far less than the ask's 30 s
                await stop(client, "c1")
                while not asked:
                    await trio.sleep(0.01)
        delivered(asked[0], "m-1")
        records = await follower.wait_for(
            lambda rs: (
                ended(rs, "c1") and [m for m in messages_of(rs, "c1") if m["id"] == "m-1"] and of(rs, "c1")
            )
        )
    (outcome,) = [m for m in messages_of(records, "c1") if m["id"] == "m-1"]
    assert outcome["reply"] == {"outcome": "unavailable"}
    assert_closed_last(follower.records, "c1")


@pytest.mark.slow
async def test_two_calls_each_take_message_m_1(tmp_path: Path) -> None:
    async with messenger(tmp_path, "--max-sessions", "2") as (runner, client), follow(runner) as follower:
        await place(client, "c1")
        await place(client, "c2")
        delivered(await send(client, "c1", message("m-1", "note", {"to": "c1"})), "m-1")
        delivered(await send(client, "c2", message("m-1", "note", {"to": "c2"})), "m-1")
        delivered(await send(client, "c1", message("m-1", "note", {"to": "c1"})), "m-1", was_delivered=False)
        delivered(
            await send(client, "c2", message("m-2", "relay", {"toHost": ["only.c2"], "data": {"to": "c2"}})),
            "m-2",
        )
        await stop(client, "c1")
        await stop(client, "c2")
        await wait_ended(follower, "c1")
        await wait_ended(follower, "c2")
        records = follower.records
    assert [(m["id"], m["payload"]) for m in messages_of(records, "c1")] == [("m-1", {"to": "c1"})]
    assert [(m["id"], m["payload"]) for m in messages_of(records, "c2")] == [
        ("m-1", {"to": "c2"}),
        ("m-2", {"toHost": ["only.c2"], "data": {"to": "c2"}}),
    ]
    assert host_records(records, "c1") == [] and [h["name"] for h in host_records(records, "c2")] == [
        "only.c2"
    ]


# -- What the record keeps ---------------------------------------------------------------------------


@pytest.mark.slow
async def test_a_10_kib_payload_is_kept_as_its_first_4_kib(tmp_path: Path) -> None:
    data = {"blob": "x" * 10_240}
    payload = {"toHost": ["big.echo"], "data": data}
    payload_text = json.dumps(payload, separators=(",", ":"))
    data_text = json.dumps(data, separators=(",", ":"))
    body = '{"id":"big","name":"relay","payload":' + payload_text + "}"
    async with messenger(tmp_path) as (runner, client), follow(runner) as follower:
        await place(client, "c1")
        response = await client.post(
            "/v1/sessions/c1/messages", content=body.encode(), headers={"content-type": "application/json"}
        )
        delivered(response, "big")
        small = {"toHost": ["small.echo"], "data": {"blob": "y" * 100}}
        delivered(await send(client, "c1", message("small", "relay", small)), "small")
        echo = await wait_host_record(follower, "c1", "big.echo")
        small_echo = await wait_host_record(follower, "c1", "small.echo")
        await stop(client, "c1")
        records = await wait_ended(follower, "c1")
    kept = {m["id"]: m for m in messages_of(records, "c1")}
    assert kept["big"]["payload"] == payload_text[:KEEP_BYTES] and kept["big"]["truncated"] is True
    assert kept["big"]["reply"] == data_text[:KEEP_BYTES]
    assert echo["payload"] == data_text[:KEEP_BYTES] and echo["truncated"] is True
    conforms("HostRecordBody", echo)
    # At most 4 KiB is kept as sent, an object, with no truncated flag.
    assert kept["small"]["payload"] == small and "truncated" not in kept["small"]
    assert small_echo["payload"] == {"blob": "y" * 100} and "truncated" not in small_echo


@pytest.mark.slow
async def test_to_client_with_no_app_or_on_a_phone_call_is_dropped_and_counted(tmp_path: Path) -> None:
    relay = {"toClient": {"show-status": 3, "show-form": 1}}
    async with messenger(tmp_path, "--max-sessions", "2") as (runner, client), follow(runner) as follower:
        await place(client, "no-app", "loopback://x?caller=none")
        await place(client, "phone", "loopback://x?caller=sip")
        for session_id in ("no-app", "phone"):
            delivered(await send(client, session_id, message("m-1", "relay", relay)), "m-1")
            delivered(await send(client, session_id, message("m-2", "relay", relay)), "m-2")
            await stop(client, session_id)
            await wait_ended(follower, session_id)
        records = follower.records
    for session_id in ("no-app", "phone"):
        assert summary_of(records, session_id) == {
            "undeliveredToClient": {"show-status": 6, "show-form": 2},
            "refusedQueuedHostMessages": 0,
            "undeliveredQueuedHostMessages": 0,
        }
        assert not events_named(records, session_id, "curb.toClient")
    # One warning per key and reason, however many were dropped.
    for key in ("show-status", "show-form"):
        dropped = [line for line in runner.stderr if f"{key!r} dropped" in line]
        assert len([line for line in dropped if "no app" in line]) == 1, dropped
        assert len([line for line in dropped if "phone" in line]) == 1, dropped


# -- The client side, over the loopback caller --------------------------------------------------------


async def client_message(caller: LoopbackCaller, key: str, payload: Any, id_: str = "x-1") -> Any:
    answer_text = await caller.request(
        "curb.message", json.dumps({"key": key, "id": id_, "payload": payload})
    )
    return json.loads(answer_text)


async def client_refusal(caller: LoopbackCaller, method: str, payload: str) -> ClientRefusal:
    with pytest.raises(ClientRefusal) as refusal:
        await caller.request(method, payload)
    assert str(refusal.value) == refusal.value.code
    return refusal.value


async def test_client_messages_reply_refuse_and_run_in_order(tmp_path: Path) -> None:
    async with (
        open_runner(agents.messenger, tmp_path) as runner,
        runner.client() as client,
        follow(runner) as follower,
    ):
        await place(client, "c1")
        caller = await runner.wait_caller("c1")
        assert await client_message(caller, "claim-submitted", {"claimId": "C-17"}) == {
            "reply": {"received": "C-17"}
        }
        with trio.fail_after(5):
            assert await caller.to_client.receive() == {
                "key": "show-status",
                "payload": {"status": "received", "claimId": "C-17"},
            }

        # Several handlers run in registration order; the reply is the last one's.
        assert await client_message(caller, "ordered", {}) == {
            "reply": {"last": "second", "order": ["first", "second"]}
        }

        def rpc(key: str, payload: Any) -> str:
            return json.dumps({"key": key, "id": "x-2", "payload": payload})

        assert (await client_refusal(caller, "curb.message", rpc("nobody", {}))).code == "no_handler"
        assert (
            await client_refusal(caller, "curb.message", rpc("note", {}))
        ).code == "no_handler"  # the host's key
        invalid = await client_refusal(caller, "curb.message", rpc("claim-submitted", {"claimId": 17}))
        assert invalid.code == "invalid_payload"
        assert invalid.data is not None and [i["path"] for i in invalid.data["issues"]] == [["claimId"]]
        assert (await client_refusal(caller, "curb.message", rpc("broken", {}))).code == "handler_failed"
        nan = '{"key":"claim-submitted","id":"x-3","payload":{"claimId":NaN}}'
        assert (await client_refusal(caller, "curb.message", nan)).code == "invalid_request"

        # LiveKit's RPC cap: 15 KiB of request, no more.
        envelope = len(rpc("nobody", {"pad": ""}).encode())
        at_cap = rpc("nobody", {"pad": "p" * (15 * 1024 - envelope)})
        assert len(at_cap.encode()) == 15 * 1024
        assert (await client_refusal(caller, "curb.message", at_cap)).code == "no_handler"
        over = rpc("nobody", {"pad": "p" * (15 * 1024 - envelope + 1)})
        assert (await client_refusal(caller, "curb.message", over)).code == "payload_too_large"

        await stop(client, "c1")
        records = await wait_ended(follower, "c1")
    assert [(m["from"], m["key"], m["outcome"]) for m in messages_of(records, "c1")] == [
        ("client", "claim-submitted", "delivered"),
        ("client", "ordered", "delivered"),
        ("client", "nobody", "no_handler"),
        ("client", "note", "no_handler"),
        ("client", "claim-submitted", "invalid_payload"),
        ("client", "broken", "handler_failed"),
        ("client", "nobody", "no_handler"),
    ]
    assert events_named(records, "c1", "curb.toClient") == [
        {"key": "show-status", "payload": {"status": "received", "claimId": "C-17"}}
    ]
    assert summary_of(records, "c1")["undeliveredToClient"] == {}


async def test_each_call_has_its_own_messages(tmp_path: Path) -> None:
    async with open_runner(agents.messenger, tmp_path) as runner, runner.client() as client:
        await place(client, "c1")
        await place(client, "c2")
        first, second = await runner.wait_caller("c1"), await runner.wait_caller("c2")
        assert await client_message(first, "whoami", {}) == {"reply": {"sessionId": "c1"}}
        with trio.fail_after(5):
            assert await first.to_client.receive() == {"key": "you-are", "payload": {"sessionId": "c1"}}
        assert await client_message(second, "whoami", {}) == {"reply": {"sessionId": "c2"}}
        with trio.fail_after(5):
            assert await second.to_client.receive() == {"key": "you-are", "payload": {"sessionId": "c2"}}
        # Neither app got the other's message.
        with pytest.raises(trio.WouldBlock):
            first.to_client.receive_nowait()
        with pytest.raises(trio.WouldBlock):
            second.to_client.receive_nowait()


# -- Transfers -----------------------------------------------------------------------------------


async def speak(caller: LoopbackCaller, text: str) -> None:
    """Send ``text`` as the caller's speech: quiet, the words, then quiet that ends the utterance."""
    tts = EspeakTTS("en")
    rate = tts.sample_rate_hz
    words = b"".join([chunk async for chunk in tts.synthesize(text)])
    quiet = bytes(rate * 2 // 50)  # 20 ms
    frame = len(quiet)
    # 2.5 s of quiet: more than the longest pause the end-of-turn model may wait out (2 s).
    audio = quiet * 15 + words + quiet * 125
    for start in range(0, len(audio), frame):
        caller.send_audio(audio[start : start + frame], rate)


async def transfer(
    follower: Follower,
    client: httpx.AsyncClient,
    caller: LoopbackCaller,
    session_id: str,
    reply: dict[str, Any] | None,
) -> dict[str, Any]:
    """Ask for sales; answer the agent's transfer ask with ``reply`` (or not at all); return the turn."""
    caller.say("Please transfer me to sales.")
    ask = await wait_host_record(follower, session_id, "curb.transfer")
    assert ask["expectsReply"] is True
    assert ask["payload"] == {"target": "sip:sales@example.com", "reason": "sales"}
    if reply is not None:
        delivered(
            await send(
                client, session_id, message("t-1", "curb.transfer.answer", reply, inReplyTo=ask["id"])
            ),
            "t-1",
        )
    (turn,) = await follower.wait_for(
        lambda rs: [t for t in turns(rs, session_id, "assistant") if t["toolCalls"]]
    )
    return turn


async def test_a_transfer_accepted_then_the_target_joins_and_leaves(tmp_path: Path) -> None:
    async with (
        open_runner(agents.switchboard, tmp_path) as runner,
        runner.client() as client,
        follow(runner) as follower,
    ):
        await place(client, "c1")
        caller = await runner.wait_caller("c1")
        turn = await transfer(follower, client, caller, "c1", {"accepted": True})
        (call,) = turn["toolCalls"]
        assert (call["name"], call["arguments"], call["ok"]) == (
            "transfer_call",
            {"department": "sales"},
            True,
        )
        assert call["result"] == "Transferring the caller to sales now."

        caller.join("sales-1", "transfer_target")
        joined = {"state": "target_joined", "identity": "sales-1"}
        await follower.wait_for(lambda rs: joined in events_named(rs, "c1", "curb.transfer"))
        await speak(caller, "Hello, is anyone there?")  # the agent does not listen
        caller.leave("sales-1", "transfer_target")
        resumed = {"state": "agent_resumed", "identity": "sales-1"}
        await follower.wait_for(lambda rs: resumed in events_named(rs, "c1", "curb.transfer"))
        await speak(caller, "Hello, is anyone there?")  # now it does
        await follower.wait_for(lambda rs: [t for t in turns(rs, "c1", "user") if t["spoken"]])
        await follower.wait_for(lambda rs: len(turns(rs, "c1", "assistant")) >= 2)
        await stop(client, "c1")
        records = await wait_ended(follower, "c1")
    (resumed_at,) = [
        r["seq"] for r in records if r["class"] == "conversation" and r["body"].get("payload") == resumed
    ]
    heard = [t for t in turns(records, "c1", "user") if t["spoken"]]
    # Only the speech after the target left was heard.
    assert len(heard) == 1 and heard[0]["seq"] > resumed_at and heard[0]["text"]
    assert next(t["text"] for t in turns(records, "c1", "user")) == "Please transfer me to sales."


async def test_no_turn_is_taken_while_the_transfer_target_is_in_the_call(tmp_path: Path) -> None:
    async with (
        open_runner(agents.switchboard, tmp_path) as runner,
        runner.client() as client,
        follow(runner) as follower,
    ):
        await place(client, "c1")
        caller = await runner.wait_caller("c1")
        await transfer(follower, client, caller, "c1", {"accepted": True})
        while True:  # what the transfer turn said is out of the way
            try:
                caller.audio.receive_nowait()
            except trio.WouldBlock:
                break
        caller.join("sales-1", "transfer_target")
        await follower.wait_for(lambda rs: events_named(rs, "c1", "curb.transfer"))
        caller.say("Are you still there?")  # typed in the app while the target talks to the caller
        caller.leave("sales-1", "transfer_target")
        await follower.wait_for(lambda rs: len(events_named(rs, "c1", "curb.transfer")) == 2)
        caller.say("Thank you, goodbye.")
        await follower.wait_for(
            lambda rs: "Thank you, goodbye." in [t["text"] for t in turns(rs, "c1", "user")]
        )
        await follower.wait_for(lambda rs: len(turns(rs, "c1", "assistant")) >= 2)
        await stop(client, "c1")
        records = await wait_ended(follower, "c1")
    # While the target was in the call the agent neither listened nor spoke: no turn for it.
    assert [t["text"] for t in turns(records, "c1", "user")] == [
        "Please transfer me to sales.",
        "Thank you, goodbye.",
    ]


async def test_a_transfer_declined(tmp_path: Path) -> None:
    async with (
        open_runner(agents.switchboard, tmp_path) as runner,
        runner.client() as client,
        follow(runner) as follower,
    ):
        await place(client, "c1")
        caller = await runner.wait_caller("c1")
        turn = await transfer(follower, client, caller, "c1", {"accepted": False, "reason": "nobody is free"})
    (call,) = turn["toolCalls"]
    assert call["result"] == "The transfer to sales was declined: nobody is free."
    assert "declined" in turn["text"]


async def test_a_transfer_unanswered_fails_with_transfer_no_reply(tmp_path: Path) -> None:
    async with (
        open_runner(agents.switchboard, tmp_path) as runner,
        runner.client() as client,
        follow(runner) as follower,
    ):
        await place(client, "c1")
        caller = await runner.wait_caller("c1")
        caller.say("Please escalate.")
        ask = await wait_host_record(follower, "c1", "curb.transfer")
        assert (
            ask["payload"] == {"target": "sip:supervisor@example.com", "reason": "escalation"}
            and ask["expectsReply"]
        )
        (turn,) = await follower.wait_for(
            lambda rs: [t for t in turns(rs, "c1", "assistant") if t["toolCalls"]]
        )
        # The reply comes after the ask's timeout: an ordinary message nobody handles.
        late = message("t-1", "curb.transfer.answer", {"accepted": True}, inReplyTo=ask["id"])
        refused(await send(client, "c1", late), 422, "no_handler")
    (call,) = turn["toolCalls"]
    assert call["name"] == "escalate"
    assert call["result"] == {"outcome": "failed", "code": "transfer_no_reply", "reason": None}


# -- The runner embedded in a test (tests/inprocess.py) ----------------------------------------------

_CANCEL_AFTER_DRAIN = """
import sys, trio
from functools import partial
from pathlib import Path
from runner.agent import conversation_factory
from runner.config import Config
from runner.runtime import serve_runner
from runner.transports.loopback import LoopbackTransport
from tests import agents

async def main():
    config = Config(address="127.0.0.1:0", journal_path=Path(sys.argv[1]), drain_grace_ms=0)
    async with trio.open_nursery() as nursery:
        _, runner = await nursery.start(partial(
            serve_runner, config, token="t", transports=[LoopbackTransport()],
            conversation_factory=conversation_factory(agents.messenger, host_connected=True),
            handle_signals=False))
        runner.drain_nowait("test")
        await runner.wait_drained()
        nursery.cancel_scope.cancel()
    print("returned")

trio.run(main)
"""


@pytest.mark.slow
async def test_a_runner_cancelled_once_drained_returns(tmp_path: Path) -> None:
    # In its own process: a runner that cannot be cancelled would hang this one for good.
    with trio.move_on_after(15):
        done = await trio.run_process(
            [sys.executable, "-c", _CANCEL_AFTER_DRAIN, str(tmp_path / "j.db")],
            capture_stdout=True,
            capture_stderr=True,
            cwd=Path(__file__).parents[1],
        )
        assert done.stdout.decode().splitlines()[-1] == "returned"
        return
    raise AssertionError("serve_runner, cancelled once drained, did not return within 15 s")
