"""Worker mode: ``runner start`` takes its calls from LiveKit's agent dispatch.

Everything runs in the test's network namespace: livekit-server, the workers (``runner
start``, the agent-worker socket and the LiveKit transport) and the participants
(lk_peer.py, which also drives the server API: dispatches, rooms). The test reads each
worker's record over its management port, as a host would.
"""

from __future__ import annotations

import json
import signal
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import trio
from lk_harness import LiveKitCluster, LiveKitEnv, Peer
from lk_runner import REPO, Host, agent_spec, open_runner
from lk_workers import follow, started, wait_for

pytestmark = [pytest.mark.livekit, pytest.mark.slow]


def worker_args(agent_name: str, *extra: str) -> tuple[str, ...]:
    return ("--agent-name", agent_name, "--address", "127.0.0.1:0", *extra)


def ended(records: list[dict[str, Any]]) -> dict[str, str]:
    return {
        r["producer"]: r["body"]["payload"]["reason"]
        for r in records
        if r["body"].get("type") == "event" and r["body"].get("name") == "curb.ended"
    }


async def read_all(host: Host, until: Any, *, within: float = 30) -> list[dict[str, Any]]:
    """The worker's records from the start until ``until(records)`` holds."""
    with trio.fail_after(within):
        async with host.open_events() as events:
            assert events.status == 200, events.body
            return await events.lines(until=until)


async def replay_journal(journal: Path) -> list[dict[str, Any]]:
    """A stopped worker's journal, as ``runner replay --json`` prints it."""
    done = await trio.run_process(
        [sys.executable, "-m", "runner", "replay", "--from", "0", "--journal", str(journal), "--json"],
        capture_stdout=True,
        cwd=str(REPO),
    )
    return [json.loads(line) for line in done.stdout.decode().splitlines() if line.strip()]


async def state_of(host: Host, session_id: str, *, within: float = 10) -> str:
    """The call's state once it is past starting."""
    with trio.move_on_after(within):
        while True:
            live = await host.request("GET", f"/v1/sessions/{session_id}")
            assert live.status == 200, live.body
            if live.body["state"] != "starting":
                return str(live.body["state"])
            await trio.sleep(0.1)
    return "starting"


async def job_of(control: Peer, room: str, *, status: str, within: float = 20) -> dict[str, Any]:
    """The room's one job once the server reports it in ``status``."""
    jobs: list[dict[str, Any]] = []
    with trio.move_on_after(within):
        while True:
            dispatches = (await control.request("list_dispatch", room=room))["dispatches"]
            jobs = [job for d in dispatches for job in d["jobs"]]
            if jobs and jobs[-1]["status"] == status:
                return jobs[-1]
            await trio.sleep(0.2)
    raise AssertionError(f"no job of room {room} reached {status}: {jobs}")


async def job_ended_in_log(livekit: LiveKitEnv, job_id: str, *, within: float = 10) -> tuple[str, str]:
    """The status and error livekit-server logged for the end of job ``job_id``."""
    with trio.move_on_after(within):
        while True:
            for line in livekit.server.log_path.read_text(errors="replace").splitlines():
                if "job ended" in line and f'"jobID": "{job_id}"' in line:
                    fields = json.loads(line[line.index("{") :])
                    return fields["status"], fields["error"]
            await trio.sleep(0.2)
    raise AssertionError(f"livekit-server logged no end of job {job_id}")


async def test_a_dispatched_room_runs_as_a_call_of_the_worker(livekit: LiveKitEnv, tmp_path: Path) -> None:
    agent_name = f"curb-{uuid.uuid4().hex[:6]}"
    room = livekit.unique_room("dispatch")
    journal = tmp_path / "worker.db"
    async with (
        open_runner(livekit, journal, *worker_args(agent_name), command="start") as host,
        livekit.peer("control", livekit.unique_room("control")) as control,
    ):
        async with livekit.peer("caller", room) as caller:
            ready = host.runner.lifecycle[0]
            assert ready["event"] == "ready"
            await caller.request("publish_mic", rate=22_050)

            async with trio.open_nursery() as nursery:
                # The caller records the agent from the moment it joins: its greeting is heard.
                nursery.start_soon(lambda: caller.request("record", identity="*agent", within=25, timeout=30))
                # Explicit dispatch, with job metadata that is a flat string map: the client context.
                dispatched = await control.request(
                    "create_dispatch", agent_name=agent_name, room=room, metadata=json.dumps({"plan": "pro"})
                )
            job = await job_of(control, room, status="JS_RUNNING")
            identity = job["participant_identity"]
            assert identity == f"agent-{job['id']}"
            seen = await caller.request("wait_participant", identity=identity, within=15, timeout=20)
            assert seen["kind"] == "PARTICIPANT_KIND_AGENT"
            greeting = await caller.request("wait_speech", within=20, timeout=25)
            assert greeting["last_loud_at"] - greeting["first_loud_at"] > 0.3

            records = await read_all(host, lambda got: started(got))
            (call,) = started(records)
            assert call["session"] == job["id"]
            assert call["transport"] == "livekit"
            assert call["clientContext"] == {"plan": "pro"}
            assert call["job"] == {
                "jobId": job["id"],
                "dispatchId": dispatched["dispatch_id"],
                "room": room,
                "agentName": agent_name,
                "workerId": job["worker_id"],
            }

            # The call answers the host like any other: its state, host messages, live settings.
            live = await host.request("GET", f"/v1/sessions/{job['id']}")
            assert (live.status, live.body["state"]) == (200, "connected")
            message = {"id": "m-1", "name": "ops.notice", "payload": {"text": "hi"}}
            sent = await host.request("POST", f"/v1/sessions/{job['id']}/messages", message)
            assert (sent.status, sent.body) == (202, {"id": "m-1", "delivered": True})
            refused = await host.request(
                "POST", f"/v1/sessions/{job['id']}/messages", {**message, "id": "m-2", "name": "nobody"}
            )
            assert (refused.status, refused.body["error"]) == (422, "no_handler")
            patched = await host.request("PATCH", f"/v1/sessions/{job['id']}", {"tts": {"voice": "heart"}})
            assert (patched.status, patched.body["settings"]["tts"]["voice"]) == (200, "heart")
            # A worker takes no calls from a host, exactly as the seed says.
            for method, path, body in (
                (
                    "POST",
                    "/v1/sessions",
                    {"sessionId": "s", "realtimeUrl": livekit.url, "realtimeToken": "t"},
                ),
                ("GET", "/v1/runner", None),
                ("POST", "/v1/runner/drain", None),
            ):
                answer = await host.request(method, path, body)
                assert (answer.status, answer.body["error"]) == (501, "runner_takes_no_calls"), (method, path)

        # The caller hangs up: the call ends, and its job is reported to the server a success.
        records = await read_all(host, lambda got: job["id"] in ended(got))
        assert ended(records)[job["id"]] == "caller_left"
        # ListDispatch keeps showing JS_RUNNING after the job ended (docs/deploy.md): the server's
        # own log is where the status it took is seen.
        assert await job_ended_in_log(livekit, job["id"]) == ("JS_SUCCESS", "")

        # SIGTERM: the worker drains (no calls left) and exits 0 with its lifecycle records.
        host.runner.signal(signal.SIGTERM)
        assert await host.runner.wait_exit(timeout=20) == 0
        events = [e["event"] for e in host.runner.lifecycle]
        assert events == ["ready", "draining", "ended"]


async def agent_in(control: Peer, room: str, *, within: float = 20) -> str:
    """The identity of the agent that joined ``room`` (the server's participant list)."""
    with trio.move_on_after(within):
        while True:
            listed = (await control.request("list_participants", room=room))["participants"]
            agents = [p["identity"] for p in listed if p["kind"] == "AGENT"]
            if agents:
                return agents[0]
            await trio.sleep(0.2)
    raise AssertionError(f"no agent joined {room}")


async def test_automatic_dispatch_no_journal_a_refused_context_and_a_drain(
    livekit: LiveKitEnv, tmp_path: Path
) -> None:
    agent_name = f"curb-{uuid.uuid4().hex[:6]}"
    named_room, auto_room = livekit.unique_room("named"), livekit.unique_room("auto")
    async with (
        livekit.peer("control", livekit.unique_room("control")) as control,
        open_runner(
            livekit,
            tmp_path / "named.db",
            *worker_args(agent_name, "--drain-grace-ms", "1000"),
            command="start",
        ) as named,
        open_runner(
            livekit,
            tmp_path / "auto.db",
            *worker_args("", "--no-journal", "--max-sessions", "2"),
            command="start",
        ) as auto,
    ):
        # A room created with an agent dispatch whose metadata is not a flat string map: the
        # call runs, with no client context and a record of what was refused.
        await control.request(
            "create_room", room=named_room, agent_name=agent_name, metadata=json.dumps({"plan": {"tier": 2}})
        )
        records = await read_all(named, lambda got: started(got))
        (call,) = started(records)
        assert call["clientContext"] == {}
        assert call["job"]["refused"] == {"metadata": "not a flat map of strings"}
        assert call["job"]["room"] == named_room
        # Full (one call of --max-sessions 1): its status says so, and the server sends it no
        # job for the next room of its name (not even an availability request).
        full_room = livekit.unique_room("full")
        await control.request("create_dispatch", agent_name=agent_name, room=full_room)
        await trio.sleep(3)
        assert not any(full_room in line for line in named.runner.stderr)

        # Automatic dispatch (no agent name): a new room gets the worker that takes every room.
        await control.request("create_room", room=auto_room)
        identity = await agent_in(control, auto_room)
        job_id = identity.removeprefix("agent-")
        assert await state_of(auto, job_id) == "connected"
        # Without a journal there is no stream to read, and it says so.
        no_stream = await auto.request("GET", "/v1/runner/events?from=0")
        assert (no_stream.status, no_stream.body["error"]) == (404, "no_journal")
        assert (await auto.request("GET", "/health")).status == 200

        # SIGTERM with a call in progress: the worker drains, the call gets --drain-grace-ms,
        # then ends runner_draining; the job is reported to the server; the worker exits 0.
        named.runner.signal(signal.SIGTERM)
        assert await named.runner.wait_exit(timeout=20) == 0
        assert [e["event"] for e in named.runner.lifecycle] == ["ready", "draining", "ended"]
        assert named.runner.lifecycle[1]["activeSessions"] == 1
        assert await job_ended_in_log(livekit, call["session"]) == ("JS_SUCCESS", "")
        reopened = await replay_journal(tmp_path / "named.db")
        assert ended(reopened)[call["session"]] == "runner_draining"
        await control.request("delete_room", room=auto_room)
        for room in (named_room, full_room):
            await control.request("delete_room", room=room)


async def test_two_workers_share_ten_rooms_drain_and_a_kill(livekit: LiveKitEnv, tmp_path: Path) -> None:
    agent_name = f"curb-{uuid.uuid4().hex[:6]}"
    journals = [tmp_path / "w1.db", tmp_path / "w2.db"]
    # The quiet agent says nothing: ten calls at once stay light on two cores.
    args = worker_args(agent_name, "--max-sessions", "8", "--drain-grace-ms", "60000")
    quiet = agent_spec("quiet")
    async with (
        livekit.peer("control", livekit.unique_room("control")) as control,
        open_runner(livekit, journals[0], *args, command="start", agent=quiet) as w1,
        open_runner(livekit, journals[1], *args, command="start", agent=quiet) as w2,
        follow(w1, w2) as (f1, f2),
    ):

        def rooms() -> dict[str, str]:
            return {**f1.rooms, **f2.rooms}

        # Ten dispatched rooms: each runs once, on one worker; a worker holds at most 8.
        ten = [livekit.unique_room("shared") for _ in range(10)]
        for room in ten:
            await control.request("create_dispatch", agent_name=agent_name, room=room)
        await wait_for([f1, f2], lambda: len(rooms()) >= 10, within=60)
        assert sorted(rooms().values()) == sorted(ten)
        assert len(f1.rooms) >= 2 and len(f2.rooms) >= 2, (f1.rooms, f2.rooms)
        for follower in (f1, f2):
            for job in follower.rooms:
                assert await state_of(follower.host, job, within=30) == "connected"
        for room in ten:
            await control.request("delete_room", room=room)
        await wait_for([f1, f2], lambda: len(ended(f1.records) | ended(f2.records)) >= 10)

        # One more room; its worker is then drained (SIGTERM) while the call goes on: the next
        # rooms all go to the other worker.
        first = livekit.unique_room("before-drain")
        await control.request("create_dispatch", agent_name=agent_name, room=first)
        await wait_for([f1, f2], lambda: first in rooms().values())
        draining, other = (f1, f2) if first in f1.rooms.values() else (f2, f1)
        draining.host.runner.signal(signal.SIGTERM)
        await wait_for(
            [draining], lambda: any(r["body"].get("event") == "draining" for r in draining.records)
        )
        later = [livekit.unique_room("during-drain") for _ in range(3)]
        for room in later:
            await control.request("create_dispatch", agent_name=agent_name, room=room)
        await wait_for([other], lambda: set(later) <= set(other.rooms.values()))
        for job, room in other.rooms.items():
            if room in later:
                assert await state_of(other.host, job, within=30) == "connected"
        assert not set(later) & set(draining.rooms.values())
        # The drained worker's call ends with its room; the worker then exits 0.
        await control.request("delete_room", room=first)
        assert await draining.host.runner.wait_exit(timeout=20) == 0

        # SIGKILL the survivor with three calls: start a fresh worker on the other journal
        # first; after the kill, new rooms go to it.
        killed = other
        lost = {job for job, room in killed.rooms.items() if room in later}
        async with open_runner(
            livekit, draining.host.runner.journal, *args, command="start", agent=quiet
        ) as survivor:
            killed.host.runner.kill()
            await killed.host.runner.wait_exit(timeout=10)
            async with follow(survivor) as (fs,):
                after = livekit.unique_room("after-kill")
                await control.request("create_dispatch", agent_name=agent_name, room=after)
                await wait_for([fs], lambda: after in fs.rooms.values())
                # The server does not hand the killed worker's jobs to the survivor (docs/deploy.md).
                await control.request("delete_room", room=after)
            # The killed worker, restarted on its journal, closes its calls runner_crashed.
            async with open_runner(
                livekit, killed.host.runner.journal, *args, command="start", agent=quiet
            ) as restarted:
                recovered = [e for e in restarted.runner.lifecycle if e["event"] == "recovered"]
                assert len(recovered) == 1 and set(recovered[0]["closedSessions"]) == lost
                async with follow(restarted) as (fr,):
                    await wait_for([fr], lambda: lost <= {s for s, r in ended(fr.records).items()})
                    assert {ended(fr.records)[job] for job in lost} == {"runner_crashed"}
        for room in later:
            await control.request("delete_room", room=room)


async def test_a_room_on_one_node_is_served_by_a_worker_on_the_other(
    livekit_cluster: LiveKitCluster, tmp_path: Path
) -> None:
    nodes = [LiveKitEnv(node, tmp_path) for node in livekit_cluster.nodes]
    agent_name = f"curb-{uuid.uuid4().hex[:6]}"
    room = nodes[0].unique_room("cluster")
    try:
        async with nodes[0].peer("caller", room) as caller:
            # The room lives on the node that logs its sessions; the worker registers with the
            # other one.
            home = next(
                i
                for i, node in enumerate(livekit_cluster.nodes)
                for line in node.log_path.read_text(errors="replace").splitlines()
                if "starting RTC session" in line and f'"room": "{room}"' in line
            )
            worker = open_runner(
                nodes[1 - home], tmp_path / "worker.db", *worker_args(agent_name), command="start"
            )
            async with worker as host:
                await caller.request("publish_mic", rate=22_050)
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(
                        lambda: caller.request("record", identity="*agent", within=30, timeout=35)
                    )
                    # Dispatched through the room's own node.
                    await caller.request("create_dispatch", agent_name=agent_name, room=room)
                greeting = await caller.request("wait_speech", within=20, timeout=25)
                assert greeting["last_loud_at"] - greeting["first_loud_at"] > 0.3
                (call,) = started(await read_all(host, lambda got: started(got)))
                assert call["job"]["room"] == room
                # The caller hangs up (through the other node): the call ends.
                await caller.send({"id": 0, "op": "quit"})
                records = await read_all(host, lambda got: call["session"] in ended(got))
                assert ended(records)[call["session"]] == "caller_left"
    finally:
        for node in nodes:
            await node.aclose()


class CuttableProxy:
    """A TCP proxy inside the namespace, in front of livekit-server: ``cut(n)`` drops its n-th
    connection (both ends), as a network that loses one socket would; ``freeze(n)`` keeps it
    open but lets nothing through, as a network that silently stops would."""

    def __init__(self, livekit: LiveKitEnv) -> None:
        self.livekit = livekit
        self.port = 0
        self.connections: list[tuple[trio.SocketStream, trio.SocketStream]] = []
        self.requests: list[bytes] = []  # each connection's first bytes from its client
        self.frozen: set[int] = set()

    def agent_sockets(self) -> list[int]:
        """The connections that are worker sockets (``GET /agent``), oldest first."""
        return [i for i, first in enumerate(self.requests) if first.startswith(b"GET /agent")]

    @property
    def url(self) -> str:
        return f"ws://{self.livekit.peer_ip}:{self.port}"

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        sock = trio.socket.from_stdlib_socket(await trio.to_thread.run_sync(self.livekit.server.netns.socket))
        await sock.bind((self.livekit.peer_ip, 0))
        sock.listen(16)
        self.port = sock.getsockname()[1]
        async with trio.SocketListener(sock) as listener, trio.open_nursery() as nursery:
            task_status.started()
            while True:
                client = await listener.accept()
                upstream = await self.livekit.open_tcp_stream(self.livekit.host, self.livekit.server.port)
                self.connections.append((client, upstream))
                self.requests.append(b"")
                index = len(self.connections) - 1
                nursery.start_soon(self._pipe, index, client, upstream)
                nursery.start_soon(self._pipe, index, upstream, client)

    async def _pipe(self, index: int, source: trio.SocketStream, sink: trio.SocketStream) -> None:
        try:
            async for chunk in source:
                if not self.requests[index] and source is self.connections[index][0]:
                    self.requests[index] = chunk[:64]
                if index not in self.frozen:
                    await sink.send_all(chunk)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            await sink.aclose()

    def freeze(self, index: int) -> None:
        self.frozen.add(index)

    async def cut(self, index: int) -> None:
        for stream in self.connections[index]:
            await stream.aclose()


async def test_a_lost_worker_socket_reconnects_and_the_call_goes_on(
    livekit: LiveKitEnv, tmp_path: Path
) -> None:
    agent_name = f"curb-{uuid.uuid4().hex[:6]}"
    room, later = livekit.unique_room("kept"), livekit.unique_room("after-reconnect")
    proxy = CuttableProxy(livekit)
    async with trio.open_nursery() as nursery:
        await nursery.start(proxy.serve)
        args = worker_args(agent_name, "--url", proxy.url, "--max-sessions", "2")
        async with (
            livekit.peer("control", livekit.unique_room("control")) as control,
            open_runner(
                livekit, tmp_path / "w.db", *args, command="start", agent=agent_spec("quiet")
            ) as host,
            follow(host) as (f,),
        ):
            await control.request("create_dispatch", agent_name=agent_name, room=room)
            await wait_for([f], lambda: room in f.rooms.values())
            (job,) = f.rooms
            assert await state_of(host, job, within=30) == "connected"

            registered = "registered with the LiveKit server as worker"
            assert sum(registered in line for line in host.runner.stderr) == 1
            (socket,) = proxy.agent_sockets()
            await proxy.cut(socket)
            await host.runner.wait_for(
                lambda: sum(registered in line for line in host.runner.stderr) == 2, timeout=20
            )
            # The call never noticed; the worker takes new jobs on its new socket.
            assert await state_of(host, job) == "connected"
            assert job not in ended(f.records)
            await control.request("create_dispatch", agent_name=agent_name, room=later)
            await wait_for([f], lambda: later in f.rooms.values())
            for job in f.rooms:
                assert await state_of(host, job, within=30) == "connected"

            # A socket that goes silent (no close, no pong) is given up after two ping
            # intervals, and replaced; the calls go on.
            proxy.freeze(proxy.agent_sockets()[-1])
            await host.runner.wait_for(
                lambda: sum(registered in line for line in host.runner.stderr) == 3, timeout=30
            )
            assert any("did not answer" in line for line in host.runner.stderr)
            for job in f.rooms:
                assert await state_of(host, job) == "connected"
            for name in (room, later):
                await control.request("delete_room", room=name)
            await wait_for([f], lambda: len(ended(f.records)) == 2)
        nursery.cancel_scope.cancel()


async def test_a_worker_the_server_refuses_exits_1_without_a_ready_line(
    livekit: LiveKitEnv, tmp_path: Path
) -> None:
    argv = [
        sys.executable,
        "-m",
        "runner",
        "start",
        *worker_args("curb-refused"),
        "--journal",
        str(tmp_path / "j.db"),
    ]
    done = await trio.run_process(
        livekit.argv(argv),
        capture_stdout=True,
        capture_stderr=True,
        check=False,
        cwd=str(REPO),
        env=livekit.env({"LIVEKIT_API_SECRET": "not-the-secret-0123456789abcdef0123456789"}),
    )
    assert done.returncode == 1
    assert b"curb-hosted" not in done.stdout
    assert b"refused the worker (401)" in done.stderr
