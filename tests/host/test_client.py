"""runner.host.RunnerClient: every route against a real ``runner serve``, every refusal as its class."""

from __future__ import annotations

import json
import typing
from pathlib import Path

import pytest

from runner import errors, host
from runner.host import (
    ERRORS,
    CursorTooOld,
    GenerationMismatch,
    HandlerFailed,
    HostMessage,
    InvalidPayload,
    InvalidRequest,
    InvalidSettings,
    NoHandler,
    NotAdjustable,
    RunnerAtCapacity,
    RunnerClient,
    RunnerDraining,
    RunnerUnreachable,
    SessionNotFound,
    SessionUpdate,
    StartFailed,
    Unauthorized,
    UnknownError,
    UnknownVersion,
    error_from_answer,
)
from runner.wire import ErrorBody, ErrorCode, Issue, STTUpdate, TTSUpdate, encode

from ..runner_process import start_runner
from .helpers import TOKEN, free_port, start

MESSENGER = "tests.agents:messenger"


def _class_name(code: str) -> str:
    return "".join(part.capitalize() for part in code.split("_"))


def test_every_documented_code_has_its_class_named_after_it() -> None:
    codes = typing.get_args(ErrorCode)
    assert sorted(ERRORS) == sorted(codes)
    for code in codes:
        cls = ERRORS[code]
        assert cls.code == code
        assert cls.__name__ == _class_name(code)
        # Exported once, from runner.host, as the runner's own class.
        assert getattr(host, cls.__name__) is cls is getattr(errors, cls.__name__)


def _sample(cls: type[errors.RunnerError]) -> errors.RunnerError:
    if cls is errors.CursorTooOld:
        return cls(7, 50, "too old")
    if cls is errors.NotAdjustable:
        return cls("stt.language", "no")
    if issubclass(cls, errors.InvalidRequest | errors.NoHandler | errors.InvalidPayload):
        return cls("bad", [Issue(path=["score"], message="expected a number")])
    return cls(f"{cls.code} happened")


@pytest.mark.parametrize("code", typing.get_args(ErrorCode))
def test_each_error_body_comes_back_as_the_error_that_wrote_it(code: str) -> None:
    sent = _sample(ERRORS[code])
    content = json.dumps(encode(sent.body())).encode()
    got = error_from_answer(sent.status, content)
    assert type(got) is type(sent)
    assert got.body() == sent.body()


def test_a_404_on_start_is_a_version_mismatch_whatever_its_body_says() -> None:
    prose = error_from_answer(404, b'{"error":"Not Found: no such route"}', starting=True)
    assert isinstance(prose, UnknownVersion)
    assert isinstance(error_from_answer(404, b"<html>gone</html>", starting=True), UnknownVersion)
    assert isinstance(error_from_answer(404, b'{"error":"not_found"}', starting=True), UnknownVersion)
    # Elsewhere, a 404 is what its code says.
    assert isinstance(error_from_answer(404, b'{"error":"session_not_found"}'), SessionNotFound)


def test_an_unknown_code_or_no_error_body_is_an_unknown_error() -> None:
    newer = error_from_answer(429, b'{"error":"slow_down","detail":"later"}')
    assert isinstance(newer, UnknownError)
    assert (newer.status, newer.code, newer.detail) == (429, "slow_down", "later")
    proxy = error_from_answer(502, b"<html>bad gateway</html>")
    assert isinstance(proxy, UnknownError)
    assert (proxy.status, proxy.code) == (502, "")
    too_old = error_from_answer(
        410, json.dumps(encode(ErrorBody(error="cursor_too_old", requested=3, oldest_retained=9))).encode()
    )
    assert isinstance(too_old, CursorTooOld)
    assert (too_old.requested, too_old.oldest_retained) == (3, 9)


@pytest.mark.slow
async def test_every_route_answers_as_its_wire_type(tmp_path: Path) -> None:
    async with (
        start_runner(tmp_path / "j.db", "--max-sessions", "2", agent=MESSENGER) as runner,
        RunnerClient(runner.base_url, token=TOKEN) as client,
    ):
        health = await client.health()
        assert (health.ok, health.protocol_version, health.versions) == (True, 1, [1])
        status = await client.status()
        assert (status.max_sessions, status.active_sessions, status.draining) == (2, 0, False)

        placed = await client.start_call(start("c1", "loopback://x"))
        assert (placed.session_id, placed.accepted, placed.call.state) == ("c1", True, "connected")
        again = await client.start_call(start("c1", "loopback://x"))
        assert (again.accepted, again.call.state) == (False, "connected")
        assert (await client.get_call("c1")).state == "connected"
        assert [c.session_id for c in (await client.status()).sessions] == ["c1"]

        note = HostMessage(id="m-1", name="note", payload={"x": 1})
        assert (await client.send_message("c1", note)).delivered is True
        assert (await client.send_message("c1", note)).delivered is False

        with pytest.raises(NoHandler):
            await client.send_message("c1", HostMessage(id="m-2", name="nobody", payload={}))
        with pytest.raises(InvalidPayload) as invalid:
            await client.send_message("c1", HostMessage(id="m-3", name="lead", payload={"score": "high"}))
        assert invalid.value.issues and invalid.value.issues[0].path == ["score"]
        with pytest.raises(HandlerFailed):
            await client.send_message("c1", HostMessage(id="m-4", name="flaky", payload={"fail": True}))
        with pytest.raises(NotAdjustable) as fixed:
            await client.update_settings("c1", SessionUpdate(tts=TTSUpdate(voice="en")))
        assert fixed.value.path == "tts.voice"
        with pytest.raises(SessionNotFound):
            await client.get_call("nobody")
        with pytest.raises(SessionNotFound):
            await client.send_message("nobody", note)
        with pytest.raises(InvalidRequest):
            await client.stop_call("c1", grace_ms=60_001)

        await client.start_call(start("c2", "loopback://x"))
        with pytest.raises(RunnerAtCapacity):
            await client.start_call(start("c3", "loopback://x"))
        with pytest.raises(StartFailed) as failed:
            await client.stop_call("c2")
            await client.start_call(start("c4", "loopback:?fail=busy"))
        assert "busy" in str(failed.value)

        stopped = await client.stop_call("c1", reason="done", grace_ms=0)
        assert (stopped.session_id, stopped.stopped) == ("c1", True)
        assert (await client.stop_call("c1")).stopped is False

        drained = await client.drain()
        assert drained.draining is True
        with pytest.raises(RunnerDraining):
            await client.start_call(start("c5", "loopback://x"))


@pytest.mark.slow
async def test_refusals_that_need_their_own_runner(tmp_path: Path) -> None:
    async with (
        start_runner(tmp_path / "j.db", "--deployment-id", "blue") as runner,
        RunnerClient(runner.base_url, token=TOKEN) as client,
        RunnerClient(runner.base_url, token="wrong") as stranger,
        RunnerClient(runner.base_url + "/v0", token=TOKEN) as older,
    ):
        with pytest.raises(GenerationMismatch):
            await client.start_call(start("c1", deployment_id="green"))
        with pytest.raises(Unauthorized):
            await stranger.status()
        # Any 404 on POST /v1/sessions: the runner speaks another version.
        with pytest.raises(UnknownVersion) as version:
            await older.start_call(start("c1"))
        assert version.value.versions == [1]
        with pytest.raises(CursorTooOld) as too_old:
            async with client.follow_events(from_=10_000) as events:
                await events.__anext__()
        assert too_old.value.requested == 10_000


@pytest.mark.slow
async def test_a_settings_change_and_its_refusal(tmp_path: Path) -> None:
    async with (
        start_runner(tmp_path / "j.db", agent="tests.agents:tunable") as runner,
        RunnerClient(runner.base_url, token=TOKEN) as client,
    ):
        await client.start_call(start("c1"))
        changed = await client.update_settings("c1", SessionUpdate(stt=STTUpdate(language="en-US")))
        assert (changed.session_id, changed.settings.stt.language) == ("c1", "en-US")
        # pocketsphinx takes no language but English.
        with pytest.raises(InvalidSettings) as invalid:
            await client.update_settings("c1", SessionUpdate(stt=STTUpdate(language="de")))
        assert invalid.value.issues and invalid.value.issues[0].path == ["stt", "language"]


async def test_no_runner_listening_is_unreachable_and_never_delivered() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    async with RunnerClient(url, token=TOKEN) as client:
        with pytest.raises(RunnerUnreachable) as unreachable:
            await client.start_call(start("c1"))
    assert unreachable.value.maybe_delivered is False
    assert unreachable.value.url == url


def test_the_public_names_are_exported_once() -> None:
    # Not identifiers: what pytest's assertion rewriting adds to a module of a plugin's package.
    public = {name for name in vars(host) if name.isidentifier() and not name.startswith("_")}
    own = {
        "CallLost",
        "CallMoved",
        "ERRORS",
        "EventFollower",
        "Failover",
        "FailoverEvent",
        "EventsCursor",
        "FollowItem",
        "FollowStats",
        "KNOWN_CLASSES",
        "LiveKitRefused",
        "LiveKitRooms",
        "Lost",
        "NoRunnerAvailable",
        "Placement",
        "RunnerClient",
        "RunnerPool",
        "RunnerState",
        "RoomParticipant",
        "RunnerUnreachable",
        "SeqGap",
        "UnknownError",
        "error_from_answer",
    }
    wire = {"HostMessage", "JournalRecord", "SessionUpdate", "StartCallRequest"}
    codes = {cls.__name__ for cls in ERRORS.values()} | {"RunnerError"}
    assert public == own | wire | codes
    for name in own - {"ERRORS", "FollowItem", "KNOWN_CLASSES", "FailoverEvent"}:
        assert getattr(host, name).__module__.startswith("runner.host._"), name
    for name in wire:
        assert getattr(host, name).__module__.startswith("runner.wire."), name
