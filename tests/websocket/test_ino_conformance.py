"""The agent WebSocket of a real runner process, driven by a real WebSocket client.

One test per verb, event, error code and close code of ``seeds/002`` that this runner
serves. Every frame of every test goes through :class:`FrameChecker` (schema, gapless seq,
turn order, audio windows), so each test also checks the stream it got.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio

from .ino_agents import GREETING
from .ino_client import API_KEY, Addresses, connect, open_socket

pytestmark = pytest.mark.slow


def types(frames: list[dict[str, Any]]) -> list[str]:
    return [f["type"] for f in frames]


async def _closed_with(
    addresses: Addresses, session_id: str | None, *frames: str | bytes, subprotocols: list[str] | None = None
) -> tuple[int | None, str | None]:
    async with open_socket(addresses, session_id, subprotocols=subprotocols) as sock:
        for frame in frames:
            await sock.send_raw(frame)
        return await sock.closed()


# -- Connecting: ready, and every way auth fails --------------------------------------------


async def test_ready_has_every_field_and_the_greeting_turn_is_already_running(speaking: Addresses) -> None:
    api = speaking.api()
    minted = await api.mint("eu-ready")
    session = await api.session(minted["token"])
    async with connect(speaking, minted["token"], session["session_id"], idle=False) as sock:
        ready = sock.ready
        assert ready == {
            "type": "ready",
            "seq": 1,
            "protocol": "ino.v2",
            "session_id": session["session_id"],
            "agent_id": session["agent_id"],
            "end_user_id": "eu-ready",
            "speaks": True,
            "audio": {"codec": "pcm_s16le", "sample_rate": 24000, "channels": 1},
            "hearing": {"codec": "pcm_s16le", "sample_rate": 16000, "channels": 1},
            "emotion": False,
            "relation": None,
            "greeting": True,
            "idle_seconds": 300,
            "edge_version": ready["edge_version"],
        }
        assert ready["edge_version"]
        # The greeting turn started the moment ready was written: a message now is refused.
        await sock.send("user_message", text="What time is breakfast?")
        frames = await sock.turn_end()
        assert frames[0]["type"] == "turn.start" and frames[0]["seq"] == 2
        errors = [f for f in frames if f["type"] == "error"]
        assert [e["code"] for e in errors] == ["conflict"] and errors[0]["turn"] is None
        done = frames[-1]
        assert done["type"] == "turn.done" and done["message"] == GREETING
        # A scripted opening line makes no model call: no usage, no model.
        assert "usage" not in types(frames) and done["model"] is None
        assert done["chunks_spoken"] == 1 and "audio.start" in types(frames)


async def test_4001_when_no_auth_comes_within_10_seconds(speaking: Addresses) -> None:
    began = trio.current_time()
    code, reason = await _closed_with(speaking, "any-session")
    waited = trio.current_time() - began
    assert code == 4001 and reason == "no auth frame within 10 seconds"
    assert 9.5 <= waited <= 13


async def test_4001_when_another_frame_comes_first(speaking: Addresses) -> None:
    assert await _closed_with(speaking, "s1", json.dumps({"type": "ping"})) == (
        4001,
        "the first frame must be auth, not ping",
    )
    assert await _closed_with(speaking, "s1", b"\x00\x01") == (
        4001,
        "the first frame must be auth, not audio",
    )


async def test_4009_when_the_url_and_the_auth_frame_name_different_sessions(speaking: Addresses) -> None:
    token, session_id = await speaking.api().person()
    code, reason = await _closed_with(
        speaking, session_id, json.dumps({"type": "auth", "key": token, "session_id": "other"})
    )
    assert (code, reason) == (4009, "the session_id of the URL and of the auth frame differ")


async def test_4009_for_an_unknown_verb_an_extra_field_and_a_second_auth(speaking: Addresses) -> None:
    api = speaking.api()
    cases = [
        ({"type": "shout", "text": "hi"}, "unknown verb 'shout'"),
        ({"type": "user_message", "text": "hi", "colour": "red"}, "user_message takes no field 'colour'"),
        ({"type": "ping", "seq": 3}, "ping takes no field 'seq'"),
        ({"type": "user_message", "text": 7}, "user_message.text must be a string"),
        ({"type": "cancel", "call_id": "x"}, "cancel takes no field 'call_id'"),
    ]
    for frame, reason in cases:
        token, session_id = await api.person()
        async with connect(speaking, token, session_id) as sock:
            await sock.send_raw(json.dumps(frame))
            assert await sock.closed() == (4009, reason)
            sock.checker.finish()
    token, session_id = await api.person()
    async with connect(speaking, token, session_id) as sock:
        await sock.send("auth", key=token, session_id=session_id)
        assert await sock.closed() == (4009, "auth was already sent on this connection")


async def test_4009_for_an_auth_frame_with_a_wrong_field_or_too_many_tools(speaking: Addresses) -> None:
    token, session_id = await speaking.api().person()
    extra = json.dumps({"type": "auth", "key": token, "session_id": session_id, "token": token})
    assert await _closed_with(speaking, session_id, extra) == (4009, "auth takes no field 'token'")
    tools = json.dumps(
        {"type": "auth", "key": token, "session_id": session_id, "tools": [f"t{i}" for i in range(51)]}
    )
    assert await _closed_with(speaking, session_id, tools) == (4009, "auth.tools may name at most 50")
    assert await _closed_with(
        speaking, None, json.dumps({"type": "auth", "key": token, "session_id": session_id})
    ) == (
        4009,
        "the URL names no session_id",
    )
    # Fifty is allowed; tools the agent does not have are simply not offered.
    async with connect(
        speaking, token, session_id, tools=[f"t{i}" for i in range(49)] + ["open_page"]
    ) as sock:
        assert sock.ready["type"] == "ready"


async def test_4009_without_the_ino_v2_subprotocol(speaking: Addresses) -> None:
    assert await _closed_with(speaking, "s", subprotocols=["chat"]) == (
        4009,
        "the subprotocol must be ino.v2",
    )


async def test_4002_for_an_api_key_or_an_invalid_token(speaking: Addresses) -> None:
    token, session_id = await speaking.api().person()
    for key, reason in [
        (API_KEY, "an API key is not accepted on this socket: mint an ephemeral token"),
        ("ek_0000000000000000_nope", "invalid token"),
        (token + "x", "invalid token"),
        ("not-a-token", "invalid token"),
    ]:
        frame = json.dumps({"type": "auth", "key": key, "session_id": session_id})
        assert await _closed_with(speaking, session_id, frame) == (4002, reason)


async def test_4003_for_an_expired_token(speaking: Addresses) -> None:
    api = speaking.api()
    token, session_id = await api.person(ttl_seconds=1)
    await trio.sleep(1.2)
    frame = json.dumps({"type": "auth", "key": token, "session_id": session_id})
    assert await _closed_with(speaking, session_id, frame) == (
        4003,
        "this token has expired: mint another and reconnect",
    )
    # The REST answers the same token with 401.
    answer = await api.request("POST", "/v1/agent/sessions", bearer=token, json_body={})
    assert (answer.status_code, answer.json()) == (401, {"error": "unauthorized"})


async def test_4004_for_a_revoked_token_at_auth_and_while_connected(speaking: Addresses) -> None:
    api = speaking.api()
    token, session_id = await api.person()
    async with connect(speaking, token, session_id) as sock:
        revoked = await api.revoke(token)
        assert (revoked.status_code, revoked.json()["revoked"]) == (200, True)
        assert await sock.closed() == (4004, "this token was revoked")
        sock.checker.finish()
    frame = json.dumps({"type": "auth", "key": token, "session_id": session_id})
    assert await _closed_with(speaking, session_id, frame) == (4004, "this token was revoked")
    unknown = await api.request("POST", "/v1/ephemeral-keys/ffffffffffffffff/revoke", bearer=API_KEY)
    assert unknown.status_code == 404 and unknown.json()["error"] == "not_found"


async def test_4008_for_an_unknown_a_deleted_or_another_persons_conversation(speaking: Addresses) -> None:
    api = speaking.api()
    token, session_id = await api.person("eu-4008")

    async def auth_close(key: str, sid: str) -> tuple[int | None, str | None]:
        return await _closed_with(speaking, sid, json.dumps({"type": "auth", "key": key, "session_id": sid}))

    assert await auth_close(token, "0193b1f4-0000-7000-8000-000000000000") == (4008, "unknown conversation")
    _, other_session = await api.person("eu-someone-else")
    assert await auth_close(token, other_session) == (4008, "the conversation belongs to another person")
    # Deleted while a socket is on it: that socket closes 4008, and so does the next one.
    async with connect(speaking, token, session_id) as sock:
        deleted = await api.delete(session_id, token)
        assert deleted.status_code == 200 and deleted.json() == {"session_id": session_id, "deleted": True}
        assert await sock.closed() == (4008, "the conversation was deleted")
    assert await auth_close(token, session_id) == (4008, "the conversation was deleted")
    assert (await api.delete(session_id, token)).status_code == 404
    assert (await api.delete(other_session, token)).status_code == 404  # not theirs to delete


async def test_4014_for_a_fourth_connection_of_one_end_user(speaking: Addresses) -> None:
    api = speaking.api()
    sessions = [await api.person("eu-4014") for _ in range(4)]
    async with (
        connect(speaking, *sessions[0]),
        connect(speaking, *sessions[1]),
        connect(speaking, *sessions[2]),
    ):
        token, session_id = sessions[3]
        frame = json.dumps({"type": "auth", "key": token, "session_id": session_id})
        assert await _closed_with(speaking, session_id, frame) == (
            4014,
            "this end user already has 3 open connections",
        )
    # Once one closed, the person may connect again.
    async with connect(speaking, *sessions[3]) as sock:
        assert sock.ready["end_user_id"] == "eu-4014"


# -- The verbs ---------------------------------------------------------------------------------


async def test_user_message_takes_a_typed_turn_in_the_documented_order(speaking: Addresses) -> None:
    token, session_id = await speaking.api().person()
    async with connect(speaking, token, session_id) as sock:
        frames = await sock.say("What time is breakfast?")
        kinds = types(frames)
        assert kinds[0] == "turn.start" and kinds[-1] == "turn.done"
        assert kinds.index("text.delta") < kinds.index("usage") < kinds.index("turn.done")
        done = frames[-1]
        assert done["message"] == "Breakfast is served from seven to eleven in the garden room."
        assert done["model"] == "local" and done["input_tokens"] > 0 and done["output_tokens"] == 11
        assert (
            done["heard"] is None
            and done["heard_seconds"] is None
            and done["tool_calls"] == []
            and done["sources"] == []
        )
        assert done["truncated"] is False and done["mood"] is None and done["mood_intensity"] is None
        assert done["chunks_spoken"] == 1
        timings = done["timings"]
        assert timings["total_ms"] >= timings["first_audio_sent_ms"] >= timings["model_first_text_ms"] >= 0
        usage = next(f for f in frames if f["type"] == "usage")
        assert usage["model"] == "local" and usage["output_tokens"] == 11 and usage["thought_tokens"] == 0
        audio = b"".join(sock.checker.binary[-len([b for b in sock.checker.binary]) :])
        assert sum(f["bytes"] for f in frames if f["type"] == "audio.end") > 0 and audio
        sock.checker.finish()


async def test_user_message_limits_and_speech_off(speaking: Addresses) -> None:
    token, session_id = await speaking.api().person()
    async with connect(speaking, token, session_id) as sock:
        await sock.send("user_message", text="")
        error = (await sock.until_type("error"))[-1]
        assert (
            error["code"] == "validation_failed"
            and error["message"] == "user_message.text must be 1 to 32000 characters"
        )
        await sock.send("user_message", text="x" * 32_001)
        assert (await sock.until_type("error"))[-1]["code"] == "validation_failed"
        # 32,000 characters is a turn; speech false is a turn with no audio; thoughts is accepted.
        frames = await sock.say("y" * 32_000, speech=False, thoughts=True)
        assert frames[-1]["type"] == "turn.done" and frames[-1]["chunks_spoken"] == 0
        assert "audio.start" not in types(frames) and "text.chunk" in types(frames)
        sock.checker.finish()


async def test_ping_is_answered_with_pong_without_a_seq(speaking: Addresses) -> None:
    token, session_id = await speaking.api().person()
    async with connect(speaking, token, session_id) as sock:
        seq = sock.checker.next_seq
        await sock.send("ping")
        pong = await sock.receive()
        assert pong == {"type": "pong"}
        await sock.send("ping")
        assert await sock.receive() == {"type": "pong"}
        frames = await sock.say("When is checkout?")
        assert frames[0]["seq"] == seq  # pongs took no seq
        sock.checker.finish()


async def test_cancel_ends_the_turn_interrupted_and_a_message_sent_while_it_unwinds_is_held(
    speaking: Addresses,
) -> None:
    token, session_id = await speaking.api().person()
    async with connect(speaking, token, session_id, tools=["open_page"]) as sock:
        await sock.send("user_message", text="Please open page spa")
        frames = await sock.until_type("tool.call")
        turn = frames[0]["turn"]
        # The turn waits for the app: cancel it, and at once type the next message.
        await sock.send("cancel")
        await sock.send("user_message", text="When is checkout?")
        frames = await sock.turn_end()
        assert frames[-1] == {
            "type": "interrupted",
            "seq": frames[-1]["seq"],
            "turn": turn,
            "message": "",
            "mood": None,
            "mood_intensity": None,
            "reason": "cancel",
        }
        ends = [f for f in frames if f["type"] == "tool.end"]
        assert len(ends) == 1 and ends[0]["ok"] is False and ends[0]["kind"] == "app"
        assert "error" not in types(frames)  # held, not refused
        held = await sock.turn_end()
        assert held[0]["type"] == "turn.start" and held[0]["turn"] != turn
        assert held[-1]["message"] == "Checkout is at noon, and late checkout costs twenty euros."
        # A cancel with nothing running changes nothing and says nothing.
        await sock.send("cancel")
        await sock.send("ping")
        assert await sock.receive() == {"type": "pong"}
        sock.checker.finish()


async def test_mute_stops_the_voice_and_the_turn_still_finishes(speaking: Addresses) -> None:
    token, session_id = await speaking.api().person()
    async with connect(speaking, token, session_id, tools=["open_page"]) as sock:
        await sock.send("user_message", text="Please open page spa")
        call = (await sock.until_type("tool.call"))[-1]
        await sock.send("mute")
        await sock.send(
            "tool.result",
            call_id=call["call_id"],
            result="The spa page is open. It shows the prices. It shows the hours.",
        )
        frames = await sock.turn_end()
        kinds = types(frames)
        assert kinds[-2:] == ["muted", "turn.done"]
        assert "audio.start" not in kinds and kinds.count("text.chunk") == 3
        done = frames[-1]
        assert done["chunks_spoken"] == 0 and done["message"].startswith("The spa page is open.")
        # Mute applies to that turn only: the next one speaks.
        after = await sock.say("When is checkout?")
        assert "muted" not in types(after) and after[-1]["chunks_spoken"] == 1
        sock.checker.finish()


async def test_mute_while_speaking_answers_muted_after_the_last_audio_end(speaking: Addresses) -> None:
    token, session_id = await speaking.api().person()
    async with connect(speaking, token, session_id, tools=["open_page"]) as sock:
        await sock.send("user_message", text="Please open page spa")
        call = (await sock.until_type("tool.call"))[-1]
        story = " ".join(f"Sentence number {i} of the long page is here." for i in range(60))
        await sock.send("tool.result", call_id=call["call_id"], result=story)
        await sock.until_type("audio.start")
        await sock.send("mute")
        frames = await sock.turn_end()
        kinds = types(frames)
        assert kinds[-2:] == ["muted", "turn.done"]
        done = frames[-1]
        assert 1 <= done["chunks_spoken"] < 61  # it stopped speaking part way
        assert done["message"].endswith("Sentence number 59 of the long page is here.")
        sock.checker.finish()


async def test_tool_result_answers_an_app_tool_call(speaking: Addresses) -> None:
    token, session_id = await speaking.api().person()
    async with connect(
        speaking, token, session_id, tools=["open_page", "check_booking", "vibrate_phone"]
    ) as sock:
        await sock.send("user_message", text="Please open page spa")
        frames = await sock.until_type("tool.call")
        call = frames[-1]
        assert call == {
            "type": "tool.call",
            "seq": call["seq"],
            "turn": frames[0]["turn"],
            "call_id": call["call_id"],
            "name": "open_page",
            "arguments": {"page": "spa"},
            "action_only": False,
            "timeout_ms": 30000,
        }
        start = next(f for f in frames if f["type"] == "tool.start")
        assert (start["name"], start["kind"], start["call_id"]) == ("open_page", "app", call["call_id"])
        await sock.send("tool.result", call_id="call_never_made", result="ignored")
        await sock.send("tool.result", call_id=call["call_id"], result={"opened": "spa"})
        frames = await sock.turn_end()
        end = next(f for f in frames if f["type"] == "tool.end")
        assert (end["ok"], end["kind"], end["call_id"]) == (True, "app", call["call_id"])
        done = frames[-1]
        assert done["message"] == "Opened: spa."  # a JSON result is said as words
        assert done["tool_calls"] == [
            {
                "call_id": call["call_id"],
                "name": "open_page",
                "kind": "app",
                "arguments": {"page": "spa"},
                "result": {"opened": "spa"},
                "ok": True,
                "error": None,
                "ms": done["tool_calls"][0]["ms"],
                "round": 0,
            }
        ]
        # An answer that is an error fails the call.
        await sock.send("user_message", text="Please open page bar")
        call = (await sock.until_type("tool.call"))[-1]
        await sock.send("tool.result", call_id=call["call_id"], error="the page does not exist")
        frames = await sock.turn_end()
        assert next(f for f in frames if f["type"] == "tool.end")["ok"] is False
        assert frames[-1]["tool_calls"][0]["error"] == "the page does not exist"
        # No answer within timeout_ms fails the call; a late answer is ignored.
        await sock.send("user_message", text="Check booking reference AB12")
        call = (await sock.until_type("tool.call"))[-1]
        assert (call["name"], call["timeout_ms"]) == ("check_booking", 400)
        frames = await sock.turn_end()
        record = frames[-1]["tool_calls"][0]
        assert (
            record["ok"] is False
            and record["error"] == "the app did not answer within 400 ms"
            and record["ms"] >= 400
        )
        await sock.send("tool.result", call_id=call["call_id"], result="too late")
        # An action_only call is not waited for.
        frames = await sock.say("Vibrate the phone")
        call = next(f for f in frames if f["type"] == "tool.call")
        assert call["action_only"] is True and call["name"] == "vibrate_phone"
        assert frames[-1]["type"] == "turn.done" and frames[-1]["tool_calls"][0]["ok"] is True
        sock.checker.finish()


async def test_app_tools_not_named_in_auth_are_not_offered(speaking: Addresses) -> None:
    token, session_id = await speaking.api().person()
    async with connect(speaking, token, session_id) as sock:
        frames = await sock.say("Please open page spa")
        assert "tool.call" not in types(frames) and frames[-1]["tool_calls"] == []
        sock.checker.finish()


async def test_a_tools_filler_line_is_said_between_tool_start_and_tool_end(speaking: Addresses) -> None:
    token, session_id = await speaking.api().person()
    async with connect(speaking, token, session_id) as sock:
        frames = await sock.say("Please order a taxi to the airport")
        kinds = types(frames)
        start, end = kinds.index("tool.start"), kinds.index("tool.end")
        # Its words are part of the reply once the tool starts; the voice says them as it reaches them.
        assert [f["text"] for f in frames[start:end] if f["type"] == "text.delta"] == [
            "One moment, I am calling the front desk."
        ]
        (said,) = [
            f for f in frames[start:] if f["type"] == "text.chunk" and f["text"].startswith("One moment")
        ]
        assert said["text"] == "One moment, I am calling the front desk."
        assert any(f["type"] == "audio.start" and f["chunk"] == said["chunk"] for f in frames)
        done = frames[-1]
        assert done["message"].startswith("One moment, I am calling the front desk. A taxi to")
        sock.checker.finish()


async def test_tool_confirmed_yes_runs_the_tool_before_the_reply(speaking: Addresses) -> None:
    token, session_id = await speaking.api().person()
    async with connect(speaking, token, session_id) as sock:
        frames = await sock.say("Book a table for 4 guests")
        confirm = next(f for f in frames if f["type"] == "tool.confirm")
        assert (confirm["name"], confirm["arguments"]) == ("book_table", {"guests": 4})
        kinds = types(frames)
        assert kinds.index("tool.start") < kinds.index("tool.confirm") < kinds.index("tool.end")
        assert frames[-1]["tool_calls"][0]["ok"] is False  # it has not run
        # Not run, so its filler line is not said.
        assert not any("Let me book" in f.get("text", "") for f in frames)
        await sock.send("tool.confirmed", call_id=confirm["call_id"], yes=True)
        frames = await sock.turn_end()
        kinds = types(frames)
        start = next(f for f in frames if f["type"] == "tool.start")
        assert (start["name"], start["kind"], start["call_id"]) == (
            "book_table",
            "webhook",
            confirm["call_id"],
        )
        assert kinds.index("tool.end") < kinds.index("text.delta")
        done = frames[-1]
        assert done["message"] == "A table for 4 is booked for tonight."
        assert (
            done["tool_calls"][0]["ok"] is True
            and done["tool_calls"][0]["result"] == "A table for 4 is booked for tonight."
        )
        # Answered: a second answer finds nothing waiting.
        await sock.send("tool.confirmed", call_id=confirm["call_id"], yes=True)
        error = (await sock.until_type("error"))[-1]
        assert error["code"] == "not_found" and error["turn"] is None
        sock.checker.finish()
    # The transcript keeps the person's answer as their turn.
    texts = [(m["role"], m["text"]) for m in await speaking.api().messages(session_id, token)]
    assert ("user", "Yes.") in texts


async def test_tool_confirmed_no_and_a_call_no_longer_waiting_is_not_found(speaking: Addresses) -> None:
    token, session_id = await speaking.api().person()
    async with connect(speaking, token, session_id) as sock:
        frames = await sock.say("Book a table for 2 guests")
        confirm = next(f for f in frames if f["type"] == "tool.confirm")
        await sock.send("tool.confirmed", call_id=confirm["call_id"], yes=False)
        frames = await sock.turn_end()
        assert "tool.start" not in types(frames) and frames[-1]["type"] == "turn.done"
        # Asked again, then a later turn of the person's drops it.
        frames = await sock.say("Book a table for 3 guests")
        confirm = next(f for f in frames if f["type"] == "tool.confirm")
        await sock.say("When is checkout?")
        await sock.send("tool.confirmed", call_id=confirm["call_id"], yes=True)
        error = (await sock.until_type("error"))[-1]
        assert error["code"] == "not_found" and error["message"].startswith(
            "That tool call is no longer waiting"
        )
        await sock.send("tool.confirmed", call_id="call_unknown", yes=True)
        assert (await sock.until_type("error"))[-1]["code"] == "not_found"
        sock.checker.finish()


async def test_an_ask_first_tool_called_again_with_the_same_arguments_in_the_next_turn_runs(
    speaking: Addresses,
) -> None:
    token, session_id = await speaking.api().person()
    async with connect(speaking, token, session_id) as sock:
        frames = await sock.say("Book a table for 5 guests")
        assert "tool.confirm" in types(frames)
        frames = await sock.say("Book a table for 5 guests")
        assert "tool.confirm" not in types(frames)
        assert frames[-1]["tool_calls"][0]["ok"] is True


# -- Errors that are frames ----------------------------------------------------------------------


async def test_conflict_for_a_message_while_a_turn_runs_and_the_turn_carries_on(speaking: Addresses) -> None:
    token, session_id = await speaking.api().person()
    async with connect(speaking, token, session_id, tools=["open_page"]) as sock:
        await sock.send("user_message", text="Please open page spa")
        call = (await sock.until_type("tool.call"))[-1]
        await sock.send("user_message", text="When is checkout?")
        error = (await sock.until_type("error"))[-1]
        assert error == {
            "type": "error",
            "seq": error["seq"],
            "code": "conflict",
            "message": "A turn is already running on this connection. Wait for turn.done, or send cancel.",
            "turn": None,
            "stage": None,
            "chunk": None,
            "request_id": None,
            "recording_id": None,
        }
        await sock.send("tool.result", call_id=call["call_id"], result="open")
        frames = await sock.turn_end()
        assert frames[-1]["type"] == "turn.done"
        sock.checker.finish()


async def test_two_sockets_on_one_conversation_share_its_call(speaking: Addresses) -> None:
    api = speaking.api()
    token, session_id = await api.person("eu-two")
    async with speaking.management_client() as host:
        async with connect(speaking, token, session_id, tools=["open_page"]) as first:
            async with connect(speaking, token, session_id) as second:
                assert second.ready["greeting"] is False
                await first.send("user_message", text="Please open page spa")
                call = (await first.until_type("tool.call"))[-1]
                # The other connection's message meets the running turn.
                await second.send("user_message", text="When is checkout?")
                assert (await second.until_type("error"))[-1]["code"] == "conflict"
                await first.send("tool.result", call_id=call["call_id"], result="open")
                await first.turn_end()
                frames = await second.say("When is checkout?")
                assert frames[-1]["type"] == "turn.done"
                status = (await host.get("/v1/runner")).json()
                assert [s["sessionId"] for s in status["sessions"]].count(session_id) == 1
            # One left: the call goes on for the other.
            assert session_id in [s["sessionId"] for s in (await host.get("/v1/runner")).json()["sessions"]]
            assert (await first.say("When is checkout?"))[-1]["type"] == "turn.done"
        with trio.fail_after(10):
            while session_id in [s["sessionId"] for s in (await host.get("/v1/runner")).json()["sessions"]]:
                await trio.sleep(0.05)
