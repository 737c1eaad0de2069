"""A call outlives its runner (docs/failover.md): the runner is killed mid-call, another one
takes the call over in the same LiveKit room, and the caller hears the agent again knowing
what was said. The host is ``runner.host.RunnerPool`` with failover, reaching the runners
inside the namespace through a relay, as it would through a load balancer.
"""

from __future__ import annotations

import signal
import time
import uuid
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest
import trio
from lk_harness import LiveKitEnv
from lk_relay import Relay
from lk_runner import AGENT_IDENTITY, agent_spec, open_runner

from runner.host import CallMoved, Failover, FailoverEvent, RunnerPool, StartCallRequest
from runner.providers.whisper import WhisperSTT
from tests.runner_process import TOKEN

pytestmark = [pytest.mark.livekit, pytest.mark.slow]

FREE_PORT = ("--public-address", "127.0.0.1:0")  # two runners in one namespace


async def test_a_killed_runners_caller_hears_the_agent_again_and_it_remembers(
    livekit: LiveKitEnv, tmp_path: Path
) -> None:
    room = livekit.unique_room("failover")
    session_id = f"fo-{uuid.uuid4().hex[:8]}"
    events: list[FailoverEvent] = []
    moved = trio.Event()

    async with AsyncExitStack() as stack:
        first = await stack.enter_async_context(
            open_runner(livekit, tmp_path / "first.db", *FREE_PORT, agent=agent_spec("resumer"))
        )
        second = await stack.enter_async_context(
            open_runner(livekit, tmp_path / "second.db", *FREE_PORT, agent=agent_spec("resumer"))
        )
        caller = await stack.enter_async_context(livekit.peer("caller", room))
        nursery = await stack.enter_async_context(trio.open_nursery())
        stack.callback(nursery.cancel_scope.cancel)  # the relays serve until then
        relays = [Relay(livekit, *host.runner.address.rsplit(":", 1)) for host in (first, second)]
        for relay in relays:
            await nursery.start(relay.serve)

        async def rejoin(request: StartCallRequest) -> str | None:
            people = (await caller.request("list_participants", room=room))["participants"]
            if not any(p["identity"] == "caller" for p in people):
                return None
            return livekit.token(AGENT_IDENTITY, room, agent=True)

        def told(event: FailoverEvent) -> None:
            events.append(event)
            moved.set()

        failover = Failover(rejoin=rejoin, dead_after_s=1.0, probe_interval_s=0.2, on_event=told)
        pool = await stack.enter_async_context(
            RunnerPool([relay.url for relay in relays], token=TOKEN, failover=failover)
        )
        await caller.request("publish_mic", rate=22_050)
        start = StartCallRequest(
            session_id=session_id,
            realtime_url=livekit.url,
            realtime_token=livekit.token(AGENT_IDENTITY, room, agent=True),
        )
        assert (await pool.start_call(start)).runner == relays[0].url
        await caller.request("record", identity=AGENT_IDENTITY)
        await caller.request("wait_speech", within=20, timeout=25)  # the greeting

        # A turn the next runner must know about, then the kill as the agent answers it.
        await caller.request("send_text", text="My name is John.", topic="lk.chat")
        await first.read_until(
            session_id, lambda r: r["body"].get("role") == "assistant" and r["body"]["text"] != "Hello there."
        )
        await caller.request("wait_speech", after=time.monotonic() - 0.5, within=20, silence_ms=0, timeout=25)
        killed_at = time.monotonic()
        first.runner.kill()
        assert await first.runner.wait_exit() == -signal.SIGKILL

        with trio.fail_after(30):
            await moved.wait()
        (event,) = events
        assert isinstance(event, CallMoved), event
        assert (event.from_runner, event.to_runner) == (relays[0].url, relays[1].url)
        assert event.turns == 3  # the greeting, the caller's words, the reply
        # The killed agent stays in the room until the new one, of the same identity, takes
        # its place: record only the one that joined after the kill.
        await caller.expect_since("participant_connected", killed_at, identity=AGENT_IDENTITY, timeout=20)
        await caller.request("record", identity=AGENT_IDENTITY, within=20)
        back = await caller.request(
            "wait_speech", after=killed_at, within=25, path=str(tmp_path / "back.pcm"), timeout=30
        )
        heard = await WhisperSTT().transcribe(Path(back["path"]).read_bytes(), back["rate"])
        people = (await caller.request("list_participants", room=room))["participants"]
        records = await second.read_until(session_id, lambda r: r["body"].get("role") == "assistant")
        await pool.stop_call(session_id)

    # The caller hears the new runner's agent say back what they said to the old one.
    assert "john" in heard.text.lower(), heard.text
    assert [p["identity"] for p in people if p["kind"] == "AGENT"] == [AGENT_IDENTITY]
    started = _payload(records, "curb.started")
    assert started["resumed"] == {"reason": "runner_lost", "turns": 3}
    assert events == [event]


def _payload(records: list[dict[str, Any]], name: str) -> dict[str, Any]:
    body = next(r["body"] for r in records if r["body"].get("name") == name)
    payload: dict[str, Any] = body["payload"]
    return payload
