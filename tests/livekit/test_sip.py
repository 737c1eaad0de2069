"""Phone calls for real: a SIP phone (baresip) calls through LiveKit's SIP service.

Everything runs in the SIP stack's namespace (lk_sip.SipStack: redis-server, livekit-server,
livekit-sip): the runner, the phones, and a control participant that makes trunks and
dispatch rules with the server API. The host is the test, over HTTP.
"""

from __future__ import annotations

import functools
import json
import secrets
import subprocess
import sys
import uuid
from array import array
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soxr
import trio
from lk_harness import Peer
from lk_runner import REPO, Host, agent_spec, events, open_runner, turns, words
from lk_sip import PHONE_RATE_HZ, Phone, SipEnv, write_wav

from runner.providers.espeak import EspeakTTS
from runner.providers.whisper import WhisperSTT
from tests.runner_process import TOKEN

pytestmark = [pytest.mark.livekit, pytest.mark.slow]

QUESTION = "Thank you very much, my name is John."
LOUD_DBFS = -40.0


def new_number() -> str:
    """A phone number no other test's trunk holds (trunks outlive a test in the shared stack)."""
    return "+1555" + "".join(secrets.choice("0123456789") for _ in range(7))


async def spoken_wav(path: Path, text: str, *, lead_s: float = 0.5, tail_s: float = 60.0) -> Path:
    """``text`` in espeak's voice at the phone's 8 kHz, quiet before and a long quiet after (a
    microphone file that ends hangs baresip's call up)."""
    tts = EspeakTTS("en-us+f2")
    pcm = b"".join([chunk async for chunk in tts.synthesize(text)])
    samples = np.frombuffer(pcm, dtype=np.int16).astype(np.float32) / 32768
    narrow = soxr.resample(samples, tts.sample_rate_hz, PHONE_RATE_HZ)
    speech = (np.clip(narrow, -1, 1) * 32767).astype(np.int16).tobytes()
    quiet = bytes(2 * PHONE_RATE_HZ)
    return write_wav(path, quiet[: int(2 * PHONE_RATE_HZ * lead_s)] + speech + quiet * int(tail_s))


def loud_spans(pcm: bytes, rate: int = PHONE_RATE_HZ, *, frame_ms: int = 20) -> list[tuple[int, int]]:
    """(first, last) 20 ms frame index of each stretch of loud frames, a stretch ending at
    400 ms of quiet."""
    step = rate * frame_ms // 1000
    samples = array("h", pcm[: len(pcm) - len(pcm) % 2])
    spans: list[tuple[int, int]] = []
    quiet_frames = 0
    for index in range(len(samples) // step):
        frame = np.asarray(samples[index * step : (index + 1) * step], dtype=np.float64)
        level = 10 * np.log10(np.mean(frame * frame) / 32768**2 + 1e-10)
        if level > LOUD_DBFS:
            if spans and quiet_frames < 400 // frame_ms:
                spans[-1] = (spans[-1][0], index)
            else:
                spans.append((index, index))
            quiet_frames = 0
        else:
            quiet_frames += 1
    return spans


async def wait_heard(phone: Phone, count: int, *, within: float = 30) -> bytes:
    """What the phone heard, once it holds ``count`` stretches of speech, each ended by quiet."""
    with trio.move_on_after(within):
        while True:
            pcm = phone.heard()
            spans = loud_spans(pcm)
            ended = [s for s in spans if (len(pcm) // 2 // 160) - s[1] > 25]
            if len(ended) >= count:
                return pcm
            await trio.sleep(0.2)
    raise AssertionError(f"the phone heard {loud_spans(phone.heard())} within {within} s\n{phone.log()}")


def cut(pcm: bytes, span: tuple[int, int]) -> bytes:
    return pcm[span[0] * 320 : (span[1] + 1) * 320]


@functools.cache
def _recognizer() -> WhisperSTT:
    return WhisperSTT()  # one model for the whole module: loading it is the slow part


async def heard_words(pcm: bytes) -> str:
    return (await _recognizer().transcribe(pcm, PHONE_RATE_HZ)).text


async def sip_participant(control: Peer, room: str, *, within: float = 15) -> str:
    """The identity of the SIP participant in ``room``, once it is there."""
    with trio.move_on_after(within):
        while True:
            listed = await control.request("list_participants", room=room)
            phones = [p["identity"] for p in listed["participants"] if p["kind"] == "SIP"]
            if phones:
                return phones[0]
            await trio.sleep(0.2)
    raise AssertionError(f"no SIP participant joined {room} within {within} s")


async def read_call(host: Host, session_id: str) -> list[dict[str, Any]]:
    return await host.read_call(session_id, timeout=20)


async def test_a_phone_caller_hears_the_greeting_is_heard_and_hangs_up(sip: SipEnv, tmp_path: Path) -> None:
    number = new_number()
    room = sip.unique_room("call")
    session_id = f"phone-{uuid.uuid4().hex[:8]}"
    question = await spoken_wav(tmp_path / "question.wav", QUESTION)
    async with (
        sip.peer("control", sip.unique_room("control")) as control,
        open_runner(sip, tmp_path / "journal.db", agent=agent_spec()) as host,
        sip.phone("+15550123") as phone,
    ):
        trunk = await control.request("sip_inbound_trunk", numbers=[number])
        await control.request("sip_dispatch_rule", room=room, trunk_ids=[trunk["trunk_id"]])
        await phone.dial(f"sip:{number}@{sip.sip_address}")
        caller = await sip_participant(control, room)
        # The phone rings until the agent listens: the host places the call into its room.
        started = await host.start_call(session_id, room)
        assert started.status == 202, started.body
        await phone.wait_event("CALL_ESTABLISHED")

        # The greeting, through the phone line, in the phone's own recording.
        heard = await wait_heard(phone, 1)
        greeting = cut(heard, loud_spans(heard)[0])
        assert words("Hello there.") <= words(await heard_words(greeting)), await heard_words(greeting)

        # The caller asks; the agent hears it and answers, and the phone hears the answer.
        await phone.speak(question)
        # The reply's record is written once it was all sent; the phone then hears its end.
        await host.read_until(
            session_id,
            lambda r: r["body"].get("role") == "assistant" and r["body"]["text"] != "Hello there.",
            timeout=40,
        )
        answered = await wait_heard(phone, 2)
        answer_audio = answered[loud_spans(answered)[1][0] * 320 :]  # all of it after the greeting
        await phone.hang_up()
        await phone.wait_event("CALL_CLOSED")
        records = await read_call(host, session_id)
        joined = [line for line in host.runner.stderr if f"{caller} joined as" in line]

    started_event = events(records, "curb.started")[0]
    assert started_event["transport"] == "livekit"
    assert events(records, "curb.ended") == [{"reason": "caller_left"}]
    user = [t for t in turns(records, "user") if t["spoken"]]
    assert len(user) == 1, turns(records, "user")
    assert len(words(user[0]["text"]) & words(QUESTION)) >= 3, user[0]["text"]
    said = turns(records, "assistant")
    assert said[0]["text"] == "Hello there."
    reply = next(t for t in said if t["turn"] == user[0]["turn"])
    heard_reply = await heard_words(answer_audio)
    assert len(words(heard_reply) & words(reply["text"])) >= 3, (heard_reply, reply["text"])
    # The runner took the phone for the caller: a participant of kind SIP, classified sip.
    assert len(joined) == 1 and "joined as sip (PARTICIPANT_KIND_SIP)" in joined[0], joined


async def dial_in(sip: SipEnv, control: Peer, phone: Phone, room: str) -> str:
    """A trunk and a direct dispatch rule into ``room`` for a new number; ``phone`` dials it.
    Returns the phone's identity in the room, once it is there (ringing)."""
    number = new_number()
    trunk = await control.request("sip_inbound_trunk", numbers=[number])
    await control.request("sip_dispatch_rule", room=room, trunk_ids=[trunk["trunk_id"]])
    await phone.dial(f"sip:{number}@{sip.sip_address}")
    return await sip_participant(control, room)


async def test_keys_both_ways_and_no_app_on_a_phone_call(sip: SipEnv, tmp_path: Path) -> None:
    room = sip.unique_room("call")
    async with (
        sip.peer("control", sip.unique_room("control")) as control,
        open_runner(sip, tmp_path / "journal.db", agent=agent_spec("keypad")) as host,
        sip.phone("+15550123") as phone,
    ):
        await dial_in(sip, control, phone, room)
        assert (await host.start_call("keys", room)).status == 202
        await phone.wait_event("CALL_ESTABLISHED")
        await wait_heard(phone, 1)  # "Enter your PIN."

        # The caller's keys (RFC 4733 events from the phone) reach the agent's handler.
        await phone.press("1234#")
        answered = await wait_heard(phone, 2)
        said = await heard_words(cut(answered, loud_spans(answered)[1]))
        assert words("That PIN is right.") <= words(said), said

        # The agent's keys reach the phone.
        pressed = await host.request(
            "POST", "/v1/sessions/keys/messages", {"id": "m-1", "name": "press", "payload": {"digits": "42#"}}
        )
        assert pressed.status == 202, pressed.body
        keys = [(await phone.wait_event("CALL_DTMF_START"))["param"] for _ in range(3)]
        assert keys == ["4", "2", "#"], keys

        # A phone has no app: the agent's message to it is dropped and counted.
        for n in range(2):
            notice = {"id": f"n-{n}", "name": "ops.notice", "payload": {"text": "hold on"}}
            assert (await host.request("POST", "/v1/sessions/keys/messages", notice)).status == 202
        await phone.hang_up()
        records = await read_call(host, "keys")

    caller_keys = [k["digit"] for k in events(records, "curb.dtmf") if k["from"] == "caller"]
    assert caller_keys == list("1234#")
    assert [k for k in events(records, "curb.dtmf") if k["from"] == "agent"] == [
        {"from": "agent", "digits": "42#"}
    ]
    assert events(records, "curb.messages")[0]["undeliveredToClient"] == {"notice": 2}
    assert [t["text"] for t in turns(records, "assistant")] == ["Enter your PIN.", "That PIN is right."]
    assert events(records, "curb.ended") == [{"reason": "caller_left"}]


async def test_the_call_ended_on_the_agents_side_hangs_the_phone_up(sip: SipEnv, tmp_path: Path) -> None:
    room = sip.unique_room("call")
    async with (
        sip.peer("control", sip.unique_room("control")) as control,
        open_runner(sip, tmp_path / "journal.db", agent=agent_spec("keypad")) as host,
        sip.phone("+15550123") as phone,
    ):
        caller = await dial_in(sip, control, phone, room)
        assert (await host.start_call("ended", room)).status == 202
        await phone.wait_event("CALL_ESTABLISHED")
        await wait_heard(phone, 1)
        stopped = await host.stop_call("ended", reason="agent_done", grace_ms=1000)
        assert stopped.status == 200, stopped.body
        # The phone gets the hang-up (a SIP BYE from LiveKit's SIP service) and leaves the room.
        closed = await phone.wait_event("CALL_CLOSED", within=10)
        await sip_gone(control, room, caller)
        records = await read_call(host, "ended")
    assert events(records, "curb.ended") == [{"reason": "agent_done"}]
    assert any(f"hung up the phone {caller}" in line for line in host.runner.stderr)
    # baresip's word for a hang-up from the other end (a BYE it was sent).
    assert closed["param"] == "Connection reset by peer", closed


async def sip_gone(control: Peer, room: str, identity: str, *, within: float = 10) -> None:
    with trio.move_on_after(within):
        while True:
            listed = await control.request("list_participants", room=room)
            if identity not in [p["identity"] for p in listed["participants"]]:
                return
            await trio.sleep(0.2)
    raise AssertionError(f"{identity} is still in {room} after {within} s")


async def host_program(sip: SipEnv, host: Host, *args: str, out: list[dict[str, Any]]) -> int:
    """``python -m examples.phone_host ARGS`` in the namespace, the runner's address first for
    ``inbound`` and ``dial``; its JSON lines go to ``out``. Returns its exit status."""
    argv = [sys.executable, "-m", "examples.phone_host", *args]
    if args[0] in ("inbound", "dial"):
        argv.insert(4, f"http://{host.runner.address}")
    process = await sip.open_process(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=str(REPO),
        env=sip.env({"CURB_MANAGEMENT_TOKEN": TOKEN}),
    )
    assert process.stdout is not None
    buf = b""
    async for chunk in process.stdout:
        buf += chunk
    for line in buf.decode().splitlines():
        out.append(json.loads(line) if line.startswith("{") else {"output": line})
    return await process.wait()


async def test_the_host_answers_a_ringing_phone_with_the_agent(sip: SipEnv, tmp_path: Path) -> None:
    number = new_number()
    prefix = f"call-{secrets.token_hex(3)}-"
    said: list[dict[str, Any]] = []
    async with (
        sip.peer("control", sip.unique_room("control")) as control,
        open_runner(sip, tmp_path / "journal.db", agent=agent_spec("dialer")) as host,
        sip.phone("+15550123") as phone,
    ):
        trunk = await control.request("sip_inbound_trunk", numbers=[number])
        await control.request("sip_dispatch_rule", room_prefix=prefix, trunk_ids=[trunk["trunk_id"]])
        async with trio.open_nursery() as nursery:
            ran: list[int] = []

            async def answer() -> None:
                ran.append(
                    await host_program(
                        sip, host, "inbound", "--room-prefix", prefix, "--within", "30", out=said
                    )
                )

            nursery.start_soon(answer)
            await phone.dial(f"sip:{number}@{sip.sip_address}")
            await phone.wait_event("CALL_ESTABLISHED")
        assert ran == [0], said
        heard = await wait_heard(phone, 1)
        greeting = await heard_words(cut(heard, loud_spans(heard)[0]))
        assert words("Hello there.") <= words(greeting), greeting
        await phone.hang_up()
        (placed,) = [line for line in said if line.get("event") == "placed"]
        records = await read_call(host, placed["sessionId"])
    (ringing,) = [line for line in said if line.get("event") == "ringing"]
    assert ringing["room"].startswith(prefix) and ringing["caller"].startswith("sip_"), ringing
    assert placed["room"] == ringing["room"] and placed["direction"] == "inbound"
    assert events(records, "curb.started")[0]["direction"] == "inbound"
    assert events(records, "curb.ended") == [{"reason": "caller_left"}]


async def test_the_host_dials_out_and_the_call_runs_outbound(sip: SipEnv, tmp_path: Path) -> None:
    room = sip.unique_room("out")
    said: list[dict[str, Any]] = []
    async with (
        sip.peer("control", sip.unique_room("control")) as control,
        open_runner(sip, tmp_path / "journal.db", agent=agent_spec("dialer")) as host,
        sip.phone("+15550177") as callee,
    ):
        trunk = await control.request(
            "sip_outbound_trunk", address=f"127.0.0.1:{callee.sip_port}", numbers=[new_number()]
        )
        async with trio.open_nursery() as nursery:
            ran: list[int] = []

            async def dial() -> None:
                args = ("dial", "--trunk", trunk["trunk_id"], "--number", "+15550177", "--room", room)
                ran.append(await host_program(sip, host, *args, out=said))

            nursery.start_soon(dial)
            await callee.wait_event("CALL_INCOMING")
            await callee.command("accept")
            await callee.wait_event("CALL_ESTABLISHED")
        assert ran == [0], said
        heard = await wait_heard(callee, 1)
        greeting = await heard_words(cut(heard, loud_spans(heard)[0]))
        assert len(words(greeting) & words("Hello, the hotel is calling you back.")) >= 4, greeting
        await callee.hang_up()
        records = await read_call(host, room)
    assert [line["event"] for line in said] == ["answered", "placed"], said
    assert said[0]["callee"] == "phone-15550177" and said[0]["sipCallId"]
    assert events(records, "curb.started")[0]["direction"] == "outbound"
    assert turns(records, "assistant")[0]["text"] == "Hello, the hotel is calling you back."
    assert events(records, "curb.ended") == [{"reason": "caller_left"}]


async def test_a_dispatch_rule_hands_the_phone_call_to_a_worker(sip: SipEnv, tmp_path: Path) -> None:
    number = new_number()
    agent_name = f"curb-{uuid.uuid4().hex[:6]}"
    prefix = f"call-{secrets.token_hex(3)}-"
    worker = ("--agent-name", agent_name, "--address", "127.0.0.1:0")
    async with (
        sip.peer("control", sip.unique_room("control")) as control,
        open_runner(
            sip, tmp_path / "worker.db", *worker, agent=agent_spec("dialer"), command="start"
        ) as host,
        sip.phone("+15550123") as phone,
    ):
        trunk = await control.request("sip_inbound_trunk", numbers=[number])
        # The rule's room configuration dispatches the worker's agent into each call's room.
        await control.request(
            "sip_dispatch_rule", room_prefix=prefix, agent_name=agent_name, trunk_ids=[trunk["trunk_id"]]
        )
        await phone.dial(f"sip:{number}@{sip.sip_address}")
        await phone.wait_event("CALL_ESTABLISHED")
        heard = await wait_heard(phone, 1)
        greeting = await heard_words(cut(heard, loud_spans(heard)[0]))
        assert words("Hello there.") <= words(greeting), greeting
        await phone.hang_up()
        records = await worker_call(host)
    started = events(records, "curb.started")[0]
    assert started["job"]["room"].startswith(prefix) and started["job"]["agentName"] == agent_name
    assert started["direction"] == "inbound"
    assert turns(records, "assistant")[0]["text"] == "Hello there."
    assert events(records, "curb.ended") == [{"reason": "caller_left"}]


async def worker_call(host: Host, *, within: float = 20) -> list[dict[str, Any]]:
    """The records of the worker's one call, up to its curb.ended."""
    with trio.fail_after(within):
        async with host.open_events() as stream:
            lines = await stream.lines(
                until=lambda got: any(r.get("body", {}).get("name") == "curb.ended" for r in got)
            )
    return [r for r in lines if r.get("producer") not in (None, "runner")]


def named(record: dict[str, Any], cls: str, name: str) -> bool:
    return record["class"] == cls and record["body"].get("name") == name


def transfer_state(state: str) -> Any:
    return lambda r: named(r, "conversation", "curb.transfer") and r["body"]["payload"]["state"] == state


async def test_a_warm_transfer_the_host_dials_to_a_desk_phone(sip: SipEnv, tmp_path: Path) -> None:
    room = sip.unique_room("call")
    async with (
        sip.peer("control", sip.unique_room("control")) as control,
        open_runner(sip, tmp_path / "journal.db", agent=agent_spec("keypad")) as host,
        sip.phone("+15550123") as phone,
        sip.phone("+15550188") as desk,
    ):
        desk_trunk = await control.request(
            "sip_outbound_trunk", address=f"127.0.0.1:{desk.sip_port}", numbers=[new_number()]
        )
        await dial_in(sip, control, phone, room)
        assert (await host.start_call("warm", room)).status == 202
        await phone.wait_event("CALL_ESTABLISHED")
        await wait_heard(phone, 1)

        # 0: the agent asks its host for the front desk; the host accepts and dials the desk in.
        await phone.press("0")
        asked = await host.read_until("warm", lambda r: named(r, "host", "curb.transfer"), timeout=15)
        ask = asked[-1]["body"]
        assert (ask["payload"], ask["expectsReply"]) == (
            {"target": "sip:desk@hotel", "reason": "front desk"},
            True,
        )
        reply = {
            "id": "t-1",
            "name": "curb.transfer.answer",
            "payload": {"accepted": True},
            "inReplyTo": ask["id"],
        }
        assert (await host.request("POST", "/v1/sessions/warm/messages", reply)).status == 202
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                lambda: control.request(
                    "sip_dial",
                    trunk_id=desk_trunk["trunk_id"],
                    number="+15550188",
                    room=room,
                    identity="desk",
                    attributes={"curb.role": "transfer_target"},
                    wait=True,
                    timeout=30,
                )
            )
            await desk.wait_event("CALL_INCOMING")
            await desk.command("accept")
        await desk.wait_event("CALL_ESTABLISHED")
        await host.read_until("warm", transfer_state("target_joined"), timeout=15)

        # The desk talks with the caller; the agent does not listen: a key goes unhandled.
        await phone.press("5")
        await host.read_until("warm", lambda r: named(r, "conversation", "curb.dtmf"), timeout=10)
        # The desk hangs up; the caller is still there: the agent takes the call back.
        await desk.hang_up()
        await host.read_until("warm", transfer_state("agent_resumed"), timeout=15)
        await phone.press("1234#")
        await host.read_until(
            "warm",
            lambda r: r["body"].get("role") == "assistant" and r["body"]["text"] == "That PIN is right.",
        )
        await phone.hang_up()
        records = await read_call(host, "warm")

    assert [(t["state"], t["identity"]) for t in events(records, "curb.transfer")] == [
        ("target_joined", "desk"),
        ("agent_resumed", "desk"),
    ]
    keys = [(k["digit"], k["handled"]) for k in events(records, "curb.dtmf")]
    assert keys == [("0", True), ("5", False), *((d, True) for d in "1234#")]
    assert events(records, "curb.ended") == [{"reason": "caller_left"}]


async def test_a_cold_transfer_sends_the_phone_elsewhere_with_a_sip_refer(
    sip: SipEnv, tmp_path: Path
) -> None:
    room = sip.unique_room("call")
    said: list[dict[str, Any]] = []
    async with (
        sip.peer("control", sip.unique_room("control")) as control,
        open_runner(sip, tmp_path / "journal.db", agent=agent_spec("keypad")) as host,
        sip.phone("+15550123") as phone,
        sip.phone("+15550199") as desk,
    ):
        caller = await dial_in(sip, control, phone, room)
        assert (await host.start_call("cold", room)).status == 202
        await phone.wait_event("CALL_ESTABLISHED")
        await wait_heard(phone, 1)
        async with trio.open_nursery() as nursery:
            ran: list[int] = []

            async def transfer() -> None:
                to = f"sip:+15550199@127.0.0.1:{desk.sip_port}"
                ran.append(
                    await host_program(
                        sip, host, "transfer", "--room", room, "--identity", caller, "--to", to, out=said
                    )
                )

            nursery.start_soon(transfer)
            # The phone follows the REFER: it calls the desk, which answers.
            incoming = await desk.wait_event("CALL_INCOMING", within=20)
            await desk.command("accept")
        assert ran == [0], said
        await desk.wait_event("CALL_ESTABLISHED")
        records = await read_call(host, "cold")
        await desk.hang_up()
    assert "+15550123" in incoming["peeruri"], incoming
    assert said == [
        {
            "event": "transferred",
            "room": room,
            "identity": caller,
            "to": f"sip:+15550199@127.0.0.1:{desk.sip_port}",
        }
    ]
    # The phone left the room for the desk: the agent's call ends as the caller's.
    assert events(records, "curb.ended") == [{"reason": "caller_left"}]
