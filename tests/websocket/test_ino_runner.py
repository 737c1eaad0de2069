"""The agent WebSocket as the runner's calls: capacity, drain, idle close, host messages,
live settings, the journal, provider failures, and conversations that outlive sockets and
restarts. Most tests start a runner of their own, for its flags or its agent.
"""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import trio

from ..runner_process import read_stream
from ..test_logs import refusing_url
from .ino_agents import GREETING
from .ino_client import API_KEY, Addresses, connect, open_socket, start_ino_runner
from .test_ino_conformance import types
from .test_ino_spoken import RATE, speech

pytestmark = pytest.mark.slow


async def _auth_close(addresses: Addresses, token: str, session_id: str) -> tuple[int | None, str | None]:
    async with open_socket(addresses, session_id) as sock:
        await sock.send("auth", key=token, session_id=session_id)
        return await sock.closed()


async def _sessions(addresses: Addresses) -> list[dict[str, Any]]:
    async with addresses.management_client() as host:
        return (await host.get("/v1/runner")).json()["sessions"]


async def test_4013_when_the_runner_is_full(tmp_path: Path) -> None:
    async with start_ino_runner(tmp_path / "j.db", "--max-sessions", "1") as (_, addresses):
        api = addresses.api()
        token, session_id = await api.person("eu-full")
        other_token, other_session = await api.person("eu-full-2")
        async with connect(addresses, token, session_id):
            assert await _auth_close(addresses, other_token, other_session) == (
                4013,
                "runner full: it holds 1 calls",
            )
            # Another socket on the conversation already held is the same call: it fits.
            async with connect(addresses, token, session_id) as second:
                assert second.ready["greeting"] is False
        # The call ended with its sockets: now the other conversation fits.
        with trio.fail_after(10):
            while await _sessions(addresses):
                await trio.sleep(0.05)
        async with connect(addresses, other_token, other_session) as sock:
            assert sock.ready["session_id"] == other_session


async def test_a_draining_runner_closes_idle_sockets_and_lets_running_turns_finish(tmp_path: Path) -> None:
    async with start_ino_runner(tmp_path / "j.db", "--max-sessions", "4", "--drain-grace-ms", "20000") as (
        runner,
        addresses,
    ):
        api = addresses.api()
        idle_person = await api.person("eu-idle")
        busy_person = await api.person("eu-busy")
        late_person = await api.person("eu-late")
        async with (
            connect(addresses, *idle_person) as idle,
            connect(addresses, *busy_person, tools=["open_page"]) as busy,
        ):
            await busy.send("user_message", text="Please open page spa")
            call = (await busy.until_type("tool.call"))[-1]
            async with addresses.management_client() as host:
                assert (await host.post("/v1/runner/drain")).status_code == 202
            assert await idle.closed() == (4013, "runner draining")
            assert await _auth_close(addresses, *late_person) == (4013, "runner draining")
            # The running turn finishes, then its socket is closed the same way.
            await busy.send("tool.result", call_id=call["call_id"], result="open")
            frames = await busy.turn_end()
            assert frames[-1]["type"] == "turn.done"
            assert await busy.closed() == (4013, "runner draining")
            busy.checker.finish()
        assert await runner.wait_exit() == 0
    assert [e["event"] for e in runner.lifecycle] == ["ready", "draining", "ended"]


async def test_4007_after_idle_seconds_and_ping_does_not_count(tmp_path: Path) -> None:
    async with start_ino_runner(tmp_path / "j.db", "--agent-idle-seconds", "1", agent="text_only") as (
        _,
        addresses,
    ):
        token, session_id = await addresses.api().person()
        async with connect(addresses, token, session_id) as sock:
            assert sock.ready["idle_seconds"] == 1
            await sock.say("When is checkout?")  # activity
            began = trio.current_time()

            async def ping() -> None:
                for _ in range(20):
                    await sock.send("ping")
                    await trio.sleep(0.2)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(ping)
                code, reason = await sock.closed(timeout=5)
                nursery.cancel_scope.cancel()
            assert (code, reason) == (4007, "closed after 1 seconds with no activity; ping does not count")
            assert 0.9 <= trio.current_time() - began <= 3
            assert sock.checker.of_type("pong")


async def test_an_agent_with_no_voice_or_ears(tmp_path: Path) -> None:
    async with start_ino_runner(tmp_path / "j.db", agent="text_only") as (_, addresses):
        token, session_id = await addresses.api().person()
        async with connect(addresses, token, session_id) as sock:
            assert (sock.ready["speaks"], sock.ready["greeting"]) == (False, False)
            frames = await sock.say("When is checkout?", speech=True)
            error = next(f for f in frames if f["type"] == "error")
            assert (error["code"], error["stage"], error["turn"]) == (
                "unavailable",
                "speech",
                frames[0]["turn"],
            )
            assert frames[-1]["type"] == "turn.done" and frames[-1]["message"].startswith(
                "Checkout is at noon"
            )
            assert "audio.start" not in types(frames)
            await sock.send("user_audio.start", rate=RATE)
            assert await sock.closed() == (4010, "this agent does not hear speech: it has no recognizer")
            sock.checker.finish()


async def test_provider_failed_for_speech_and_for_transcription(tmp_path: Path) -> None:
    pcm = await speech()
    # Warm-up needs a key; every request then fails to connect (through a proxy that refuses).
    with refusing_url() as proxy:
        env = {"OPENAI_API_KEY": "sk-not-a-key", "HTTPS_PROXY": proxy.removesuffix("/v1")}
        async with start_ino_runner(tmp_path / "j.db", agent="failing_voice", env=env) as (_, addresses):
            await _speech_and_transcription_fail(addresses, pcm)


async def _speech_and_transcription_fail(addresses: Addresses, pcm: bytes) -> None:
    token, session_id = await addresses.api().person()
    async with connect(addresses, token, session_id) as sock:
        assert sock.ready["audio"]["sample_rate"] == 24000
        # The voice fails on every chunk: errors with stage speech, and the text turn carries on.
        frames = await sock.say("When is checkout?")
        errors = [f for f in frames if f["type"] == "error"]
        assert errors and all(
            (e["code"], e["stage"], e["turn"]) == ("provider_failed", "speech", frames[0]["turn"])
            for e in errors
        )
        assert [e["chunk"] for e in errors] == [f["chunk"] for f in frames if f["type"] == "text.chunk"]
        assert frames[-1]["type"] == "turn.done" and frames[-1]["chunks_spoken"] == 0
        # A transcribe_only recording fails with its request_id and recording_id.
        await sock.send("user_audio.start", rate=RATE, recording_id="r1")
        await sock.send_raw(pcm)
        await sock.send("user_audio.end", transcribe_only=True)
        error = (await sock.until_type("error"))[-1]
        assert (error["code"], error["stage"], error["recording_id"], error["turn"]) == (
            "provider_failed",
            "transcription",
            "r1",
            None,
        )
        assert error["request_id"].startswith("req_")
        # A spoken turn whose transcription fails: error, then interrupted, naming it.
        await sock.send("user_audio.start", rate=RATE)
        await sock.send_raw(pcm)
        await sock.send("user_audio.end")
        frames = await sock.turn_end()
        assert types(frames)[-2:] == ["error", "interrupted"]
        assert (frames[-2]["stage"], frames[-2]["turn"]) == ("transcription", frames[-1]["turn"])
        assert frames[-1]["reason"] == "provider_failed" and frames[-1]["message"] == ""
        sock.checker.finish()


async def test_a_socket_is_a_call_of_the_runner(speaking: Addresses) -> None:
    """Listed by the host, journaled under the conversation id, with host messages and PATCH."""
    api = speaking.api()
    token, session_id = await api.person()
    async with speaking.management_client() as host, connect(speaking, token, session_id) as sock:
        live = [s for s in (await host.get("/v1/runner")).json()["sessions"] if s["sessionId"] == session_id]
        assert len(live) == 1 and live[0]["state"] == "connected"
        answer = await host.post(
            f"/v1/sessions/{session_id}/messages", json={"id": "m1", "name": "note", "payload": {"room": 12}}
        )
        assert (answer.status_code, answer.json()) == (202, {"id": "m1", "delivered": True})
        patched = await host.patch(f"/v1/sessions/{session_id}", json={"tts": {"voice": "heart"}})
        assert patched.status_code == 200 and patched.json()["settings"]["tts"]["voice"] == "heart"
        frames = await sock.say("When is checkout?")
        assert frames[-1]["chunks_spoken"] == 1
        # A model switched by the host fails its first call here (no key): error, then interrupted.
        patched = await host.patch(
            f"/v1/sessions/{session_id}", json={"llm": {"provider": "openai", "model": "gpt-4o-mini"}}
        )
        assert patched.status_code == 200
        frames = await sock.say("When is checkout?")
        assert types(frames)[-2:] == ["error", "interrupted"]
        assert (frames[-2]["code"], frames[-2]["stage"]) == ("provider_failed", "model")
        assert frames[-1]["reason"] == "provider_failed" and "unauthorized" in frames[-2]["message"]
        sock.checker.finish()
    lines = await read_stream(
        SimpleNamespace(address=speaking.management),
        "from=0",
        until=lambda ls: any(
            line["producer"] == session_id and line["body"].get("name") == "curb.ended" for line in ls
        ),
        timeout=15,
    )
    mine = [line["body"] for line in lines if line["producer"] == session_id]
    assert mine[0]["name"] == "curb.started" and mine[0]["payload"]["transport"] == "ino"
    said = [(b["role"], b["text"]) for b in mine if b.get("type") == "turn"]
    assert said[:3] == [
        ("assistant", GREETING),
        ("user", "When is checkout?"),
        ("assistant", "Checkout is at noon, and late checkout costs twenty euros."),
    ]
    names = [b.get("name") for b in mine if b.get("type") == "event"]
    assert "curb.message" in names and "curb.settings" in names
    assert (
        mine[-1]["name"] == "curb.ended"
        and mine[-1]["payload"]["reason"] == "disconnected: the last socket closed"
    )


async def test_a_conversation_continues_on_a_new_socket_and_after_a_restart(tmp_path: Path) -> None:
    journal = tmp_path / "j.db"
    async with start_ino_runner(journal) as (runner, addresses):
        api = addresses.api()
        token, session_id = await api.person("eu-memory", ttl_seconds=3600)
        async with connect(addresses, token, session_id) as sock:
            first = (await sock.say("When is checkout?"))[-1]
        async with connect(addresses, token, session_id) as sock:
            assert sock.ready["greeting"] is False  # not a new conversation: no opening line
            again = (await sock.say("When is checkout?"))[-1]
        # The model read the earlier messages: the same question costs more input.
        assert again["input_tokens"] > first["input_tokens"]
        runner.signal(signal.SIGTERM)
        assert await runner.wait_exit() == 0
    async with start_ino_runner(journal) as (_, addresses):
        async with connect(addresses, token, session_id) as sock:
            assert sock.ready["greeting"] is False
            after = (await sock.say("When is checkout?"))[-1]
        assert after["input_tokens"] > again["input_tokens"]
        messages = await addresses.api().messages(session_id, token)
        assert [m["role"] for m in messages] == ["assistant"] + ["user", "assistant"] * 3
        assert [m["position"] for m in messages] == sorted(m["position"] for m in messages)
        assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", m["created_at"]) for m in messages)


async def test_the_public_rest(speaking: Addresses) -> None:
    api = speaking.api()
    minted = await api.mint()
    assert re.fullmatch(r"eu_[A-Za-z0-9]{16}", minted["end_user_id"])
    assert set(minted) == {"token", "end_user_id", "scope", "expires_at"} and minted["scope"] == "agent"
    assert re.fullmatch(r"ek_[0-9a-f]{16}_\S+", minted["token"])
    for bearer in (None, "wrong", minted["token"]):
        answer = await api.request("POST", "/v1/ephemeral-keys", bearer=bearer, json_body={})
        assert (answer.status_code, answer.json()) == (401, {"error": "unauthorized"})
    for body, problem in [
        ({"ttl_seconds": 0}, "ttl_seconds must be 1 to 86400"),
        ({"ttl_seconds": 86_401}, "ttl_seconds must be 1 to 86400"),
        ({"colour": "red"}, "unknown field 'colour'"),
        ({"end_user_id": 7}, "end_user_id must be a string"),
        ({"credit_limit": -1}, "credit_limit must not be negative"),
    ]:
        answer = await api.request("POST", "/v1/ephemeral-keys", bearer=API_KEY, json_body=body)
        assert answer.status_code == 400 and answer.json()["error"] == "invalid_request", body
        assert problem in answer.json()["detail"], answer.json()
    # A body that is not UTF-8 once failed outside the body's check: a 500 (tests/fuzz/test_public.py).
    for path, bearer in (("/v1/ephemeral-keys", API_KEY), ("/v1/agent/sessions", minted["token"])):
        answer = await api.request("POST", path, bearer=bearer, content=b"\xff{}")
        assert (answer.status_code, answer.json()["error"]) == (400, "invalid_request"), path
    session = await api.session(minted["token"])
    assert set(session) == {"session_id", "agent_id", "end_user_id", "created_at"}
    assert session["end_user_id"] == minted["end_user_id"]
    assert re.fullmatch(
        r"[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", session["session_id"]
    )
    # Only a token makes a conversation; the API key reads and deletes any.
    answer = await api.request("POST", "/v1/agent/sessions", bearer=API_KEY, json_body={})
    assert answer.status_code == 401
    assert [m["text"] for m in await api.messages(session["session_id"], API_KEY)] == []
    answer = await api.request("GET", "/v1/agent/nope", bearer=API_KEY)
    assert (answer.status_code, answer.json()["error"]) == (404, "not_found")
    deleted = await api.delete(session["session_id"], API_KEY)
    assert deleted.json() == {"session_id": session["session_id"], "deleted": True}
    assert (
        json.loads(
            (
                await api.request(
                    "GET", f"/v1/agent/sessions/{session['session_id']}/messages", bearer=API_KEY
                )
            ).text
        )["error"]
        == "not_found"
    )
