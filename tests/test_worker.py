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

from runner.worker import agent_url, client_context_of, room_url


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
