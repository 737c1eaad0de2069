"""A call outlives its worker (docs/failover.md, worker mode): the worker holding a dispatched
room is killed with SIGKILL; the LiveKit server's ``participant_left`` webhook reaches the other
worker, which dispatches the agent back to the room; the agent that comes picks the call up
with the conversation the room's metadata carried, and the room has one agent.

The server posts its webhooks to the management listeners at lk_harness.WEBHOOK_PORTS, where
these workers listen.
"""

from __future__ import annotations

import json
import signal
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
from lk_harness import WEBHOOK_PORTS, LiveKitCluster, LiveKitEnv, LiveKitServer, find_livekit_server
from lk_runner import agent_spec, open_runner
from lk_workers import agents_in, failover_records, failover_worker, follow, room_record, started, wait_for

from runner.providers.whisper import WhisperSTT

pytestmark = [pytest.mark.livekit, pytest.mark.slow]


@pytest.fixture
async def livekit(tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> AsyncIterator[LiveKitEnv]:
    """A livekit-server of the test's own that posts webhooks to the workers: a server shared
    with earlier tests would still be retrying their posts, which nobody took, before ours."""
    binary = find_livekit_server()
    assert binary is not None, "run .ci/install-livekit-server"
    server = LiveKitServer(binary, tmp_path_factory.mktemp("livekit-webhooks"), webhooks=True)
    await trio.to_thread.run_sync(server.start)
    env = LiveKitEnv(server, tmp_path)
    try:
        yield env
    finally:
        await env.aclose()
        await trio.to_thread.run_sync(server.stop)


async def test_a_killed_workers_room_gets_its_agent_back_knowing_the_conversation(
    livekit: LiveKitEnv, tmp_path: Path
) -> None:
    agent_name = f"curb-{uuid.uuid4().hex[:6]}"
    room = livekit.unique_room("worker-failover")
    resumer = agent_spec("resumer")
    async with (
        livekit.peer("control", livekit.unique_room("control")) as control,
        open_runner(
            livekit,
            tmp_path / "w1.db",
            *failover_worker(agent_name, WEBHOOK_PORTS[0]),
            command="start",
            agent=resumer,
        ) as w1,
        open_runner(
            livekit,
            tmp_path / "w2.db",
            *failover_worker(agent_name, WEBHOOK_PORTS[1]),
            command="start",
            agent=resumer,
        ) as w2,
        follow(w1, w2) as (f1, f2),
        livekit.peer("caller", room) as caller,
    ):
        # The room's metadata has a key of someone else's: it is kept beside ours.
        await control.request("set_room_metadata", room=room, metadata=json.dumps({"app": {"theme": "dark"}}))
        await caller.request("publish_mic", rate=22_050)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: caller.request("record", identity="*agent", within=25, timeout=30))
            await control.request(
                "create_dispatch", agent_name=agent_name, room=room, metadata=json.dumps({"plan": "pro"})
            )
        await wait_for([f1, f2], lambda: room in {**f1.rooms, **f2.rooms}.values())
        holder, other = (f1, f2) if room in f1.rooms.values() else (f2, f1)
        (job,) = holder.rooms
        await caller.request("wait_speech", within=20, timeout=25)  # the greeting

        # A turn the next agent must know about; the kill comes as the agent answers it.
        await caller.request("send_text", text="My name is John.", topic="lk.chat")
        await holder.host.read_until(
            job, lambda r: r["body"].get("role") == "assistant" and r["body"]["text"] != "Hello there."
        )
        await caller.request("wait_speech", after=time.monotonic() - 0.5, within=20, silence_ms=0, timeout=25)
        # The room carries the call: its turns, the agent that holds it, the client context.
        with trio.fail_after(10):
            while len((await room_record(control, room)).get("curb.call", {}).get("history", [])) < 3:
                await trio.sleep(0.1)
        carried = await room_record(control, room)
        assert carried["app"] == {"theme": "dark"}
        assert carried["curb.call"]["agent"] == f"agent-{job}"
        assert carried["curb.call"]["clientContext"] == {"plan": "pro"}
        assert [t["text"] for t in carried["curb.call"]["history"][:2]] == [
            "Hello there.",
            "My name is John.",
        ]

        killed_at = time.monotonic()
        holder.host.runner.kill()
        assert await holder.host.runner.wait_exit() == -signal.SIGKILL

        # The other worker hears the agent leave (once LiveKit notices: ~21 s, docs/deploy.md),
        # and the agent it sends back joins under the same identity, resuming the call.
        await wait_for([other], lambda: any(c.get("resumed") for c in started(other.records)), within=90)
        (resumed,) = [c for c in started(other.records) if c.get("resumed")]
        assert resumed["job"]["room"] == room
        assert resumed["job"]["resumes"] == {"agent": f"agent-{job}", "jobId": job}
        assert resumed["resumed"] == {"reason": "worker_lost", "turns": 3}
        assert resumed["clientContext"] == {"plan": "pro"}
        await caller.request("wait_participant", identity=f"agent-{job}", within=20, timeout=25)
        await caller.request("record", identity="*agent", within=20, timeout=25)
        back = await caller.request(
            "wait_speech", after=killed_at, within=25, path=str(tmp_path / "back.pcm"), timeout=30
        )
        heard = await WhisperSTT().transcribe(Path(back["path"]).read_bytes(), back["rate"])
        print(f"the caller heard the agent again {back['first_loud_at'] - killed_at:.1f} s after the kill")
        assert "john" in heard.text.lower(), heard.text
        assert await agents_in(control, room) == [f"agent-{job}"]
        # The worker that acted says so once, under the lost job.
        await wait_for([other], lambda: bool(failover_records(other.records)))
        (moved,) = failover_records(other.records)
        assert moved["job"] == job and moved["outcome"] == "moved" and moved["turns"] == 3
        # The room's record now names the new job; the other key is still there.
        carried = await room_record(control, room)
        assert carried["curb.call"]["job"] == resumed["session"]
        assert carried["app"] == {"theme": "dark"}

        # The caller hangs up: the call ends, its record leaves the room, nothing is sent back.
        await caller.send({"id": 0, "op": "quit"})
        await wait_for(
            [other],
            lambda: any(
                r["producer"] == resumed["session"] and r["body"].get("name") == "curb.ended"
                for r in other.records
            ),
        )
        await trio.sleep(2)
        assert len(failover_records(other.records)) == 1
        await control.request("delete_room", room=room)


async def test_in_a_cluster_two_survivors_hear_it_one_room_moves_and_one_whose_caller_left_is_recorded_lost(
    livekit_cluster: LiveKitCluster, tmp_path: Path
) -> None:
    nodes = [LiveKitEnv(node, tmp_path) for node in livekit_cluster.nodes]
    agent_name = f"curb-{uuid.uuid4().hex[:6]}"
    kept, left = nodes[0].unique_room("kept"), nodes[1].unique_room("left")
    resumer = agent_spec("resumer")
    try:
        async with (
            nodes[0].peer("control", nodes[0].unique_room("control")) as control,
            # The worker to be killed takes both rooms: it is the only one when they come.
            open_runner(
                nodes[0], tmp_path / "w1.db", "--agent-name", agent_name, "--address", "127.0.0.1:0", "--max-sessions", "2",
                command="start", agent=resumer,
            ) as w1,
            # A survivor that hears every webhook but serves another agent name (so it takes no
            # room itself), light on a loaded machine: it only receives and dispatches.
            open_runner(
                nodes[0], tmp_path / "w3.db", *failover_worker(f"other-{agent_name}", WEBHOOK_PORTS[1]),
                command="start", agent=agent_spec("quiet"),
            ) as w3,
            follow(w1) as (f1,),
            nodes[0].peer("caller", kept) as caller,
            nodes[1].peer("leaver", left) as leaver,
        ):  # fmt: skip
            await caller.request("publish_mic", rate=22_050)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(lambda: caller.request("record", identity="*agent", within=25, timeout=30))
                for room in (kept, left):
                    await control.request("create_dispatch", agent_name=agent_name, room=room)
            await wait_for([f1], lambda: {kept, left} <= set(f1.rooms.values()), within=60)
            job = {room: j for j, room in f1.rooms.items()}
            await caller.request("wait_speech", within=20, timeout=25)  # the greeting
            await caller.request("send_text", text="My name is John.", topic="lk.chat")
            await w1.read_until(
                job[kept],
                lambda r: r["body"].get("role") == "assistant" and r["body"]["text"] != "Hello there.",
            )
            with trio.fail_after(20):
                while len((await room_record(control, kept)).get("curb.call", {}).get("history", [])) < 3:
                    await trio.sleep(0.1)
            # The second survivor, on the other node, of the call's agent name: both survivors
            # receive every webhook of both nodes.
            async with (
                open_runner(
                    nodes[1], tmp_path / "w2.db", *failover_worker(agent_name, WEBHOOK_PORTS[0]),
                    command="start", agent=resumer,
                ) as w2,
                follow(w2, w3) as survivors,
            ):  # fmt: skip
                killed_at = time.monotonic()
                w1.runner.kill()
                assert await w1.runner.wait_exit() == -signal.SIGKILL
                # One caller hangs up while the dead agent is still in the room.
                await leaver.send({"id": 0, "op": "quit"})

                def told() -> list[dict[str, Any]]:
                    return [r for f in survivors for r in failover_records(f.records)]

                await wait_for(survivors, lambda: len(told()) >= 2, within=90)
                await caller.request("wait_participant", identity=f"agent-{job[kept]}", within=20, timeout=25)
                await caller.request("record", identity="*agent", within=20, timeout=25)
                back = await caller.request(
                    "wait_speech", after=killed_at, within=25, path=str(tmp_path / "back.pcm"), timeout=30
                )
                print(
                    f"cluster: the caller heard the agent again {back['first_loud_at'] - killed_at:.1f} s after the kill"
                )
                heard = await WhisperSTT().transcribe(Path(back["path"]).read_bytes(), back["rate"])
                assert "john" in heard.text.lower(), heard.text
                # Both survivors heard each webhook; the room got one agent back, once.
                await trio.sleep(3)
                outcomes = [(r["job"], r["outcome"], r.get("reason")) for r in told()]
                assert outcomes.count((job[kept], "moved", None)) == 1, outcomes
                # The other room closed as the dead agent left it: with no room left to agree in,
                # each survivor that heard the webhook says so (docs/failover.md).
                assert set(outcomes) == {(job[kept], "moved", None), (job[left], "lost", "caller_gone")}, (
                    outcomes
                )
                assert await agents_in(control, kept) == [f"agent-{job[kept]}"]
                resumed = [c for f in survivors for c in started(f.records) if c.get("resumed")]
                assert [(c["job"]["room"], c["resumed"]["turns"]) for c in resumed] == [(kept, 3)]
                await control.request("delete_room", room=kept)
    finally:
        for node in nodes:
            await node.aclose()


async def test_a_room_no_worker_can_take_is_recorded_lost_in_the_room_and_the_stream(
    livekit: LiveKitEnv, tmp_path: Path
) -> None:
    # The only worker of the call's agent name is killed; the one that hears the webhook serves
    # another agent name, so the dispatch it sends finds no worker.
    agent_name, other_name = f"curb-{uuid.uuid4().hex[:6]}", f"other-{uuid.uuid4().hex[:6]}"
    room = livekit.unique_room("no-worker")
    quiet = agent_spec("quiet")
    async with (
        livekit.peer("control", livekit.unique_room("control")) as control,
        open_runner(
            livekit, tmp_path / "w1.db", "--agent-name", agent_name, "--address", "127.0.0.1:0",
            command="start", agent=quiet,
        ) as w1,
        open_runner(
            livekit, tmp_path / "w2.db", *failover_worker(other_name, WEBHOOK_PORTS[0]),
            command="start", agent=quiet,
        ) as w2,
        follow(w1, w2) as (f1, f2),
        livekit.peer("caller", room),
    ):  # fmt: skip
        await control.request("create_dispatch", agent_name=agent_name, room=room)
        await wait_for([f1], lambda: room in f1.rooms.values())
        (job,) = f1.rooms
        with trio.fail_after(20):
            while (await room_record(control, room)).get("curb.call", {}).get("job") != job:
                await trio.sleep(0.1)
        w1.runner.kill()
        assert await w1.runner.wait_exit() == -signal.SIGKILL
        await wait_for([f2], lambda: bool(failover_records(f2.records)), within=90)
        (lost,) = failover_records(f2.records)
        assert (lost["job"], lost["outcome"], lost["reason"]) == (job, "lost", "no_worker")
        record = (await room_record(control, room))["curb.call"]
        assert (record["state"], record["reason"]) == ("lost", "no_worker")
        # The dispatch that found no worker is withdrawn: a worker that comes later is not sent
        # to a room already said lost.
        dispatches = (await control.request("list_dispatch", room=room))["dispatches"]
        # (The server lists every room's automatic dispatch too, the one with no agent name.)
        assert [d["agent_name"] for d in dispatches if d["agent_name"]] == [agent_name], dispatches
        assert not started(f2.records)
        await control.request("delete_room", room=room)
