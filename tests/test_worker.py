"""Worker mode's pure parts: URLs, client context from a job, and what ``runner start`` refuses.

The worker against a real livekit-server is tested in tests/livekit/test_worker.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from livekit.protocol import agent as proto
from livekit.protocol import models

from runner.wire import HistoryTurn
from runner.worker import (
    RESUMES_JOB_KEY,
    RESUMES_KEY,
    ROOM_KEY,
    agent_url,
    client_context_of,
    history_of,
    parse_room_metadata,
    resumes_of,
    room_record,
    room_url,
)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("ws://10.0.0.1:7880", "ws://10.0.0.1:7880/agent"),
        ("wss://lk.example.com/", "wss://lk.example.com/agent"),
        ("https://lk.example.com", "wss://lk.example.com/agent"),
        ("http://lk.example.com:7880/base", "ws://lk.example.com:7880/base/agent"),
    ],
)
def test_the_agent_socket_url(url: str, expected: str) -> None:
    assert agent_url(url) == expected


def test_a_url_that_is_not_livekit_is_refused() -> None:
    with pytest.raises(ValueError, match="ws://"):
        agent_url("loopback://x")


def test_rooms_are_joined_over_websocket_urls() -> None:
    assert room_url("https://lk.example.com") == "wss://lk.example.com"
    assert room_url("ws://10.0.0.1:7880") == "ws://10.0.0.1:7880"


def test_flat_metadata_is_the_client_context() -> None:
    job = proto.Job(id="AJ_1", metadata=json.dumps({"plan": "pro", "page": "pricing"}))
    assert client_context_of(job) == ({"plan": "pro", "page": "pricing"}, {})


@pytest.mark.parametrize(
    ("metadata", "why"),
    [
        (json.dumps({"plan": {"tier": 2}}), "not a flat map of strings"),
        (json.dumps({"n": 1}), "not a flat map of strings"),
        (json.dumps(["plan"]), "not a flat map of strings"),
        ("plan=pro", "not JSON"),
    ],
)
def test_other_metadata_is_refused_not_a_crash(metadata: str, why: str) -> None:
    context, refused = client_context_of(proto.Job(id="AJ_1", metadata=metadata))
    assert (context, refused) == ({}, {"metadata": why})


def test_no_metadata_is_no_context() -> None:
    assert client_context_of(proto.Job(id="AJ_1")) == ({}, {})


def test_a_named_participants_attributes_come_first_and_metadata_overrides_them() -> None:
    job = proto.Job(
        id="AJ_1",
        metadata=json.dumps({"plan": "pro"}),
        participant=models.ParticipantInfo(identity="caller", attributes={"plan": "basic", "lang": "de"}),
    )
    assert client_context_of(job) == ({"plan": "pro", "lang": "de"}, {})


@pytest.mark.parametrize(
    ("argv", "env", "said"),
    [
        (["start"], {"LIVEKIT_API_KEY": "k", "LIVEKIT_API_SECRET": "s"}, "needs --url or LIVEKIT_URL"),
        (["start", "--url", "ws://127.0.0.1:9"], {}, "needs LIVEKIT_API_KEY and LIVEKIT_API_SECRET"),
        (
            ["start", "--url", "loopback://x"],
            {"LIVEKIT_API_KEY": "k", "LIVEKIT_API_SECRET": "s"},
            "a LiveKit URL is ws://",
        ),
    ],
)
def test_runner_start_refuses_what_it_cannot_use(argv: list[str], env: dict[str, str], said: str) -> None:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("LIVEKIT_")} | env
    done = subprocess.run(
        [sys.executable, "-m", "runner", *argv], capture_output=True, text=True, timeout=60, env=environ
    )
    assert done.returncode == 2, done.stderr
    assert said in done.stderr
    assert "curb-hosted" not in done.stdout


def test_a_redispatchs_own_keys_are_not_the_client_context() -> None:
    metadata = json.dumps({"plan": "pro", RESUMES_KEY: "agent-AJ_1", RESUMES_JOB_KEY: "AJ_1"})
    job = proto.Job(id="AJ_2", metadata=metadata)
    assert client_context_of(job) == ({"plan": "pro"}, {})
    assert resumes_of(job) == "agent-AJ_1"
    assert resumes_of(proto.Job(id="AJ_3", metadata=json.dumps({"plan": "pro"}))) == ""


def _turns(n: int, text: str) -> list[HistoryTurn]:
    return [HistoryTurn(role="user" if i % 2 else "assistant", text=f"{i} {text}") for i in range(n)]


def test_the_room_record_keeps_other_keys_and_the_newest_turns_within_its_bounds() -> None:
    record = {"v": 1, "state": "live", "agent": "agent-AJ_1", "job": "AJ_1"}
    # Within every bound: all of it, beside the app's own key.
    text, dropped = room_record({"app": {"theme": "dark"}}, record, _turns(3, "hello"))
    other, ours = parse_room_metadata(text)
    assert (other, dropped) == ({"app": {"theme": "dark"}}, 0)
    assert ours is not None and ours["agent"] == "agent-AJ_1"
    assert [t.text for t in history_of(ours)] == ["0 hello", "1 hello", "2 hello"]
    # 250 turns: the newest 200 (a resume's bound).
    text, dropped = room_record({}, record, _turns(250, "hi"))
    _, ours = parse_room_metadata(text)
    assert ours is not None and dropped == 50 and ours["dropped"] == 50
    assert history_of(ours)[0].text == "50 hi"
    # Long turns: the newest that fit the server's metadata bound, measured in bytes.
    text, dropped = room_record({}, record, _turns(40, "é" * 2000))
    _, ours = parse_room_metadata(text)
    assert ours is not None and sum(len(t.text.encode()) for t in history_of(ours)) <= 64 * 1024
    assert ours is not None and history_of(ours)[-1].text.startswith("39 ")
    assert dropped == 40 - len(ours["history"]) and dropped > 0
    text, _ = room_record({}, record, _turns(40, "é" * 2000), limit=10_000)
    assert len(text.encode()) <= 10_000


def test_room_metadata_that_is_not_ours_is_no_record() -> None:
    assert parse_room_metadata("") == ({}, None)
    assert parse_room_metadata("plain text") == ({}, None)
    assert parse_room_metadata(json.dumps({"a": 1})) == ({"a": 1}, None)
    assert parse_room_metadata(json.dumps({ROOM_KEY: "x"})) == ({}, None)
    assert history_of({"history": [{"role": "system", "text": "x"}, {"role": "user", "text": 3}, "x"]}) == []
