"""Phone keys (DTMF) both ways: the caller's keys reach ``@agent.on_dtmf`` and the call's
record (``curb.dtmf``), and ``ctx.send.dtmf`` presses keys on the phone line.

The runner is served in this process with the loopback transport (``tests/inprocess.py``),
its caller marked a phone caller (``caller=sip``); the host side goes over HTTP. The same
over LiveKit's real SIP service is ``tests/livekit/test_sip.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from runner.transports.loopback import LoopbackCaller

from . import agents
from .inprocess import answer, call_start, ended, events_named, follow, open_runner, turns

KEYS_TIMEOUT_S = 10


async def keys_pressed(caller: LoopbackCaller, count: int) -> str:
    """The next ``count`` keys the agent pressed on the caller's line."""
    with trio.fail_after(KEYS_TIMEOUT_S):
        return "".join([await caller.keys.receive() for _ in range(count)])


async def test_the_callers_keys_reach_the_agent_and_the_record(tmp_path: Path) -> None:
    async with (
        open_runner(agents.keypad, tmp_path) as runner,
        runner.client() as client,
        follow(runner) as follower,
    ):
        start = call_start("c1", "loopback://x?caller=sip")
        answer(await client.post("/v1/sessions", json=start), 202, "StartCallResponse")
        caller = await runner.wait_caller("c1")
        caller.press("12")
        caller.press("34#")
        said = "That PIN is right."
        await follower.wait_for(lambda rs: said in [t["text"] for t in turns(rs, "c1", "assistant")])
        caller.press("9#")
        await follower.wait_for(lambda rs: len(turns(rs, "c1", "assistant")) == 3)
        answer(await client.delete("/v1/sessions/c1"), 200, "StopCallResponse")
        await follower.wait_for(lambda rs: ended(rs, "c1"))
    records = follower.records
    assert [(k["from"], k["digit"], k["handled"]) for k in events_named(records, "c1", "curb.dtmf")] == [
        ("caller", digit, True) for digit in "1234#9#"
    ]
    assert [t["text"] for t in turns(records, "c1", "assistant")] == [
        "Enter your PIN, then press the hash key.",
        "That PIN is right.",
        "1 keys is not your PIN.",
    ]


async def test_the_agent_presses_keys_on_the_phone_line(tmp_path: Path) -> None:
    async with (
        open_runner(agents.keypad, tmp_path) as runner,
        runner.client() as client,
        follow(runner) as follower,
    ):
        start = call_start("c1", "loopback://x?caller=sip")
        answer(await client.post("/v1/sessions", json=start), 202, "StartCallResponse")
        caller = await runner.wait_caller("c1")
        press = {"id": "m-1", "name": "press", "payload": {"digits": "0123456789*#abcd"}}
        answer(await client.post("/v1/sessions/c1/messages", json=press), 202, "HostMessageAccepted")
        assert await keys_pressed(caller, 16) == "0123456789*#ABCD"
        await follower.wait_for(lambda rs: events_named(rs, "c1", "curb.dtmf"))
        # A key that is not on a keypad is refused where the agent presses it: its handler fails.
        bad = {"id": "m-2", "name": "press", "payload": {"digits": "12x"}}
        refusal = answer(await client.post("/v1/sessions/c1/messages", json=bad), 422, "ErrorBody")
        assert refusal["error"] == "handler_failed" and "'12x'" in refusal["detail"]
        answer(await client.delete("/v1/sessions/c1"), 200, "StopCallResponse")
        await follower.wait_for(lambda rs: ended(rs, "c1"))
    assert events_named(follower.records, "c1", "curb.dtmf") == [
        {"from": "agent", "digits": "0123456789*#ABCD"}
    ]
    with pytest.raises(trio.EndOfChannel):
        caller.keys.receive_nowait()  # nothing of the refused press reached the line


async def test_keys_on_a_call_with_no_phone_line_are_dropped_unrecorded(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with (
        open_runner(agents.keypad, tmp_path) as runner,
        runner.client() as client,
        follow(runner) as follower,
    ):
        answer(await client.post("/v1/sessions", json=call_start("c1")), 202, "StartCallResponse")
        caller = await runner.wait_caller("c1")
        for n in range(2):
            press = {"id": f"m-{n}", "name": "press", "payload": {"digits": "5"}}
            answer(await client.post("/v1/sessions/c1/messages", json=press), 202, "HostMessageAccepted")
        answer(await client.delete("/v1/sessions/c1"), 200, "StopCallResponse")
        await follower.wait_for(lambda rs: ended(rs, "c1"))
    assert events_named(follower.records, "c1", "curb.dtmf") == []
    with pytest.raises(trio.EndOfChannel):
        caller.keys.receive_nowait()
    dropped = [r.getMessage() for r in caplog.records if "phone keys dropped" in r.getMessage()]
    assert dropped == [
        "call c1: phone keys dropped: the call has no phone line: its caller is not on a phone"
    ]
