"""A LiveKit participant for tests, driven over stdin/stdout JSON lines.

Run inside the test's network namespace by lk_harness.LiveKitEnv.peer():

    python lk_peer.py --url ws://10.213.N.1:7880      (token in $LK_PEER_TOKEN)

It connects, prints {"event": "connected", ...}, then reads one JSON request
per line on stdin: {"id": N, "op": OP, ...}. Each request gets exactly one
{"event": "result", "id": N, "ok": true|false, ...} line. Other lines are
events (participant_connected, rpc_invoked, text_received, ...).

Ops:
  wait_participant identity [within]   until that remote participant is in the room
  register_rpc     method [reply]      handle an RPC method; without "reply" each call
                                       is reported as rpc_invoked and answered by
                                       the test with rpc_reply
  rpc_reply        request_id (response | error_code [error_message])
  perform_rpc      destination method payload [response_timeout]
  register_text    topic               report each incoming text stream as text_received
  send_text        text topic [destinations] [attributes]
  wait_gone        identity [within]   until that remote participant left the room
  agent_connect    [agent_identity]    runner.client.connect_agent(room)
  agent_on         key                 report the agent's messages with that key as
                                       agent_message; agent_off key removes it
  agent_send       key [payload] [within]       -> {}            a refusal comes back as
  agent_ask        key [payload] [within]       -> {reply}       {failed: the error class,
  agent_update     settings [within]            -> {settings}    code, issues, path}
  agent_close
  publish_mic      [rate] [queue_ms] [dtx] [red]
                                       publish a microphone track (one per peer); its
                                       AudioSource queue (200 ms) and the publish options
                                       dtx and red (LiveKit's defaults) can be changed
  play             path rate           speak 16-bit mono PCM from a file into it, in real
                                       time -> {started_at, ended_at} (time.monotonic())
  record           identity [within] [rate] [frame_ms]
                                       record that participant's audio from now on
                                       ("*agent": the first participant of kind agent),
                                       as an AudioStream at rate (48000) in frames of
                                       frame_ms (20; 0: as WebRTC hands them, 10 ms);
                                       a new record replaces the one before
  burst            [lead_ms] [burst_ms] [tail_ms] [frame_ms] [ahead]
                                       silence, a loud 1 kHz tone, silence into the mic,
                                       in real time as a microphone does (ahead: as fast as
                                       the source takes them, as a TTS does); no lead: the
                                       source idled -> {at (the tone's first frame handed
                                       to capture_frame), queued_s (the source's queue
                                       then), ended_at (its last frame handed over)}
  stats                                this peer's received audio, from WebRTC's stats
                                       -> {inbound: [{jitter_buffer_delay_s,
                                       jitter_buffer_emitted_count, ...}]} (the
                                       delays are sums over the samples emitted)
  wait_speech      [after] [within] [silence_ms] [path]
                                       the first stretch of speech in the recording that
                                       starts after monotonic time `after` and is followed
                                       by silence_ms of quiet -> {first_loud_at,
                                       last_loud_at, rate, path (its PCM, if asked)}
  wait_quiet       [after] [quiet_ms] [within]
                                       the first quiet_ms stretch of quiet in the recording
                                       after monotonic time `after` (no frames at all count
                                       as quiet) -> {last_loud_at} (the last loud frame
                                       before it; null if none)
  remove_participant identity          the server API (RoomService) removes a participant
  create_dispatch  agent_name room [metadata]   AgentDispatchService.create_dispatch
                                       -> {dispatch_id, room}
  create_room      room [agent_name [metadata]] RoomService.create_room (with an agent
                                       dispatch when agent_name is given) -> {room, sid}
  delete_room      room
  list_participants room               -> {participants: [{identity, kind}]}
  list_dispatch    room                -> {dispatches: [{id, agent_name, jobs: [{id, status,
                                       error, worker_id, participant_identity}]}]}
  sip_inbound_trunk numbers            SIPService.create_inbound_trunk -> {trunk_id}
  sip_dispatch_rule [room_prefix | room] [agent_name] [metadata] [trunk_ids]
                                       an individual (room_prefix) or direct (room) rule,
                                       dispatching agent_name when given -> {rule_id}
  sip_outbound_trunk address numbers   SIPService.create_outbound_trunk -> {trunk_id}
  sip_dial         trunk_id number room identity [attributes] [wait]
                                       SIPService.create_sip_participant ->
                                       {participant_identity, sip_call_id}
  sip_transfer     room identity to    SIPService.transfer_sip_participant (a SIP REFER)
  list_rooms                           -> {rooms: [name]}
  set_attributes   room identity attributes      RoomService.update_participant: change
                                       another participant's attributes (as LiveKit's SIP
                                       service changes sip.callStatus)
  quit                                 disconnect and exit

This is test code: the livekit SDK is asyncio, so this program is asyncio.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import sys
import time
from array import array
from collections.abc import AsyncIterator
from typing import Any

from livekit import api, rtc

MAX_LINE = 1 << 20
SPEECH_DBFS = -45.0  # a 20 ms frame louder than this is speech
RECORD_RATE = 48_000
RECORD_FRAME_MS = 20


def level_dbfs(pcm: bytes) -> float:
    samples = array("h", pcm)
    if not samples:
        return -100.0
    power = sum(x * x for x in samples) / len(samples)
    return 10 * math.log10(power / (32768.0 * 32768.0) + 1e-10)


def emit(**msg: Any) -> None:
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


def kind_name(participant: rtc.Participant) -> str:
    try:
        return rtc.ParticipantKind.Name(participant.kind)
    except ValueError:
        return str(participant.kind)


class PeerProgram:
    def __init__(self, room: rtc.Room) -> None:
        self.room = room
        self.pending_rpc: dict[str, asyncio.Future[tuple[str | None, int, str]]] = {}
        self.tasks: set[asyncio.Task[Any]] = set()
        self.quit = asyncio.Event()
        self.agent: Any = None
        self.unsubscribe: dict[str, Any] = {}
        self.mic: rtc.AudioSource | None = None
        # Recorded audio: (arrival time, pcm, loud) per frame (20 ms unless record said otherwise).
        self.recording: list[tuple[float, bytes, bool]] = []
        self.recorded = asyncio.Event()
        self.recording_ended = False  # the recorded track went away (its participant left)
        self.recorder: asyncio.Task[None] | None = None
        self.record_rate = RECORD_RATE

    def spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    # --- room events ---------------------------------------------------------

    def watch(self) -> None:
        room = self.room

        @room.on("participant_connected")
        def _joined(p: rtc.RemoteParticipant) -> None:
            emit(event="participant_connected", identity=p.identity, kind=kind_name(p), at=time.monotonic())

        @room.on("participant_disconnected")
        def _left(p: rtc.RemoteParticipant) -> None:
            emit(event="participant_disconnected", identity=p.identity, at=time.monotonic())

        @room.on("disconnected")
        def _disconnected(reason: Any) -> None:
            emit(event="disconnected", reason=str(reason))
            self.quit.set()

    # --- requests ------------------------------------------------------------

    async def handle(self, req: dict[str, Any]) -> None:
        req_id = req.get("id")
        op = req.get("op")
        try:
            method = getattr(self, f"op_{op}", None)
            if method is None:
                raise ValueError(f"unknown op {op!r}")
            result = await method(req) or {}
            emit(event="result", id=req_id, ok=True, **result)
        except rtc.RpcError as exc:
            emit(event="result", id=req_id, ok=False, error=exc.message, code=int(exc.code), data=exc.data)
        except Exception as exc:  # noqa: BLE001 - reported to the test, which fails on it
            emit(event="result", id=req_id, ok=False, error=f"{type(exc).__name__}: {exc}")

    async def op_quit(self, req: dict[str, Any]) -> None:
        self.quit.set()

    async def op_wait_participant(self, req: dict[str, Any]) -> dict[str, Any]:
        identity = req["identity"]
        deadline = time.monotonic() + float(req.get("within", 8))
        while time.monotonic() < deadline:
            p = self.room.remote_participants.get(identity)
            if p is not None:
                return {"identity": p.identity, "kind": kind_name(p)}
            await asyncio.sleep(0.02)
        raise TimeoutError(f"participant {identity!r} did not join")

    async def op_register_rpc(self, req: dict[str, Any]) -> None:
        name = req["method"]
        fixed = req.get("reply")

        async def handler(data: rtc.RpcInvocationData) -> str:
            emit(
                event="rpc_invoked",
                request_id=data.request_id,
                method=data.method or name,
                caller=data.caller_identity,
                payload=data.payload,
                response_timeout=data.response_timeout,
            )
            if fixed is not None:
                return str(fixed)
            fut: asyncio.Future[tuple[str | None, int, str]] = asyncio.get_running_loop().create_future()
            self.pending_rpc[data.request_id] = fut
            try:
                response, code, message = await asyncio.wait_for(fut, timeout=max(0.1, data.response_timeout))
            finally:
                self.pending_rpc.pop(data.request_id, None)
            if response is None:
                raise rtc.RpcError(code, message)
            return response

        self.room.local_participant.register_rpc_method(name, handler)

    async def op_rpc_reply(self, req: dict[str, Any]) -> None:
        fut = self.pending_rpc.get(req["request_id"])
        if fut is None or fut.done():
            raise KeyError(f"no pending rpc {req['request_id']!r}")
        if "error_code" in req:
            fut.set_result((None, int(req["error_code"]), str(req.get("error_message", ""))))
        else:
            fut.set_result((str(req["response"]), 0, ""))

    async def op_perform_rpc(self, req: dict[str, Any]) -> dict[str, Any]:
        response = await self.room.local_participant.perform_rpc(
            destination_identity=req["destination"],
            method=req["method"],
            payload=req.get("payload", ""),
            response_timeout=float(req.get("response_timeout", 10)),
        )
        return {"response": response}

    async def op_register_text(self, req: dict[str, Any]) -> None:
        topic = req["topic"]

        async def read(reader: rtc.TextStreamReader, sender: str) -> None:
            info = reader.info
            try:
                text = await reader.read_all()
            except Exception as exc:  # noqa: BLE001 - reported to the test, which fails on it
                emit(
                    event="text_error",
                    topic=info.topic,
                    sender=sender,
                    stream_id=info.stream_id,
                    error=f"{type(exc).__name__}: {exc}",
                )
                return
            emit(
                event="text_received",
                topic=info.topic,
                sender=sender,
                text=text,
                stream_id=info.stream_id,
                attributes=dict(info.attributes or {}),
            )

        def handler(reader: rtc.TextStreamReader, sender: str) -> None:
            self.spawn(read(reader, sender))

        self.room.register_text_stream_handler(topic, handler)

    async def op_send_text(self, req: dict[str, Any]) -> dict[str, Any]:
        info = await self.room.local_participant.send_text(
            req["text"],
            topic=req.get("topic", ""),
            destination_identities=req.get("destinations"),
            attributes=req.get("attributes"),
        )
        return {"stream_id": info.stream_id}

    async def op_wait_gone(self, req: dict[str, Any]) -> dict[str, Any]:
        identity = req["identity"]
        deadline = time.monotonic() + float(req.get("within", 8))
        while time.monotonic() < deadline:
            if identity not in self.room.remote_participants:
                return {"identity": identity, "at": time.monotonic()}
            await asyncio.sleep(0.02)
        raise TimeoutError(f"participant {identity!r} did not leave")

    # --- runner.client ---------------------------------------------------------

    async def agent_call(self, fn: Any) -> dict[str, Any]:
        from runner.client import AgentRefusedError, AgentUnavailableError

        try:
            return await fn()
        except AgentRefusedError as exc:
            return {"failed": "AgentRefusedError", "code": exc.code, "issues": exc.issues, "path": exc.path}
        except AgentUnavailableError as exc:
            return {"failed": "AgentUnavailableError", "message": str(exc)}

    async def op_agent_connect(self, req: dict[str, Any]) -> None:
        from runner.client import connect_agent

        self.agent = connect_agent(self.room, req.get("agent_identity"))

    async def op_agent_on(self, req: dict[str, Any]) -> None:
        key = req["key"]

        def handler(payload: Any, meta: dict[str, str]) -> None:
            emit(event="agent_message", key=key, payload=payload, id=meta["id"], at=time.monotonic())

        self.unsubscribe[key] = self.agent.on(key, handler)

    async def op_agent_off(self, req: dict[str, Any]) -> None:
        self.unsubscribe.pop(req["key"])()

    async def op_agent_send(self, req: dict[str, Any]) -> dict[str, Any]:
        async def send() -> dict[str, Any]:
            await self.agent.send(req["key"], req.get("payload"), timeout=float(req.get("within", 10)))
            return {}

        return await self.agent_call(send)

    async def op_agent_ask(self, req: dict[str, Any]) -> dict[str, Any]:
        async def ask() -> dict[str, Any]:
            reply = await self.agent.ask(req["key"], req.get("payload"), timeout=float(req.get("within", 10)))
            return {"reply": reply}

        return await self.agent_call(ask)

    async def op_agent_update(self, req: dict[str, Any]) -> dict[str, Any]:
        async def update() -> dict[str, Any]:
            settings = await self.agent.update(req["settings"], timeout=float(req.get("within", 10)))
            return {"settings": settings}

        return await self.agent_call(update)

    async def op_agent_close(self, req: dict[str, Any]) -> None:
        self.agent.close()

    # --- audio -----------------------------------------------------------------

    async def op_publish_mic(self, req: dict[str, Any]) -> dict[str, Any]:
        rate = int(req.get("rate", RECORD_RATE))
        self.mic = rtc.AudioSource(rate, 1, queue_size_ms=int(req.get("queue_ms", 200)))
        track = rtc.LocalAudioTrack.create_audio_track("mic", self.mic)
        options = rtc.TrackPublishOptions(source=rtc.TrackSource.SOURCE_MICROPHONE)
        for knob in ("dtx", "red"):
            if knob in req:
                setattr(options, knob, bool(req[knob]))
        publication = await self.room.local_participant.publish_track(track, options)
        return {"sid": publication.sid}

    async def op_play(self, req: dict[str, Any]) -> dict[str, Any]:
        assert self.mic is not None, "publish_mic first"
        rate = int(req["rate"])
        assert rate == self.mic.sample_rate, "play at the rate the mic was published at"
        with open(req["path"], "rb") as file:
            pcm = file.read()
        step = rate * RECORD_FRAME_MS // 1000 * 2
        started = time.monotonic()
        for start in range(0, len(pcm), step):
            chunk = pcm[start : start + step]
            await self.mic.capture_frame(rtc.AudioFrame(chunk, rate, 1, len(chunk) // 2))
        queued = self.mic.queued_duration
        await self.mic.wait_for_playout()
        # The moment the last sample left the source: the end of what was said.
        return {"started_at": started, "ended_at": time.monotonic(), "queued_at_end": queued}

    async def op_record(self, req: dict[str, Any]) -> None:
        identity = req["identity"]
        deadline = time.monotonic() + float(req.get("within", 8))
        track = None
        while track is None and time.monotonic() < deadline:
            participant = self.room.remote_participants.get(identity)
            if identity == "*agent":  # the first agent to join, whoever it is
                participant = next(
                    (
                        p
                        for p in self.room.remote_participants.values()
                        if p.kind == rtc.ParticipantKind.PARTICIPANT_KIND_AGENT
                    ),
                    None,
                )
            for publication in participant.track_publications.values() if participant else ():
                if publication.kind == rtc.TrackKind.KIND_AUDIO and publication.track is not None:
                    track = publication.track
            if track is None:
                await asyncio.sleep(0.02)
        if track is None:
            raise TimeoutError(f"{identity!r} has no audio track to record")
        if self.recorder is not None:
            self.recorder.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.recorder
        self.recording.clear()
        self.recording_ended = False
        rate = self.record_rate = int(req.get("rate", RECORD_RATE))
        frame_ms = int(req.get("frame_ms", RECORD_FRAME_MS)) or None

        async def record() -> None:
            stream = rtc.AudioStream(track, sample_rate=rate, num_channels=1, frame_size_ms=frame_ms)
            try:
                async for event in stream:
                    pcm = bytes(event.frame.data)
                    self.recording.append((time.monotonic(), pcm, level_dbfs(pcm) > SPEECH_DBFS))
                    self.recorded.set()
            finally:
                self.recording_ended = True
                self.recorded.set()
                await stream.aclose()

        self.recorder = self.spawn(record())

    async def op_burst(self, req: dict[str, Any]) -> dict[str, Any]:
        assert self.mic is not None, "publish_mic first"
        rate = self.mic.sample_rate
        frame_s = int(req.get("frame_ms", 10)) / 1000
        n = round(rate * frame_s)
        lead = round(float(req.get("lead_ms", 0)) / 1000 / frame_s)
        loud = round(float(req.get("burst_ms", 100)) / 1000 / frame_s)
        tail = round(float(req.get("tail_ms", 0)) / 1000 / frame_s)
        quiet = rtc.AudioFrame(bytes(2 * n), rate, 1, n)
        tone = array("h", (int(16_000 * math.sin(2 * math.pi * 1000 * i / rate)) for i in range(n)))
        loud_frame = rtc.AudioFrame(tone.tobytes(), rate, 1, n)
        ahead = bool(req.get("ahead", False))
        start = time.monotonic()
        at = queued = ended = 0.0
        for i in range(lead + loud + tail):
            if not ahead:
                await asyncio.sleep(max(0.0, start + i * frame_s - time.monotonic()))
            if i == lead:
                at, queued = time.monotonic(), self.mic.queued_duration
            await self.mic.capture_frame(loud_frame if lead <= i < lead + loud else quiet)
            if i == lead + loud - 1:
                ended = time.monotonic()
        return {"at": at, "queued_s": queued, "ended_at": ended}

    async def op_stats(self, req: dict[str, Any]) -> dict[str, Any]:
        stats = await self.room.get_rtc_stats()
        inbound = []
        # With LiveKit's single peer connection the received streams are on the publisher's.
        for entry in [*stats.subscriber_stats, *stats.publisher_stats]:
            if entry.WhichOneof("stats") != "inbound_rtp" or entry.inbound_rtp.stream.kind != "audio":
                continue
            got = entry.inbound_rtp.inbound
            inbound.append(
                {
                    "id": entry.inbound_rtp.rtc.id,
                    "jitter_buffer_delay_s": got.jitter_buffer_delay,
                    "jitter_buffer_emitted_count": got.jitter_buffer_emitted_count,
                    "jitter_buffer_target_delay_s": got.jitter_buffer_target_delay,
                    "jitter_buffer_minimum_delay_s": got.jitter_buffer_minimum_delay,
                    "concealed_samples": got.concealed_samples,
                    "total_samples_received": got.total_samples_received,
                }
            )
        return {"inbound": inbound}

    async def op_wait_speech(self, req: dict[str, Any]) -> dict[str, Any]:
        after = float(req.get("after", 0))
        deadline = time.monotonic() + float(req.get("within", 15))
        quiet_s = float(req.get("silence_ms", 700)) / 1000
        while time.monotonic() < deadline:
            frames = [f for f in self.recording if f[0] > after]
            loud = [i for i, f in enumerate(frames) if f[2]]
            if loud and frames[-1][0] - frames[loud[-1]][0] >= quiet_s:
                first, last = loud[0], loud[-1]
                result: dict[str, Any] = {
                    "first_loud_at": frames[first][0],
                    "last_loud_at": frames[last][0],
                    "rate": self.record_rate,
                    "seconds": sum(len(f[1]) for f in frames[first : last + 1]) / 2 / self.record_rate,
                }
                if req.get("path"):
                    keep = frames[max(0, first - 15) : last + 15]
                    with open(req["path"], "wb") as file:
                        file.write(b"".join(f[1] for f in keep))
                    result["path"] = req["path"]
                return result
            self.recorded.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.recorded.wait(), 0.5)
        raise TimeoutError(f"no speech followed by {quiet_s:g} s of quiet was heard")

    async def op_wait_quiet(self, req: dict[str, Any]) -> dict[str, Any]:
        after = float(req.get("after", 0))
        deadline = time.monotonic() + float(req.get("within", 15))
        quiet_s = float(req.get("quiet_ms", 1000)) / 1000
        while time.monotonic() < deadline:
            last_loud: float | None = None
            quiet_from = after
            for at, _, loud in self.recording:
                if at <= after:
                    continue
                if loud:
                    last_loud = quiet_from = at
                elif at - quiet_from >= quiet_s:
                    return {"last_loud_at": last_loud, "quiet_at": at}
            if self.recording_ended or time.monotonic() - quiet_from >= quiet_s + 0.5:
                # The track is gone, or sends nothing: no sound is quiet too.
                return {"last_loud_at": last_loud, "quiet_at": None}
            self.recorded.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.recorded.wait(), 0.5)
        raise TimeoutError(f"the recording was never quiet for {quiet_s:g} s")

    # --- the server API --------------------------------------------------------

    async def op_remove_participant(self, req: dict[str, Any]) -> None:
        url = os.environ["LIVEKIT_URL"].replace("ws://", "http://").replace("wss://", "https://")
        lkapi = api.LiveKitAPI(url, os.environ["LIVEKIT_API_KEY"], os.environ["LIVEKIT_API_SECRET"])
        try:
            await lkapi.room.remove_participant(
                api.RoomParticipantIdentity(room=self.room.name, identity=req["identity"])
            )
        finally:
            await lkapi.aclose()

    async def op_create_dispatch(self, req: dict[str, Any]) -> dict[str, Any]:
        """AgentDispatchService.create_dispatch: explicit dispatch of ``agent_name`` to ``room``."""
        async with self.server_api() as lkapi:
            dispatch = await lkapi.agent_dispatch.create_dispatch(
                api.CreateAgentDispatchRequest(
                    agent_name=req["agent_name"], room=req["room"], metadata=req.get("metadata", "")
                )
            )
        return {"dispatch_id": dispatch.id, "room": dispatch.room}

    async def op_create_room(self, req: dict[str, Any]) -> dict[str, Any]:
        """RoomService.create_room, with an agent dispatch when ``agent_name`` is given."""
        agents = []
        if "agent_name" in req:
            agents = [api.RoomAgentDispatch(agent_name=req["agent_name"], metadata=req.get("metadata", ""))]
        async with self.server_api() as lkapi:
            room = await lkapi.room.create_room(api.CreateRoomRequest(name=req["room"], agents=agents))
        return {"room": room.name, "sid": room.sid}

    async def op_delete_room(self, req: dict[str, Any]) -> None:
        async with self.server_api() as lkapi:
            await lkapi.room.delete_room(api.DeleteRoomRequest(room=req["room"]))

    async def op_list_dispatch(self, req: dict[str, Any]) -> dict[str, Any]:
        """The room's dispatches and the state of each one's jobs, as the server keeps them."""
        async with self.server_api() as lkapi:
            dispatches = await lkapi.agent_dispatch.list_dispatch(room_name=req["room"])
        return {
            "dispatches": [
                {
                    "id": d.id,
                    "agent_name": d.agent_name,
                    "jobs": [
                        {
                            "id": j.id,
                            "status": api.JobStatus.Name(j.state.status),
                            "error": j.state.error,
                            "worker_id": j.state.worker_id,
                            "participant_identity": j.state.participant_identity,
                        }
                        for j in d.state.jobs
                    ],
                }
                for d in dispatches
            ]
        }

    async def op_list_participants(self, req: dict[str, Any]) -> dict[str, Any]:
        async with self.server_api() as lkapi:
            answer = await lkapi.room.list_participants(api.ListParticipantsRequest(room=req["room"]))
        return {
            "participants": [
                {"identity": p.identity, "kind": api.ParticipantInfo.Kind.Name(p.kind)}
                for p in answer.participants
            ]
        }

    async def op_sip_inbound_trunk(self, req: dict[str, Any]) -> dict[str, Any]:
        trunk = api.SIPInboundTrunkInfo(name="curb-test", numbers=list(req["numbers"]))
        async with self.server_api() as lkapi:
            made = await lkapi.sip.create_inbound_trunk(api.CreateSIPInboundTrunkRequest(trunk=trunk))
        return {"trunk_id": made.sip_trunk_id}

    async def op_sip_dispatch_rule(self, req: dict[str, Any]) -> dict[str, Any]:
        if "room" in req:
            rule = api.SIPDispatchRule(dispatch_rule_direct=api.SIPDispatchRuleDirect(room_name=req["room"]))
        else:
            rule = api.SIPDispatchRule(
                dispatch_rule_individual=api.SIPDispatchRuleIndividual(
                    room_prefix=req.get("room_prefix", "call-")
                )
            )
        room_config = None
        if "agent_name" in req:
            room_config = api.RoomConfiguration(
                agents=[api.RoomAgentDispatch(agent_name=req["agent_name"], metadata=req.get("metadata", ""))]
            )
        info = api.SIPDispatchRuleInfo(rule=rule, trunk_ids=list(req.get("trunk_ids", [])), name="curb-test")
        if room_config is not None:
            info.room_config.CopyFrom(room_config)
        async with self.server_api() as lkapi:
            made = await lkapi.sip.create_dispatch_rule(api.CreateSIPDispatchRuleRequest(dispatch_rule=info))
        return {"rule_id": made.sip_dispatch_rule_id}

    async def op_sip_outbound_trunk(self, req: dict[str, Any]) -> dict[str, Any]:
        trunk = api.SIPOutboundTrunkInfo(
            name="curb-test", address=req["address"], numbers=list(req["numbers"])
        )
        async with self.server_api() as lkapi:
            made = await lkapi.sip.create_outbound_trunk(api.CreateSIPOutboundTrunkRequest(trunk=trunk))
        return {"trunk_id": made.sip_trunk_id}

    async def op_sip_dial(self, req: dict[str, Any]) -> dict[str, Any]:
        request = api.CreateSIPParticipantRequest(
            sip_trunk_id=req["trunk_id"],
            sip_call_to=req["number"],
            room_name=req["room"],
            participant_identity=req["identity"],
            participant_attributes=dict(req.get("attributes", {})),
            wait_until_answered=bool(req.get("wait", False)),
        )
        async with self.server_api() as lkapi:
            made = await lkapi.sip.create_sip_participant(request)
        return {"participant_identity": made.participant_identity, "sip_call_id": made.sip_call_id}

    async def op_sip_transfer(self, req: dict[str, Any]) -> dict[str, Any]:
        request = api.TransferSIPParticipantRequest(
            room_name=req["room"], participant_identity=req["identity"], transfer_to=req["to"]
        )
        async with self.server_api() as lkapi:
            await lkapi.sip.transfer_sip_participant(request)
        return {}

    async def op_room_metadata(self, req: dict[str, Any]) -> dict[str, Any]:
        """The metadata the server holds for ``room`` now (``None``: no such room)."""
        async with self.server_api() as lkapi:
            answer = await lkapi.room.list_rooms(api.ListRoomsRequest(names=[req["room"]]))
        return {"metadata": next((r.metadata for r in answer.rooms if r.name == req["room"]), None)}

    async def op_set_room_metadata(self, req: dict[str, Any]) -> None:
        async with self.server_api() as lkapi:
            await lkapi.room.update_room_metadata(
                api.UpdateRoomMetadataRequest(room=req["room"], metadata=req["metadata"])
            )

    async def op_set_attributes(self, req: dict[str, Any]) -> None:
        request = api.UpdateParticipantRequest(
            room=req["room"], identity=req["identity"], attributes=dict(req["attributes"])
        )
        async with self.server_api() as lkapi:
            await lkapi.room.update_participant(request)

    async def op_list_rooms(self, req: dict[str, Any]) -> dict[str, Any]:
        async with self.server_api() as lkapi:
            answer = await lkapi.room.list_rooms(api.ListRoomsRequest())
        return {"rooms": sorted(r.name for r in answer.rooms)}

    @contextlib.asynccontextmanager
    async def server_api(self) -> AsyncIterator[api.LiveKitAPI]:
        """The server API of $LIVEKIT_URL (or the ``api_url`` this peer was started with)."""
        url = os.environ.get("LK_PEER_API_URL") or os.environ["LIVEKIT_URL"]
        url = url.replace("ws://", "http://").replace("wss://", "https://")
        lkapi = api.LiveKitAPI(url, os.environ["LIVEKIT_API_KEY"], os.environ["LIVEKIT_API_SECRET"])
        try:
            yield lkapi
        finally:
            await lkapi.aclose()

    # --- main loop -------------------------------------------------------------

    async def read_requests(self) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=MAX_LINE)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        while not self.quit.is_set():
            line = await reader.readline()
            if not line:  # the test closed our stdin
                break
            if not line.strip():
                continue
            try:
                req = json.loads(line)
            except ValueError:
                emit(event="bad_request", line=line.decode("utf-8", "replace"))
                continue
            if req.get("op") == "quit":
                break
            self.spawn(self.handle(req))
        self.quit.set()


async def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", default=os.environ.get("LIVEKIT_URL"))
    parser.add_argument("--connect-timeout", type=float, default=15.0)
    parser.add_argument(
        "--max-seconds", type=float, default=300.0, help="exit after this long whatever happens"
    )
    args = parser.parse_args()
    token = os.environ["LK_PEER_TOKEN"]

    room = rtc.Room()
    program = PeerProgram(room)
    program.watch()
    try:
        await asyncio.wait_for(room.connect(args.url, token), args.connect_timeout)
    except Exception as exc:  # noqa: BLE001 - reported to the test, which fails on it
        emit(event="connect_failed", error=f"{type(exc).__name__}: {exc}")
        return 2
    local = room.local_participant
    emit(
        event="connected",
        identity=local.identity,
        kind=kind_name(local),
        room=room.name,
        participants=sorted(room.remote_participants),
    )
    requests = asyncio.ensure_future(program.read_requests())
    try:
        await asyncio.wait_for(program.quit.wait(), args.max_seconds)
    except TimeoutError:
        emit(event="max_seconds")
    finally:
        requests.cancel()
        for task in list(program.tasks):
            task.cancel()
        await asyncio.gather(requests, *program.tasks, return_exceptions=True)
        await asyncio.wait_for(room.disconnect(), 5.0)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
