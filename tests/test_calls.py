"""Calls over the management API of a real ``runner serve`` process: every status and code.

Every JSON answer and every stream line is checked against ``runner/protocol.schema.json``.
``test_smoke_self_host`` is our counterpart of the seed's ``smoke:self-host``: it drives
every route, error paths included, and checks every answer and stream line.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterable, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from jsonschema import Draft202012Validator

from . import agents
from .inprocess import open_runner
from .runner_process import (
    READY_PREFIX,
    TOKEN,
    RunnerProcess,
    open_events,
    read_stream,
    records,
    start_runner,
)
from .test_protocol_schema import _validator

pytestmark = pytest.mark.slow

STREAM_TIMEOUT_S = 15


# -- schema checks ----------------------------------------------------------------------------


@cache
def _cached_validator(type_name: str) -> Draft202012Validator:
    return _validator(type_name)


def conforms(type_name: str, value: Any) -> Any:
    """Assert ``value`` is a valid ``type_name`` of the protocol schema; return it."""
    errors = [
        f"{list(e.absolute_path)}: {e.message}" for e in _cached_validator(type_name).iter_errors(value)
    ]
    assert not errors, f"not a valid {type_name}: {errors}\n{json.dumps(value)}"
    return value


def body_type(line: dict[str, Any]) -> str | None:
    """The schema type of a record's body, for the classes and events this runner writes."""
    cls, body = line["class"], line["body"]
    if cls == "lifecycle":
        return "Lifecycle"
    if cls == "host":
        return "HostRecordBody"
    if cls == "conversation" and body.get("type") == "event":
        return {
            "curb.started": "CallStartedEvent",
            "curb.ended": "CallEndedEvent",
            "curb.messages": "CallMessagesEvent",
        }.get(body["name"], "ConversationEventBody")
    return None


def conforming_lines(lines: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Check every stream line (StreamLine, then its body by class); return them."""
    lines = list(lines)
    for line in lines:
        conforms("StreamLine", line)
        if "envelope" in line:
            conforms("JournalRecord", line)
            kind = body_type(line)
            if kind is not None:
                conforms(kind, line["body"])
    return lines


def answer(response: httpx.Response, status: int, type_name: str | None = None) -> Any:
    """Assert the status, check the JSON body against its type (ErrorBody off 2xx); return it."""
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/json"), response.headers
    body = response.json()
    if type_name is None:
        assert status >= 300, "a 2xx answer needs its type"
        type_name = "ErrorBody"
    conforms(type_name, body)
    return body


def refused(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    """An ErrorBody answer with ``status`` and ``code``."""
    body = answer(response, status, "ErrorBody")
    assert body["error"] == code, body
    return body


def lifecycle_lines(runner: RunnerProcess) -> list[dict[str, Any]]:
    """The ``curb-hosted`` lines of stdout, each checked as a Lifecycle body."""
    return [conforms("Lifecycle", body) for body in runner.lifecycle]


# -- the calls' records -----------------------------------------------------------------------


def call_start(session_id: str, url: str = "loopback://x", **extra: Any) -> dict[str, Any]:
    return {"sessionId": session_id, "realtimeUrl": url, "realtimeToken": "room-token", **extra}


def of(lines: Sequence[dict[str, Any]], producer: str) -> list[dict[str, Any]]:
    return [line for line in lines if line.get("producer") == producer]


def names(lines: Sequence[dict[str, Any]], producer: str) -> list[str]:
    return [line["body"].get("name") for line in of(lines, producer)]


def call_events(lines: Sequence[dict[str, Any]], producer: str) -> list[str]:
    """A call's curb.started and curb.ended, leaving out what its agent wrote between them."""
    return [name for name in names(lines, producer) if name in ("curb.started", "curb.ended")]


def assert_complete(lines: Sequence[dict[str, Any]], producer: str, calls: int = 1) -> None:
    """Each of the producer's calls opened by curb.started and closed by curb.ended, seqs gapless."""
    assert call_events(lines, producer) == ["curb.started", "curb.ended"] * calls, of(lines, producer)
    assert names(lines, producer)[0] == "curb.started" and names(lines, producer)[-1] == "curb.ended"
    assert [line["seq"] for line in of(lines, producer)] == list(range(1, len(of(lines, producer)) + 1))


def ended_reason(lines: Sequence[dict[str, Any]], producer: str) -> str | None:
    ended = [line for line in of(lines, producer) if line["body"].get("name") == "curb.ended"]
    return ended[-1]["body"]["payload"]["reason"] if ended else None


def idle(lines: Sequence[dict[str, Any]]) -> bool:
    """Whether a heartbeat came: the stream had sent everything committed before it."""
    return any("ping" in line for line in lines)


async def stream_until(runner: RunnerProcess, until: Any, query: str = "from=0") -> list[dict[str, Any]]:
    return conforming_lines(await read_stream(runner, query, until=until, timeout=STREAM_TIMEOUT_S))


async def status_of(client: httpx.AsyncClient) -> dict[str, Any]:
    return answer(await client.get("/v1/runner"), 200, "RunnerStatus")


# -- starting a call --------------------------------------------------------------------------


async def test_a_new_call_is_accepted_once_connected(tmp_path: Path) -> None:
    async with start_runner(tmp_path / "j.db") as runner, runner.client() as client:
        before = int(time.time() * 1000)
        response = await client.post(
            "/v1/sessions",
            json=call_start(
                "call-42",
                clientContext={"event": "webinar-11-04"},
                direction="outbound",
                experiments={"greeting": "casual"},
            ),
        )
        after = int(time.time() * 1000)
        started = answer(response, 202, "StartCallResponse")
        assert started["sessionId"] == "call-42" and started["accepted"] is True
        assert started["call"]["sessionId"] == "call-42" and started["call"]["state"] == "connected"
        assert before - 1000 <= started["call"]["startedAtMs"] <= after
        lines = await stream_until(runner, lambda ls: "curb.started" in names(ls, "call-42"))
    record = of(lines, "call-42")[0]
    assert (record["class"], record["seq"], record["body"]["name"]) == ("conversation", 1, "curb.started")
    assert record["body"]["payload"] == {
        "clientContext": {"event": "webinar-11-04"},
        "direction": "outbound",
        "experiments": {"greeting": "casual"},
        "transport": "loopback",
    }


async def test_a_repeat_start_is_accepted_false_with_the_call_as_it_is(tmp_path: Path) -> None:
    async with (
        start_runner(tmp_path / "j.db", "--max-sessions", "1", "--heartbeat-ms", "300") as runner,
        runner.client() as client,
    ):
        first = answer(await client.post("/v1/sessions", json=call_start("c1")), 202, "StartCallResponse")
        # A repeat is recognised by its session id, even at capacity and with another URL.
        repeat = answer(
            await client.post("/v1/sessions", json=call_start("c1", url="loopback://elsewhere")),
            202,
            "StartCallResponse",
        )
        assert repeat == {"sessionId": "c1", "accepted": False, "call": first["call"]}
        status = await status_of(client)
        assert status["activeSessions"] == 1 and status["sessions"] == [first["call"]]
        lines = await stream_until(runner, idle)
    assert call_events(lines, "c1") == ["curb.started"]  # one call, one record


async def test_unknown_fields_are_ignored(tmp_path: Path) -> None:
    async with start_runner(tmp_path / "j.db") as runner, runner.client() as client:
        body = call_start("c1", priority=3, future={"nested": [1, None, True]}, routing=None)
        started = answer(await client.post("/v1/sessions", json=body), 202, "StartCallResponse")
        assert started["accepted"] is True and started["call"]["state"] == "connected"
        lines = await stream_until(runner, lambda ls: "curb.started" in names(ls, "c1"))
    # What the request left out takes its default; what it added is not kept.
    assert of(lines, "c1")[0]["body"]["payload"] == {
        "clientContext": {},
        "direction": "inbound",
        "experiments": {},
        "transport": "loopback",
    }


INVALID_BODIES: list[tuple[str, Any, list[str | int]]] = [
    ("empty sessionId", call_start(""), ["sessionId"]),
    ("empty realtimeUrl", call_start("c", url=""), ["realtimeUrl"]),
    ("empty realtimeToken", {**call_start("c"), "realtimeToken": ""}, ["realtimeToken"]),
    ("empty deploymentId", call_start("c", deploymentId=""), ["deploymentId"]),
    ("missing sessionId", {"realtimeUrl": "loopback://x", "realtimeToken": "t"}, ["sessionId"]),
    ("configurationVersion 0", call_start("c", configurationVersion=0), ["configurationVersion"]),
    ("configurationVersion 1.5", call_start("c", configurationVersion=1.5), ["configurationVersion"]),
    ('configurationVersion "1"', call_start("c", configurationVersion="1"), ["configurationVersion"]),
    ("configurationVersion true", call_start("c", configurationVersion=True), ["configurationVersion"]),
    (
        "clientContext with a number",
        call_start("c", clientContext={"event": "e", "seats": 3}),
        ["clientContext"],
    ),
    ("experiments with a list", call_start("c", experiments={"greeting": ["casual"]}), ["experiments"]),
    ("direction sideways", call_start("c", direction="sideways"), ["direction"]),
    ("direction null", call_start("c", direction=None), ["direction"]),
    ("clientContext a string", call_start("c", clientContext="event=e"), ["clientContext"]),
    ("sessionId a number", {**call_start("c"), "sessionId": 7}, ["sessionId"]),
    ("a JSON array", [call_start("c")], []),
]


async def test_invalid_bodies_are_400_with_issues_naming_the_field(tmp_path: Path) -> None:
    async with start_runner(tmp_path / "j.db", "--max-sessions", "50") as runner, runner.client() as client:
        for case, body, field in INVALID_BODIES:
            error = refused(await client.post("/v1/sessions", json=body), 400, "invalid_request")
            issues = error.get("issues")
            assert issues, (case, error)
            paths = [issue["path"] for issue in issues]
            assert any(path[: len(field)] == field for path in paths), (case, paths)
            if field:
                # The issue names the field that is wrong, not a neighbour.
                assert all(path[:1] == field[:1] for path in paths), (case, paths)
        status = await status_of(client)
        assert status["activeSessions"] == 0


async def test_a_body_that_is_not_json_is_400_with_issues(tmp_path: Path) -> None:
    async with start_runner(tmp_path / "j.db") as runner, runner.client() as client:
        for body in [b"sessionId=c&realtimeUrl=loopback", b"{not json", b""]:
            error = refused(
                await client.post("/v1/sessions", content=body, headers={"content-type": "application/json"}),
                400,
                "invalid_request",
            )
            # docs/host-protocol.md: "A body that does not decode: 400 invalid_request with issues".
            assert error.get("issues"), (body, error)
            assert error["issues"][0]["path"] == [], (body, error)


# -- generations ------------------------------------------------------------------------------


async def test_generation_mismatch_is_409_for_either_field(tmp_path: Path) -> None:
    generation = ("--deployment-id", "dep-7", "--configuration-version", "3", "--max-sessions", "5")
    async with start_runner(tmp_path / "j.db", *generation) as runner, runner.client() as client:
        wrong_deployment = refused(
            await client.post("/v1/sessions", json=call_start("a", deploymentId="dep-8")),
            409,
            "generation_mismatch",
        )
        assert "dep-8" in wrong_deployment.get("detail", "")
        refused(
            await client.post("/v1/sessions", json=call_start("b", configurationVersion=4)),
            409,
            "generation_mismatch",
        )
        refused(
            await client.post(
                "/v1/sessions", json=call_start("c", deploymentId="dep-7", configurationVersion=2)
            ),
            409,
            "generation_mismatch",
        )
        # Matching, or not stated by the request: accepted.
        for session_id, extra in [
            ("same", {"deploymentId": "dep-7", "configurationVersion": 3}),
            ("only-deployment", {"deploymentId": "dep-7"}),
            ("only-version", {"configurationVersion": 3}),
            ("neither", {}),
        ]:
            started = answer(
                await client.post("/v1/sessions", json=call_start(session_id, **extra)),
                202,
                "StartCallResponse",
            )
            assert started["accepted"] is True, session_id
        # The generation is checked before the repeat: a repeat for another generation is refused.
        refused(
            await client.post("/v1/sessions", json=call_start("same", configurationVersion=9)),
            409,
            "generation_mismatch",
        )
        status = await status_of(client)
        assert sorted(call["sessionId"] for call in status["sessions"]) == [
            "neither",
            "only-deployment",
            "only-version",
            "same",
        ]
        assert not {"a", "b", "c"} & {call["sessionId"] for call in status["sessions"]}
        lines = await stream_until(runner, lambda ls: "curb.started" in names(ls, "neither"))
    assert (
        not of(lines, "a") and not of(lines, "b") and not of(lines, "c")
    )  # a refused start leaves no record
    payload = of(lines, "same")[0]["body"]["payload"]
    assert (payload["deploymentId"], payload["configurationVersion"]) == ("dep-7", 3)


async def test_a_runner_that_states_no_generation_takes_any(tmp_path: Path) -> None:
    async with start_runner(tmp_path / "j.db", "--max-sessions", "2") as runner, runner.client() as client:
        for session_id, version in [("v1", 1), ("v99", 99)]:
            started = await client.post(
                "/v1/sessions",
                json=call_start(session_id, deploymentId=f"dep-{version}", configurationVersion=version),
            )
            assert answer(started, 202, "StartCallResponse")["accepted"] is True
        status = await status_of(client)
        assert "deploymentId" not in status and "configurationVersion" not in status


# -- capacity and failed starts ---------------------------------------------------------------


async def test_runner_at_capacity_is_409(tmp_path: Path) -> None:
    async with start_runner(tmp_path / "j.db", "--max-sessions", "2") as runner, runner.client() as client:
        for session_id in ["c1", "c2"]:
            answer(await client.post("/v1/sessions", json=call_start(session_id)), 202, "StartCallResponse")
        full = refused(await client.post("/v1/sessions", json=call_start("c3")), 409, "runner_at_capacity")
        assert full.get("detail")
        # Capacity is checked before the transport: a full runner never tries to join.
        refused(
            await client.post("/v1/sessions", json=call_start("c4", url="loopback://x?fail=busy")),
            409,
            "runner_at_capacity",
        )
        # A repeat is still answered at capacity; a freed place takes the next call.
        assert (
            answer(await client.post("/v1/sessions", json=call_start("c1")), 202, "StartCallResponse")[
                "accepted"
            ]
            is False
        )
        answer(await client.delete("/v1/sessions/c1"), 200, "StopCallResponse")
        assert (
            answer(await client.post("/v1/sessions", json=call_start("c3")), 202, "StartCallResponse")[
                "accepted"
            ]
            is True
        )
        status = await status_of(client)
        assert (status["maxSessions"], status["activeSessions"]) == (2, 2)


async def _assert_start_failed(
    runner: RunnerProcess, client: httpx.AsyncClient, session_id: str, url: str
) -> dict[str, Any]:
    error = refused(
        await client.post("/v1/sessions", json=call_start(session_id, url=url)), 502, "start_failed"
    )
    assert error.get("detail"), error
    refused(await client.get(f"/v1/sessions/{session_id}"), 404, "session_not_found")
    assert (await status_of(client))["activeSessions"] == 0
    # docs/host-protocol.md: "its record still has curb.started then curb.ended with a
    # start_failed: ... reason".
    # The 502 comes once the record is written: read up to the first heartbeat, which
    # an idle stream writes only once everything committed went out.
    lines = records(await stream_until(runner, idle))
    assert_complete(lines, session_id)
    reason = ended_reason(lines, session_id)
    assert reason is not None and reason.startswith("start_failed"), reason
    return error


async def test_a_refused_join_is_502_start_failed_with_its_record(tmp_path: Path) -> None:
    async with start_runner(tmp_path / "j.db", "--heartbeat-ms", "300") as runner, runner.client() as client:
        error = await _assert_start_failed(runner, client, "busy-call", "loopback://x?fail=busy")
        assert "busy" in error["detail"]
        # The place is free again.
        answer(await client.post("/v1/sessions", json=call_start("next")), 202, "StartCallResponse")


async def test_a_url_no_transport_joins_is_502_start_failed_with_its_record(tmp_path: Path) -> None:
    # No transport of this runner takes sip: URLs (wss: ones now go to LiveKit, below).
    async with start_runner(tmp_path / "j.db", "--heartbeat-ms", "300") as runner, runner.client() as client:
        error = await _assert_start_failed(runner, client, "sip-call", "sip://trunk.example.com")
        assert "sip" in error["detail"]


async def test_a_livekit_room_that_refuses_is_502_start_failed_with_its_record(tmp_path: Path) -> None:
    # A LiveKit URL whose server is not there: a closed port on loopback, refused at once.
    async with start_runner(tmp_path / "j.db", "--heartbeat-ms", "300") as runner, runner.client() as client:
        error = await _assert_start_failed(runner, client, "lk-call", "wss://127.0.0.1:1")
        assert "127.0.0.1:1" in error["detail"]


# -- reading and stopping a call --------------------------------------------------------------


async def test_get_a_call_or_404(tmp_path: Path) -> None:
    async with start_runner(tmp_path / "j.db") as runner, runner.client() as client:
        started = answer(await client.post("/v1/sessions", json=call_start("c1")), 202, "StartCallResponse")
        live = answer(await client.get("/v1/sessions/c1"), 200, "LiveCall")
        assert live == {
            "sessionId": "c1",
            "state": "connected",
            "startedAtMs": started["call"]["startedAtMs"],
        }
        missing = refused(await client.get("/v1/sessions/nobody"), 404, "session_not_found")
        assert "nobody" in missing.get("detail", "")


async def test_stop_with_reason_and_grace_ends_the_call_with_that_reason(tmp_path: Path) -> None:
    async with (
        start_runner(tmp_path / "j.db", "--max-sessions", "2", "--drain-grace-ms", "100") as runner,
        runner.client() as client,
    ):
        for session_id in ["hung-up", "plain"]:
            answer(await client.post("/v1/sessions", json=call_start(session_id)), 202, "StartCallResponse")
        async with open_events(runner, "from=0") as events:
            stopped = await client.delete(
                "/v1/sessions/hung-up", params={"reason": "caller_hung_up", "graceMs": "2000"}
            )
            assert answer(stopped, 200, "StopCallResponse") == {"sessionId": "hung-up", "stopped": True}
            # The answer comes once the call ended: it is gone at once.
            refused(await client.get("/v1/sessions/hung-up"), 404, "session_not_found")
            default = await client.delete("/v1/sessions/plain")
            assert answer(default, 200, "StopCallResponse") == {"sessionId": "plain", "stopped": True}
            answer(await client.post("/v1/runner/drain"), 202, "RunnerStatus")
            with trio.fail_after(STREAM_TIMEOUT_S):
                lines = conforming_lines(await events.lines())  # to the end of the stream
        assert await runner.wait_exit() == 0
    assert ended_reason(lines, "hung-up") == "caller_hung_up"
    assert ended_reason(lines, "plain") == "stopped_by_host"
    for producer in ["hung-up", "plain"]:
        # curb.ended is the producer's last record, and seqs are gapless.
        assert_complete(lines, producer)


async def test_a_session_id_that_ended_starts_a_new_call_under_the_same_producer(tmp_path: Path) -> None:
    async with start_runner(tmp_path / "j.db", "--heartbeat-ms", "300") as runner, runner.client() as client:
        first = answer(await client.post("/v1/sessions", json=call_start("again")), 202, "StartCallResponse")
        answer(
            await client.delete("/v1/sessions/again", params={"reason": "first_done"}),
            200,
            "StopCallResponse",
        )
        second = answer(await client.post("/v1/sessions", json=call_start("again")), 202, "StartCallResponse")
        assert second["accepted"] is True
        assert second["call"]["startedAtMs"] >= first["call"]["startedAtMs"]
        answer(
            await client.delete("/v1/sessions/again", params={"reason": "second_done"}),
            200,
            "StopCallResponse",
        )
        lines = records(await stream_until(runner, idle))
    assert_complete(lines, "again", calls=2)
    ended = [
        line["body"]["payload"]["reason"]
        for line in of(lines, "again")
        if line["body"]["name"] == "curb.ended"
    ]
    assert ended == ["first_done", "second_done"]


async def test_stopping_an_unknown_call_is_200_stopped_false(tmp_path: Path) -> None:
    async with start_runner(tmp_path / "j.db") as runner, runner.client() as client:
        for _ in range(2):  # a retried stop stays a success
            stopped = await client.delete("/v1/sessions/never-was", params={"reason": "caller_hung_up"})
            assert answer(stopped, 200, "StopCallResponse") == {"sessionId": "never-was", "stopped": False}
        answer(await client.post("/v1/sessions", json=call_start("c1")), 202, "StartCallResponse")
        assert answer(await client.delete("/v1/sessions/c1"), 200, "StopCallResponse")["stopped"] is True
        assert answer(await client.delete("/v1/sessions/c1"), 200, "StopCallResponse")["stopped"] is False


async def test_grace_ms_outside_0_to_60000_is_400(tmp_path: Path) -> None:
    async with start_runner(tmp_path / "j.db", "--max-sessions", "3") as runner, runner.client() as client:
        answer(await client.post("/v1/sessions", json=call_start("c1")), 202, "StartCallResponse")
        for bad in ["-1", "60001", "abc", "1.5", "", "1e3", "\u00b2"]:
            response = await client.delete("/v1/sessions/c1", params={"graceMs": bad})
            assert response.status_code == 400, (bad, response.status_code, response.text)
            error = refused(response, 400, "invalid_request")
            assert "graceMs" in error.get("detail", ""), (bad, error)
            assert answer(await client.get("/v1/sessions/c1"), 200, "LiveCall")["state"] == "connected", bad
        # The bounds themselves are accepted.
        for session_id, grace in [("c1", "0"), ("c2", "60000")]:
            if session_id != "c1":
                answer(
                    await client.post("/v1/sessions", json=call_start(session_id)), 202, "StartCallResponse"
                )
            stopped = await client.delete(f"/v1/sessions/{session_id}", params={"graceMs": grace})
            assert answer(stopped, 200, "StopCallResponse")["stopped"] is True


# -- the runner's status ----------------------------------------------------------------------


async def test_runner_status_lists_the_calls_and_the_generation(tmp_path: Path) -> None:
    generation = ("--deployment-id", "dep-7", "--configuration-version", "3", "--max-sessions", "4")
    async with start_runner(tmp_path / "j.db", *generation) as runner, runner.client() as client:
        assert await status_of(client) == {
            "protocolVersion": 1,
            "deploymentId": "dep-7",
            "configurationVersion": 3,
            "maxSessions": 4,
            "activeSessions": 0,
            "draining": False,
            "sessions": [],
        }
        calls = [
            answer(await client.post("/v1/sessions", json=call_start(session_id)), 202, "StartCallResponse")[
                "call"
            ]
            for session_id in ["c1", "c2"]
        ]
        status = await status_of(client)
        assert (status["activeSessions"], status["draining"]) == (2, False)
        assert sorted(status["sessions"], key=lambda call: call["sessionId"]) == calls


# -- concurrency ------------------------------------------------------------------------------


async def _post_all(client: httpx.AsyncClient, bodies: Sequence[dict[str, Any]]) -> list[httpx.Response]:
    responses: list[httpx.Response | None] = [None] * len(bodies)

    async def post(i: int) -> None:
        responses[i] = await client.post("/v1/sessions", json=bodies[i])

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            for i in range(len(bodies)):
                nursery.start_soon(post, i)
    assert all(response is not None for response in responses)
    return responses


async def test_concurrent_starts_of_one_session_id_accept_exactly_one(tmp_path: Path) -> None:
    async with (
        start_runner(tmp_path / "j.db", "--max-sessions", "5", "--heartbeat-ms", "300") as runner,
        runner.client() as client,
    ):
        # A slow join keeps the first start waiting while the others arrive.
        responses = await _post_all(client, [call_start("same", url="loopback://x?connect_ms=200")] * 20)
        bodies = [answer(response, 202, "StartCallResponse") for response in responses]
        assert sorted(body["accepted"] for body in bodies) == [False] * 19 + [True]
        assert {body["call"]["startedAtMs"] for body in bodies} == {bodies[0]["call"]["startedAtMs"]}
        status = await status_of(client)
        assert status["activeSessions"] == 1
        lines = await stream_until(runner, idle)
    assert call_events(lines, "same") == ["curb.started"]


async def test_concurrent_starts_beyond_capacity_accept_exactly_max_sessions(tmp_path: Path) -> None:
    async with start_runner(tmp_path / "j.db", "--max-sessions", "5") as runner, runner.client() as client:
        responses = await _post_all(
            client, [call_start(f"c{i}", url="loopback://x?connect_ms=100") for i in range(20)]
        )
        accepted = [
            answer(r, 202, "StartCallResponse")["sessionId"] for r in responses if r.status_code == 202
        ]
        full = [refused(r, 409, "runner_at_capacity") for r in responses if r.status_code != 202]
        assert (len(accepted), len(full)) == (5, 15)
        status = await status_of(client)
        assert sorted(call["sessionId"] for call in status["sessions"]) == sorted(accepted)
        assert {call["state"] for call in status["sessions"]} == {"connected"}


async def test_the_status_keeps_up_with_calls_started_and_ended(tmp_path: Path) -> None:
    # The runner keeps each call's part of its status as the call changes (in groups of
    # StatusParts.GROUP by start order): whole groups and single calls end, new ones start.
    async with start_runner(tmp_path / "j.db", "--max-sessions", "400") as runner, runner.client() as client:
        first = [f"a{i}" for i in range(300)]
        for begin in range(0, len(first), 50):
            for response in await _post_all(client, [call_start(s) for s in first[begin : begin + 50]]):
                answer(response, 202, "StartCallResponse")
        status = await status_of(client)
        assert status["activeSessions"] == 300
        # Concurrent starts register in the order their requests arrive: compare as sets here.
        assert sorted(call["sessionId"] for call in status["sessions"]) == sorted(first)
        order = [call["sessionId"] for call in status["sessions"]]
        ended = set(order[:140]) | set(order[141::3])
        for session_id in sorted(ended):
            stopped = answer(await client.delete(f"/v1/sessions/{session_id}"), 200, "StopCallResponse")
            assert stopped["stopped"] is True
        later = [f"b{i}" for i in range(5)]
        for session_id in later:
            answer(await client.post("/v1/sessions", json=call_start(session_id)), 202, "StartCallResponse")
        status = await status_of(client)
        expected = [s for s in order if s not in ended] + later
        assert [call["sessionId"] for call in status["sessions"]] == expected
        assert status["activeSessions"] == len(expected)
        for call in status["sessions"][::17]:
            assert call == answer(await client.get(f"/v1/sessions/{call['sessionId']}"), 200, "LiveCall")
        assert {call["state"] for call in status["sessions"]} == {"connected"}


async def test_a_call_still_joining_shows_starting(tmp_path: Path) -> None:
    async with start_runner(tmp_path / "j.db") as runner, runner.client() as client:
        result: dict[str, httpx.Response] = {}

        async def start() -> None:
            result["slow"] = await client.post(
                "/v1/sessions", json=call_start("slow", url="loopback://x?connect_ms=800")
            )

        seen: list[str] = []
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                began = trio.current_time()
                nursery.start_soon(start)
                for _ in range(200):
                    status = await status_of(client)
                    if status["sessions"]:
                        seen.append(status["sessions"][0]["state"])
                        if seen[-1] == "starting":
                            break
                    await trio.sleep(0.01)
                assert seen and seen[-1] == "starting", seen
                assert status["activeSessions"] == 1
                assert answer(await client.get("/v1/sessions/slow"), 200, "LiveCall")["state"] == "starting"
                # A repeat while it joins is answered at once, with the call as it is.
                repeat = answer(
                    await client.post("/v1/sessions", json=call_start("slow")), 202, "StartCallResponse"
                )
                assert (repeat["accepted"], repeat["call"]["state"]) == (False, "starting")
        started = answer(result["slow"], 202, "StartCallResponse")
        assert (started["accepted"], started["call"]["state"]) == (True, "connected")
        assert trio.current_time() - began >= 0.75
        assert answer(await client.get("/v1/sessions/slow"), 200, "LiveCall")["state"] == "connected"


# -- drain ------------------------------------------------------------------------------------


async def _drain_with_a_call(runner: RunnerProcess, trigger: Any, reason: str) -> list[dict[str, Any]]:
    """Drain while call ``c1`` runs; return the whole stream, from ``ready`` to its end."""
    async with runner.client() as client:
        answer(await client.post("/v1/sessions", json=call_start("c1")), 202, "StartCallResponse")
        async with open_events(runner, "from=0") as events:
            await trigger(client)
            refused(await client.post("/v1/sessions", json=call_start("c2")), 503, "runner_draining")
            # A repeat is refused too: draining is checked first.
            refused(await client.post("/v1/sessions", json=call_start("c1")), 503, "runner_draining")
            status = await status_of(client)
            assert status["draining"] is True and status["activeSessions"] == 1
            assert answer(await client.get("/v1/sessions/c1"), 200, "LiveCall")["state"] == "connected"
            with trio.fail_after(STREAM_TIMEOUT_S):
                lines = conforming_lines(await events.lines())  # to the end of the stream
        assert await runner.wait_exit() == 0
    kinds = [
        (line["producer"], line["body"].get("event") or line["body"].get("name"))
        for line in records(lines)
        if line["class"] == "lifecycle" or line["body"].get("name") in ("curb.started", "curb.ended")
    ]
    assert kinds == [
        ("runner", "ready"),
        ("c1", "curb.started"),
        ("runner", "draining"),
        ("c1", "curb.ended"),
        ("runner", "ended"),
    ]
    draining = next(line for line in lines if line["body"].get("event") == "draining")
    assert (draining["body"]["reason"], draining["body"]["activeSessions"]) == (reason, 1)
    assert ended_reason(lines, "c1") == "runner_draining"
    assert_complete(lines, "c1")
    # The call ran on for the drain's grace before it was stopped.
    call_ended = next(line for line in lines if line["body"].get("name") == "curb.ended")
    assert call_ended["at"] - draining["at"] >= 290
    last = records(lines)[-1]
    assert last["producer"] == "runner" and last["body"] == {"event": "ended", "reason": f"drained: {reason}"}
    assert [body["event"] for body in lifecycle_lines(runner)] == ["ready", "draining", "ended"]
    assert not of(lines, "c2")
    return lines


async def test_drain_by_route_finishes_the_call_then_exits_0(tmp_path: Path) -> None:
    async def drain(client: httpx.AsyncClient) -> None:
        status = answer(await client.post("/v1/runner/drain"), 202, "RunnerStatus")
        assert status["draining"] is True and [call["sessionId"] for call in status["sessions"]] == ["c1"]
        # A second drain is no error.
        assert answer(await client.post("/v1/runner/drain"), 202, "RunnerStatus")["draining"] is True

    async with start_runner(tmp_path / "j.db", "--drain-grace-ms", "300") as runner:
        await _drain_with_a_call(runner, drain, "drain_request")


async def test_drain_by_sigterm_finishes_the_call_then_exits_0(tmp_path: Path) -> None:
    async def drain(client: httpx.AsyncClient) -> None:
        runner.signal(signal.SIGTERM)
        await runner.wait_for(lambda: any(e["event"] == "draining" for e in runner.lifecycle), timeout=5)

    async with start_runner(tmp_path / "j.db", "--drain-grace-ms", "300") as runner:
        await _drain_with_a_call(runner, drain, "SIGTERM")


# -- the connection a host keeps open ---------------------------------------------------------


async def _read_answer(stream: trio.SocketStream, buffer: bytearray) -> tuple[int, bytes]:
    """One HTTP/1.1 answer with a content-length: its status and body."""
    while b"\r\n\r\n" not in buffer:
        data = await stream.receive_some(65536)
        if not data:
            raise EOFError("the connection closed before an answer")
        buffer += data
    head, _, rest = bytes(buffer).partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(rest) < length:
        data = await stream.receive_some(65536)
        if not data:
            raise EOFError("the connection closed inside an answer")
        rest += data
    del buffer[:]
    buffer += rest[length:]
    return int(lines[0].split()[1]), rest[:length]


async def answered_before_its_body(
    runner: RunnerProcess, method: str, path: str, *, token: str = TOKEN
) -> tuple[int | None, int | None]:
    """Send a request's head, read the answer if the runner gives one before the body, then
    send the body and ``GET /health`` on the same connection, as a keep-alive client does.

    Returns the first status and the second (None when no answer came within 5 s).
    """
    body = json.dumps(call_start("c1") | {"id": "m-1", "name": "n", "payload": {}}).encode()
    host, port = runner.address.rsplit(":", 1)
    stream = await trio.open_tcp_stream(host, int(port))
    buffer = bytearray()
    async with stream:
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: {runner.address}\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        await stream.send_all(head.encode())
        first = None
        # A runner that answers at once does so well within this; one that waits for the
        # body first is just as right.
        with trio.move_on_after(1):
            first, first_body = await _read_answer(stream, buffer)
        # The body comes a moment after the answer (a slow client, or one that sends its
        # body in a write of its own), and the next request a moment after that.
        await trio.sleep(0.2)
        await stream.send_all(body)
        if first is None:
            with trio.fail_after(5):
                first, first_body = await _read_answer(stream, buffer)
        conforms("ErrorBody", json.loads(first_body))
        await trio.sleep(0.2)
        await stream.send_all(f"GET /health HTTP/1.1\r\nHost: {runner.address}\r\n\r\n".encode())
        with trio.move_on_after(5):
            second, second_body = await _read_answer(stream, buffer)
            conforms("Health", json.loads(second_body))
            return first, second
    return first, None


async def test_an_answer_given_before_the_body_leaves_the_connection_usable(tmp_path: Path) -> None:
    # A refusal that needs no body (401, an unknown call) is answered before the body
    # arrives; the host's next request on that keep-alive connection must still be served.
    async with start_runner(tmp_path / "j.db") as runner:
        cases = [
            ("POST", "/v1/sessions", "wrong-token", 401),
            ("POST", "/v1/sessions/nobody/messages", TOKEN, 404),
            ("PATCH", "/v1/sessions/nobody", TOKEN, 404),
        ]
        got = [
            (method, path, *await answered_before_its_body(runner, method, path, token=token))
            for method, path, token, _ in cases
        ]
    assert got == [(method, path, status, 200) for method, path, _, status in cases]


# -- the smoke test: every route, every answer, every line ------------------------------------


async def test_smoke_self_host(tmp_path: Path) -> None:
    argv = (
        "--max-sessions",
        "2",
        "--deployment-id",
        "dep-1",
        "--configuration-version",
        "1",
        "--heartbeat-ms",
        "200",
        "--drain-grace-ms",
        "200",
    )
    async with start_runner(tmp_path / "j.db", *argv) as runner:
        ready_line = next(line for line in runner.stdout if line.startswith(READY_PREFIX))
        conforms("LifecycleReady", json.loads(ready_line.removeprefix("curb-hosted ")))

        async with runner.client(token=None) as anonymous:
            health = answer(await anonymous.get("/health"), 200, "Health")
            assert health == {"ok": True, "protocolVersion": 1, "versions": [1], "state": "ready"}
            for method, path in [
                ("GET", "/v1/runner"),
                ("POST", "/v1/sessions"),
                ("GET", "/v1/runner/events"),
                ("DELETE", "/v1/sessions/x"),
                ("POST", "/v1/runner/drain"),
                ("GET", "/nope"),
            ]:
                assert refused(await anonymous.request(method, path), 401, "unauthorized") == {
                    "error": "unauthorized"
                }

        async with runner.client() as client, open_events(runner, "from=0") as events:
            assert (events.status, events.headers["content-type"]) == (200, "application/x-ndjson")
            assert refused(await client.get("/v2/runner"), 404, "unknown_version")["versions"] == [1]
            refused(await client.get("/v1/nothing"), 404, "not_found")
            quiet = await status_of(client)
            assert (quiet["deploymentId"], quiet["configurationVersion"], quiet["activeSessions"]) == (
                "dep-1",
                1,
                0,
            )

            first = await client.post(
                "/v1/sessions",
                json=call_start(
                    "smoke-1",
                    deploymentId="dep-1",
                    configurationVersion=1,
                    clientContext={"event": "smoke"},
                    direction="outbound",
                    experiments={"greeting": "casual"},
                    unknownField=True,
                ),
            )
            assert answer(first, 202, "StartCallResponse")["accepted"] is True
            repeat = answer(
                await client.post("/v1/sessions", json=call_start("smoke-1")), 202, "StartCallResponse"
            )
            assert repeat["accepted"] is False
            refused(await client.post("/v1/sessions", json=call_start("")), 400, "invalid_request")
            refused(await client.post("/v1/sessions", content=b"[]"), 400, "invalid_request")
            refused(
                await client.post("/v1/sessions", json=call_start("g", deploymentId="dep-2")),
                409,
                "generation_mismatch",
            )
            refused(
                await client.post("/v1/sessions", json=call_start("f", url="loopback://x?fail=smoke")),
                502,
                "start_failed",
            )
            answer(await client.post("/v1/sessions", json=call_start("smoke-2")), 202, "StartCallResponse")
            refused(await client.post("/v1/sessions", json=call_start("smoke-3")), 409, "runner_at_capacity")

            assert answer(await client.get("/v1/sessions/smoke-1"), 200, "LiveCall")["state"] == "connected"
            refused(await client.get("/v1/sessions/smoke-3"), 404, "session_not_found")
            busy = await status_of(client)
            assert busy["activeSessions"] == 2
            with trio.fail_after(STREAM_TIMEOUT_S):
                lines = await events.lines(until=idle)  # up to a heartbeat, checked with the rest

            refused(
                await client.delete("/v1/sessions/smoke-2", params={"graceMs": "-1"}),
                400,
                "invalid_request",
            )
            stopped = await client.delete(
                "/v1/sessions/smoke-2", params={"reason": "smoke_done", "graceMs": "100"}
            )
            assert answer(stopped, 200, "StopCallResponse")["stopped"] is True
            assert (
                answer(await client.delete("/v1/sessions/smoke-2"), 200, "StopCallResponse")["stopped"]
                is False
            )

            refused(await client.get("/v1/runner/events", params={"from": "abc"}), 400, "invalid_request")
            too_old = refused(
                await client.get("/v1/runner/events", params={"from": "9999"}), 410, "cursor_too_old"
            )
            assert too_old["requested"] == 9999
            refused(await client.put("/v1/runner"), 405, "not_found")

            drained = answer(await client.post("/v1/runner/drain"), 202, "RunnerStatus")
            assert drained["draining"] is True
            refused(await client.post("/v1/sessions", json=call_start("late")), 503, "runner_draining")
            with trio.fail_after(STREAM_TIMEOUT_S):
                lines += await events.lines()  # to the end of the stream
        assert await runner.wait_exit() == 0

    conforming_lines(lines)
    lifecycle_lines(runner)
    assert any("ping" in line for line in lines)  # heartbeats were checked too
    recs = records(lines)
    assert [line["envelope"] for line in recs] == list(range(1, len(recs) + 1))
    assert recs[-1]["producer"] == "runner" and recs[-1]["body"]["event"] == "ended"
    producers = {line["producer"] for line in recs} - {"runner"}
    assert producers == {"smoke-1", "smoke-2", "f"}
    for producer in producers:
        assert_complete(recs, producer)
    assert (ended_reason(recs, "smoke-1"), ended_reason(recs, "smoke-2")) == ("runner_draining", "smoke_done")
    assert ended_reason(recs, "f").startswith("start_failed")
    started = of(recs, "smoke-1")[0]["body"]["payload"]
    assert (started["deploymentId"], started["configurationVersion"], started["direction"]) == (
        "dep-1",
        1,
        "outbound",
    )


async def test_a_calls_end_commits_curb_messages_and_curb_ended_together(tmp_path: Path) -> None:
    async with open_runner(agents.quiet, tmp_path) as runner, runner.client() as client:
        journal = runner.runner.journal
        answer(await client.post("/v1/sessions", json=call_start("one")), 202, "StartCallResponse")
        commits = journal.commits
        answer(await client.delete("/v1/sessions/one"), 200, "StopCallResponse")
        ends = journal.commits - commits
        held = await journal.read(0, 100, producer="one")
    assert ends == 1  # one transaction, one fsync, for the call's last two records
    assert [(r.seq, r.body["name"]) for r in held] == [
        (1, "curb.started"),
        (2, "curb.messages"),
        (3, "curb.ended"),
    ]
    assert held[2].envelope == held[1].envelope + 1 and held[2].at == held[1].at
