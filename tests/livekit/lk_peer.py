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
  quit                                 disconnect and exit

This is test code: the livekit SDK is asyncio, so this program is asyncio.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from typing import Any

from livekit import rtc

MAX_LINE = 1 << 20


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

    def spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    # --- room events ---------------------------------------------------------

    def watch(self) -> None:
        room = self.room

        @room.on("participant_connected")
        def _joined(p: rtc.RemoteParticipant) -> None:
            emit(event="participant_connected", identity=p.identity, kind=kind_name(p))

        @room.on("participant_disconnected")
        def _left(p: rtc.RemoteParticipant) -> None:
            emit(event="participant_disconnected", identity=p.identity)

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
            emit(event="result", id=req_id, ok=False, error=exc.message, code=int(exc.code),
                 data=exc.data)
        except Exception as exc:  # reported to the test, which fails on it
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
            fut: asyncio.Future[tuple[str | None, int, str]] = (
                asyncio.get_running_loop().create_future()
            )
            self.pending_rpc[data.request_id] = fut
            try:
                response, code, message = await asyncio.wait_for(
                    fut, timeout=max(0.1, data.response_timeout)
                )
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
            except Exception as exc:
                emit(event="text_error", topic=info.topic, sender=sender,
                     stream_id=info.stream_id, error=f"{type(exc).__name__}: {exc}")
                return
            emit(event="text_received", topic=info.topic, sender=sender, text=text,
                 stream_id=info.stream_id, attributes=dict(info.attributes or {}))

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
    parser.add_argument("--max-seconds", type=float, default=300.0,
                        help="exit after this long whatever happens")
    args = parser.parse_args()
    token = os.environ["LK_PEER_TOKEN"]

    room = rtc.Room()
    program = PeerProgram(room)
    program.watch()
    try:
        await asyncio.wait_for(room.connect(args.url, token), args.connect_timeout)
    except Exception as exc:
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
    except asyncio.TimeoutError:
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
