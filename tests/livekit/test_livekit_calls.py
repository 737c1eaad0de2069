"""Calls in real LiveKit rooms: a host places them on a runner, participants talk to the agent.

Everything runs in the test's network namespace: livekit-server, the runner (``runner
serve``, the LiveKit transport) and the participants (lk_peer.py, the livekit SDK, and
``runner.client`` for the app's side). The host is the test itself, over HTTP.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from array import array
from pathlib import Path
from typing import Any

import pytest
import trio
from lk_harness import LiveKitEnv, LiveKitServer, Peer, PeerError, find_livekit_server
from lk_runner import AGENT_IDENTITY, REPO, agent_spec, events, open_runner, turns, words

from runner.providers.espeak import EspeakTTS
from runner.providers.whisper import WhisperSTT
from runner.transports.livekit import RECONNECT_LIMIT_S

pytestmark = [pytest.mark.livekit, pytest.mark.slow]

# The caller speaks with espeak's US English f2 voice; the agent with hibari's "heart".
CLEAR_VOICE = "en-us+f2"
AGENT_VOICE = "heart"
SENTENCE = "Thank you very much, my name is John."
PROBE = Path(__file__).with_name("lk_transport_probe.py")


async def speech_file(path: Path, text: str, *, lead_s: float = 1.0, tail_s: float = 1.5) -> tuple[Path, int]:
    tts = EspeakTTS(CLEAR_VOICE)
    pcm = b"".join([chunk async for chunk in tts.synthesize(text)])
    rate = tts.sample_rate_hz
    path.write_bytes(bytes(2 * int(rate * lead_s)) + pcm + bytes(2 * int(rate * tail_s)))
    return path, rate


async def expect_refused(peer: Peer, op: str, **args: Any) -> dict[str, Any]:
    result = await peer.request(op, **args)
    assert result.get("failed") == "AgentRefusedError", result
    return result


async def test_a_host_call_in_a_livekit_room(livekit: LiveKitEnv, tmp_path: Path) -> None:
    room = livekit.unique_room("call")
    session_id = f"lk-{uuid.uuid4().hex[:8]}"
    async with open_runner(livekit, tmp_path / "journal.db") as host, livekit.peer("caller", room) as caller:
        await caller.request("publish_mic", rate=22_050)
        await caller.request("agent_connect")
        await caller.request("agent_on", key="pinged")

        started = await host.start_call(session_id, room, clientContext={"page": "pricing"})
        assert started.status == 202, started.body
        assert (started.body["accepted"], started.body["call"]["state"]) == (True, "connected")

        # The agent is in the room as an AGENT, and its voice track is there to hear.
        seen = await caller.request("wait_participant", identity=AGENT_IDENTITY)
        assert seen["kind"] == "PARTICIPANT_KIND_AGENT"
        await caller.request("record", identity=AGENT_IDENTITY)
        greeting = await caller.request("wait_speech", within=20, timeout=25)
        assert greeting["seconds"] > 0.3

        # runner.client: ask, send, the agent's message back, refusals, a settings change.
        asked = await caller.request("agent_ask", key="ping", payload={"n": 1})
        assert asked["reply"] == {"pong": 1}
        pinged = await caller.expect("agent_message", key="pinged")
        assert pinged["payload"] == {"count": 1, "echo": {"n": 1}}
        assert (await caller.request("agent_send", key="ping", payload={"n": 2})).get("failed") is None
        assert (await caller.expect("agent_message", key="pinged"))["payload"]["count"] == 2
        quote = await caller.request("agent_ask", key="quote", payload={"plan": "basic"}, within=5)
        assert quote["reply"] == {"plan": "basic", "price": 17}

        invalid = await expect_refused(caller, "agent_send", key="quote", payload={"plan": 3})
        assert invalid["code"] == "invalid_payload"
        assert invalid["issues"] and invalid["issues"][0]["path"] == ["plan"]
        assert (await expect_refused(caller, "agent_send", key="nobody-listens"))["code"] == "no_handler"
        assert (await expect_refused(caller, "agent_send", key="boom"))["code"] == "handler_failed"
        too_large = await expect_refused(caller, "agent_send", key="ping", payload={"blob": "x" * 16_000})
        assert too_large["code"] == "payload_too_large"
        not_adjustable = await expect_refused(caller, "agent_update", settings={"stt": {"language": "de"}})
        assert (not_adjustable["code"], not_adjustable["path"]) == ("not_adjustable", "stt.language")
        updated = await caller.request("agent_update", settings={"tts": {"voice": AGENT_VOICE}})
        assert updated["settings"]["tts"]["voice"] == AGENT_VOICE
        await caller.request("agent_close")

        # The same wire with the plain SDK, as the seed's livekit-client example does it.
        await caller.request("register_text", topic="curb.message")
        raw = await caller.request(
            "perform_rpc",
            destination=AGENT_IDENTITY,
            method="curb.message",
            payload=json.dumps({"key": "ping", "id": str(uuid.uuid4()), "payload": {"n": 3}}),
        )
        assert json.loads(raw["response"]) == {"reply": {"pong": 3}}
        text = await caller.expect("text_received", topic="curb.message")
        assert text["sender"] == AGENT_IDENTITY
        assert json.loads(text["text"]) == {"key": "pinged", "payload": {"count": 3, "echo": {"n": 3}}}
        with pytest.raises(PeerError) as refused:
            await caller.request(
                "perform_rpc",
                destination=AGENT_IDENTITY,
                method="curb.message",
                payload=json.dumps({"key": "nobody-listens", "id": "r-2", "payload": {}}),
            )
        assert refused.value.result is not None
        assert (refused.value.result["code"], refused.value.result["error"]) == (1500, "no_handler")
        with pytest.raises(PeerError) as refused:
            await caller.request(
                "perform_rpc",
                destination=AGENT_IDENTITY,
                method="curb.update",
                payload=json.dumps({"tts": {"voice": 7}}),
            )
        assert refused.value.result is not None
        assert refused.value.result["error"] == "invalid_settings"
        assert json.loads(refused.value.result["data"])["issues"]

        # Speech: the caller says a sentence; the agent hears it and answers out loud.
        path, rate = await speech_file(tmp_path / "sentence.pcm", SENTENCE)
        said = await caller.request("play", path=str(path), rate=rate, timeout=20)
        reply = await caller.request(
            "wait_speech",
            after=said["ended_at"] - 1.4,
            within=25,
            path=str(tmp_path / "reply.pcm"),
            timeout=30,
        )
        assert reply["first_loud_at"] > said["ended_at"] - 1.5
        heard = await WhisperSTT().transcribe(Path(reply["path"]).read_bytes(), reply["rate"])

        # A transfer target joins: the agent stops; it leaves: the agent takes the call back.
        async with livekit.peer("desk", room, attributes={"curb.role": "transfer_target"}) as desk:
            await desk.request("publish_mic")  # a publisher's join reaches the room at once
            await host.read_until(session_id, lambda r: "target_joined" in json.dumps(r["body"]), timeout=10)
        await host.read_until(session_id, lambda r: "agent_resumed" in json.dumps(r["body"]), timeout=10)

        # The host ends the call with grace: the agent leaves the room.
        stopped = await host.stop_call(session_id, reason="host_done", grace_ms=2000)
        assert stopped.status == 200 and stopped.body == {"sessionId": session_id, "stopped": True}
        await caller.request("wait_gone", identity=AGENT_IDENTITY, within=10)

        records = await host.read_call(session_id)

    # The events stream carries the whole conversation.
    assert events(records, "curb.started")[0]["transport"] == "livekit"
    assert events(records, "curb.started")[0]["clientContext"] == {"page": "pricing"}
    delivered = [(m["key"], m["outcome"]) for m in events(records, "curb.message")]
    assert delivered[:4] == [
        ("ping", "delivered"),
        ("ping", "delivered"),
        ("quote", "delivered"),
        ("quote", "invalid_payload"),
    ]
    assert ("nobody-listens", "no_handler") in delivered and ("boom", "handler_failed") in delivered
    assert ("ping", "delivered") in delivered[4:]
    settings = [(s["origin"], s["outcome"]) for s in events(records, "curb.settings")]
    assert settings == [("client", "not_adjustable"), ("client", "accepted"), ("client", "invalid_settings")]
    assert [m["key"] for m in events(records, "curb.toClient")] == ["pinged", "pinged", "pinged"]
    assert [t["state"] for t in events(records, "curb.transfer")] == ["target_joined", "agent_resumed"]
    assert events(records, "curb.ended") == [{"reason": "host_done"}]
    assert events(records, "curb.messages")[0]["undeliveredToClient"] == {}

    user = [t for t in turns(records, "user") if t["spoken"]]
    assert len(user) == 1, turns(records, "user")
    assert len(words(user[0]["text"]) & words(SENTENCE)) >= 3, user[0]["text"]
    said_back = turns(records, "assistant")
    assert said_back[0]["text"] == "Hello there."
    answer = next(t for t in said_back if t["turn"] == user[0]["turn"])
    assert answer["chunksSpoken"] >= 1 and not answer["interrupted"]
    # What the caller heard is what the agent said.
    assert len(words(heard.text) & words(answer["text"])) >= 3, (heard.text, answer["text"])


async def test_a_bad_token_or_url_is_start_failed(livekit: LiveKitEnv, tmp_path: Path) -> None:
    room = livekit.unique_room("bad")
    async with open_runner(livekit, tmp_path / "journal.db") as host:
        bad_token = await host.request(
            "POST",
            "/v1/sessions",
            {"sessionId": "bad-token", "realtimeUrl": livekit.url, "realtimeToken": "not-a-jwt"},
        )
        assert bad_token.status == 502, bad_token.body
        assert bad_token.body["error"] == "start_failed"
        assert "401" in bad_token.body["detail"] or "unauthorized" in bad_token.body["detail"].lower()

        unreachable = f"ws://{livekit.host}:9"
        bad_url = await host.request(
            "POST",
            "/v1/sessions",
            {
                "sessionId": "bad-url",
                "realtimeUrl": unreachable,
                "realtimeToken": livekit.token(AGENT_IDENTITY, room, agent=True),
            },
        )
        assert bad_url.status == 502, bad_url.body
        assert bad_url.body["error"] == "start_failed"
        assert unreachable in bad_url.body["detail"]

        status = await host.request("GET", "/v1/runner")
        assert status.body["activeSessions"] == 0
        ended = await host.read_call("bad-url")
        assert events(ended, "curb.ended")[0]["reason"].startswith(
            "start_failed: could not join the LiveKit room"
        )

        # The runner still places calls.
        async with livekit.peer("caller", room) as caller:
            assert (await host.start_call("good", room)).status == 202
            await caller.request("wait_participant", identity=AGENT_IDENTITY)


async def test_a_ringing_phone_hears_the_greeting_once_it_is_answered(
    livekit: LiveKitEnv, tmp_path: Path
) -> None:
    # A phone as LiveKit's SIP service puts one in the room: kind SIP, sip.callStatus ringing
    # until the service answers it (here the control participant says so, as the service does).
    room = livekit.unique_room("ringing")
    phone_id = "sip_+15550100"
    async with (
        open_runner(livekit, tmp_path / "journal.db") as host,
        livekit.peer("control", livekit.unique_room("control")) as control,
        livekit.peer(phone_id, room, kind="sip", attributes={"sip.callStatus": "ringing"}) as phone,
    ):
        await phone.request("publish_mic")
        assert (await host.start_call("ringing", room)).status == 202
        await phone.request("wait_participant", identity=AGENT_IDENTITY)
        await phone.request("record", identity=AGENT_IDENTITY)
        # While it rings, the agent keeps its opening line.
        with pytest.raises(PeerError):
            await phone.request("wait_speech", within=6, timeout=10)
        answered_at = time.monotonic()
        await control.request(
            "set_attributes", room=room, identity=phone_id, attributes={"sip.callStatus": "active"}
        )
        greeting = await phone.request("wait_speech", after=answered_at, within=20, timeout=25)
        assert greeting["first_loud_at"] > answered_at
        assert (await host.stop_call("ringing")).status == 200
        records = await host.read_call("ringing")
    assert turns(records, "assistant")[0]["text"] == "Hello there."


async def test_a_phone_caller_and_a_second_phone_is_a_transfer_target(
    livekit: LiveKitEnv, tmp_path: Path
) -> None:
    room = livekit.unique_room("phone")
    async with (
        open_runner(livekit, tmp_path / "journal.db", agent=agent_spec("quiet")) as host,
        livekit.peer("+15550100", room, kind="sip") as phone,
    ):
        assert phone.info["kind"] == "PARTICIPANT_KIND_SIP"
        assert (await host.start_call("phone", room)).status == 202
        await phone.request("wait_participant", identity=AGENT_IDENTITY)
        # A phone has no data channel: the agent's message to the app is dropped and counted.
        notice = {"id": "m-1", "name": "ops.notice", "payload": {"text": "hold on"}}
        answered = await host.request("POST", "/v1/sessions/phone/messages", notice)
        assert answered.status == 202, answered.body
        async with livekit.peer("+15550199", room, kind="sip") as second:
            await second.request("publish_mic")
            await host.read_until("phone", lambda r: "target_joined" in json.dumps(r["body"]), timeout=10)
        await host.read_until("phone", lambda r: "agent_resumed" in json.dumps(r["body"]), timeout=10)
        assert (await host.stop_call("phone")).status == 200
        records = await host.read_call("phone")
    transfers = events(records, "curb.transfer")
    assert [(t["state"], t["identity"]) for t in transfers] == [
        ("target_joined", "+15550199"),
        ("agent_resumed", "+15550199"),
    ]
    assert events(records, "curb.messages")[0]["undeliveredToClient"] == {"notice": 1}


async def test_a_caller_that_leaves_ends_the_call_and_a_removed_agent_is_disconnected(
    livekit: LiveKitEnv, tmp_path: Path
) -> None:
    room = livekit.unique_room("gone")
    async with open_runner(
        livekit, tmp_path / "journal.db", "--max-sessions", "2", agent=agent_spec("quiet")
    ) as host:
        async with livekit.peer("caller", room) as caller:
            await caller.request("publish_mic")
            assert (await host.start_call("left", room)).status == 202
            await caller.request("wait_participant", identity=AGENT_IDENTITY)
        left = await host.read_call("left", timeout=15)
        assert events(left, "curb.ended") == [{"reason": "caller_left"}]

        room2 = livekit.unique_room("removed")
        async with livekit.peer("caller", room2) as caller:
            assert (await host.start_call("removed", room2)).status == 202
            await caller.request("wait_participant", identity=AGENT_IDENTITY)
            with trio.fail_after(10):
                await caller.request("remove_participant", identity=AGENT_IDENTITY)
                removed = await host.read_call("removed")
        assert events(removed, "curb.ended") == [{"reason": "disconnected: PARTICIPANT_REMOVED"}]
        status = await host.request("GET", "/v1/runner")
        assert status.body["activeSessions"] == 0


async def test_a_request_with_no_agent_in_the_room_is_agent_unavailable(livekit: LiveKitEnv) -> None:
    async with livekit.peer("app", livekit.unique_room("empty")) as app:
        await app.request("agent_connect")
        before = trio.current_time()
        result = await app.request("agent_ask", key="ping", payload={}, within=1)
        assert result["failed"] == "AgentUnavailableError"
        assert trio.current_time() - before < 5


async def test_the_caller_talks_over_the_agent_and_its_voice_stops(
    livekit: LiveKitEnv, tmp_path: Path
) -> None:
    room = livekit.unique_room("barge")
    async with (
        open_runner(livekit, tmp_path / "journal.db", agent=agent_spec("talker")) as host,
        livekit.peer("caller", room) as caller,
    ):
        await caller.request("publish_mic", rate=22_050)
        assert (await host.start_call("barge", room)).status == 202
        await caller.request("record", identity=AGENT_IDENTITY)
        # Let the long greeting run for a while, then talk over it.
        await caller.request("wait_speech", within=10, silence_ms=0, timeout=15)
        await trio.sleep(2.0)
        path, rate = await speech_file(tmp_path / "over.pcm", SENTENCE, lead_s=0.3, tail_s=1.0)
        said = await caller.request("play", path=str(path), rate=rate, timeout=20)
        speech_started = said["started_at"] + 0.3
        quiet = await caller.request("wait_quiet", after=speech_started, quiet_ms=1000, within=10, timeout=15)
        # It answers what it heard once the caller is done.
        await caller.request("wait_speech", after=said["ended_at"] - 1.0, within=20, timeout=25)
        assert (await host.stop_call("barge")).status == 200
        records = await host.read_call("barge")

    # None: not one loud frame after the caller began (the barge-in fell between two of the
    # voice's sentences, whose gap is about 0.75 s); a voice that went on would be loud again.
    stopped_after = (quiet["last_loud_at"] or speech_started) - speech_started
    assert stopped_after < 1.5, f"the agent talked on for {stopped_after:.2f} s"
    greeting, *rest = turns(records, "assistant")
    assert greeting["interrupted"] and greeting["reason"] == "barge_in", greeting
    assert "did not work" not in greeting["text"] or greeting["chunksSpoken"] < 5
    assert rest and not rest[0]["interrupted"]


async def test_a_typed_turn_on_lk_chat(livekit: LiveKitEnv, tmp_path: Path) -> None:
    room = livekit.unique_room("chat")
    async with (
        open_runner(livekit, tmp_path / "journal.db", agent=agent_spec("quiet")) as host,
        livekit.peer("caller", room) as caller,
    ):
        assert (await host.start_call("chat", room)).status == 202
        await caller.request("wait_participant", identity=AGENT_IDENTITY)
        await caller.request("send_text", text="Who are you?", topic="lk.chat")
        records = await host.read_until("chat", lambda r: r["body"].get("role") == "assistant", timeout=10)
        assert (await host.stop_call("chat")).status == 200
    (user,) = turns(records, "user")
    assert (user["text"], user["spoken"]) == ("Who are you?", False)


async def test_the_runner_drains_on_sigterm_and_the_agent_leaves(livekit: LiveKitEnv, tmp_path: Path) -> None:
    room = livekit.unique_room("drain")
    async with (
        open_runner(
            livekit, tmp_path / "journal.db", "--drain-grace-ms", "300", agent=agent_spec("quiet")
        ) as host,
        livekit.peer("caller", room) as caller,
    ):
        assert (await host.start_call("drain", room)).status == 202
        await caller.request("wait_participant", identity=AGENT_IDENTITY)
        host.runner.signal(signal.SIGTERM)
        assert await host.runner.wait_exit(timeout=15) == 0
        await caller.request("wait_gone", identity=AGENT_IDENTITY, within=10)
    lifecycle = [e["event"] for e in host.runner.lifecycle]
    assert lifecycle == ["ready", "draining", "ended"]
    assert "lost the LiveKit room" not in "\n".join(host.runner.stderr)


async def test_a_lost_server_ends_the_call_and_the_runner_lives_on(tmp_path: Path) -> None:
    # A server of its own (its own namespace), to kill in the middle of a call.
    binary = find_livekit_server()
    assert binary is not None
    server = LiveKitServer(binary, tmp_path / "server")
    await trio.to_thread.run_sync(server.start)
    env = LiveKitEnv(server, tmp_path)
    try:
        room = env.unique_room("lost")
        async with (
            open_runner(env, tmp_path / "journal.db", agent=agent_spec("quiet")) as host,
            env.peer("caller", room) as caller,
        ):
            assert (await host.start_call("lost", room)).status == 202
            await caller.request("wait_participant", identity=AGENT_IDENTITY)
            assert server.proc is not None
            server.proc.kill()
            began = trio.current_time()
            records = await host.read_call("lost", timeout=RECONNECT_LIMIT_S + 10)
            took = trio.current_time() - began
            status = await host.request("GET", "/v1/runner")
        assert events(records, "curb.ended")[0]["reason"].startswith("disconnected: ")
        assert took < RECONNECT_LIMIT_S + 5
        assert status.body["activeSessions"] == 0
    finally:
        await env.aclose()
        await trio.to_thread.run_sync(server.stop)


async def test_the_transport_alone(livekit: LiveKitEnv, tmp_path: Path) -> None:
    room = livekit.unique_room("probe")
    async with livekit.peer("caller", room) as caller:
        await caller.request("publish_mic", rate=48_000)
        await caller.request("register_text", topic="curb.message")
        with (tmp_path / "probe.stderr").open("wb") as stderr:
            probe = await livekit.open_process(
                [sys.executable, PROBE, "--url", livekit.url],
                stdout=subprocess.PIPE,
                stderr=stderr,
                env=livekit.env(
                    {
                        "LK_PROBE_TOKEN": livekit.token(AGENT_IDENTITY, room, agent=True),
                        "PYTHONUNBUFFERED": "1",
                    }
                ),
                cwd=str(REPO),
            )
        lines = ProbeLines(probe)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lines.pump)
            joined = await lines.expect("joined")
            # The caller was there first: it is reported before the session is handed over.
            assert (joined["identity"], joined["room"], joined["reachable"]) == (AGENT_IDENTITY, room, "ok")
            participant = await lines.expect("participant")
            assert participant == {
                **participant,
                "change": "joined",
                "identity": "caller",
                "kind": "caller",
                "reachable": "ok",
            }
            await caller.request("record", identity=AGENT_IDENTITY)
            await lines.expect("sent")
            text = await caller.expect("text_received", topic="curb.message")
            assert json.loads(text["text"]) == {"key": "probe", "payload": {"n": 1}}
            played = await lines.expect("played", timeout=10)
            # The clear stops the tone: it was published for 1 s of its 4.
            assert played["returned_at"] - played["cleared_at"] < 0.5
            quiet = await caller.request("wait_quiet", after=played["started_at"], quiet_ms=1000, within=8)
            assert quiet["last_loud_at"] - played["cleared_at"] < 0.6
            # The caller's microphone reaches the session as 16 kHz mono PCM in 10 ms frames.
            await caller.request("play", path=str(await tone_file(tmp_path)), rate=48_000)
            audio = await lines.expect("audio")
            assert (audio["rate"], audio["bytes"]) == (16_000, 16_000 * 2 * 10 // 1000)
            await caller.send({"id": 0, "op": "quit"})
            left = await lines.expect("participant", timeout=10)
            assert (left["change"], left["identity"], left["reachable"]) == ("left", "caller", "no_app")
            done = await lines.expect("left", timeout=10)
            assert done["threads"] == []
            nursery.cancel_scope.cancel()
        with trio.fail_after(10):
            assert await probe.wait() == 0


async def tone_file(tmp_path: Path) -> Path:
    path = tmp_path / "tone.pcm"
    path.write_bytes(
        bytes(48_000 * 2 // 2)
        + bytes(array("h", (8_000 if (i // 55) % 2 else -8_000 for i in range(48_000))))
    )
    return path


class ProbeLines:
    """JSON lines from lk_transport_probe.py."""

    def __init__(self, process: trio.Process) -> None:
        self.process = process
        self.seen: list[dict[str, Any]] = []
        self._changed = trio.Event()

    async def pump(self) -> None:
        assert self.process.stdout is not None
        buffer = b""
        async for chunk in self.process.stdout:
            buffer += chunk
            *complete, buffer = buffer.split(b"\n")
            self.seen.extend(json.loads(line) for line in complete if line.strip())
            self._changed.set()
            self._changed = trio.Event()

    async def expect(self, event: str, *, timeout: float = 15) -> dict[str, Any]:
        with trio.fail_after(timeout):
            while True:
                for i, line in enumerate(self.seen):
                    if line["event"] == event:
                        return self.seen.pop(i)
                await self._changed.wait()


async def test_a_stop_with_grace_lets_the_agent_finish_its_sentence(
    livekit: LiveKitEnv, tmp_path: Path
) -> None:
    room = livekit.unique_room("grace")
    async with open_runner(livekit, tmp_path / "journal.db") as host, livekit.peer("caller", room) as caller:
        assert (await host.start_call("grace", room)).status == 202
        await caller.request("record", identity=AGENT_IDENTITY)
        speaking = await caller.request("wait_speech", within=10, silence_ms=0, timeout=15)
        stopped = await host.stop_call("grace", reason="host_done", grace_ms=5000)
        assert stopped.status == 200
        gone = await caller.request("wait_gone", identity=AGENT_IDENTITY, within=10)
        heard = await caller.request(
            "wait_quiet", after=speaking["first_loud_at"] - 0.1, quiet_ms=300, within=5
        )
        records = await host.read_call("grace")
    (greeting,) = turns(records, "assistant")
    assert greeting["text"] == "Hello there." and not greeting["interrupted"]
    # The whole sentence reached the caller, though the stop came as it began.
    tts = EspeakTTS("en")
    said = array("h", b"".join([chunk async for chunk in tts.synthesize("Hello there.")]))
    loud = [i for i, x in enumerate(said) if abs(x) > 1_000]
    spoken_s = (loud[-1] - loud[0]) / tts.sample_rate_hz
    assert heard["last_loud_at"] - speaking["first_loud_at"] > 0.8 * spoken_s
    assert gone["at"] > speaking["first_loud_at"] + 0.8 * spoken_s
