"""Worker mode: ``runner start`` takes its calls from LiveKit's agent dispatch.

Everything runs in the test's network namespace: livekit-server, the workers (``runner
start``, the agent-worker socket and the LiveKit transport) and the participants
(lk_peer.py, which also drives the server API: dispatches, rooms). The test reads each
worker's record over its management port, as a host would.
"""

from __future__ import annotations

import json
import signal
import uuid
from pathlib import Path
from typing import Any

import pytest
import trio
from lk_harness import LiveKitEnv, Peer
from lk_runner import Host, open_runner

pytestmark = [pytest.mark.livekit, pytest.mark.slow]


def worker_args(agent_name: str, *extra: str) -> tuple[str, ...]:
    return ("--agent-name", agent_name, "--address", "127.0.0.1:0", *extra)


def started(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every ``curb.started`` payload among ``records``, with its producer."""
    return [
        {"session": r["producer"], **r["body"]["payload"]}
        for r in records
        if r["body"].get("type") == "event" and r["body"].get("name") == "curb.started"
    ]


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

            # The call answers the host like any other: its state, and host messages.
            live = await host.request("GET", f"/v1/sessions/{job['id']}")
            assert (live.status, live.body["state"]) == (200, "connected")
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
