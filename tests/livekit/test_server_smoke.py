"""A real livekit-server and two real participants: RPC and text streams work."""

from __future__ import annotations

import json

import pytest
import trio
from lk_harness import LiveKitEnv, PeerError

pytestmark = pytest.mark.livekit


async def test_server_answers_http_inside_the_namespace(livekit: LiveKitEnv) -> None:
    stream = await livekit.open_tcp_stream(livekit.host, livekit.server.port)
    async with stream:
        await stream.send_all(f"GET / HTTP/1.0\r\nHost: {livekit.host}\r\n\r\n".encode())
        data = b""
        with trio.fail_after(5):
            for _ in range(100):
                chunk = await stream.receive_some(4096)
                if not chunk:
                    break
                data += chunk
    assert data.startswith((b"HTTP/1.0 200", b"HTTP/1.1 200")), data[:200]


async def test_rpc_and_text_stream_between_two_participants(livekit: LiveKitEnv) -> None:
    room = livekit.unique_room("smoke")
    async with livekit.peer("caller", room) as caller, livekit.peer("agent", room, agent=True) as agent:
        assert caller.info["room"] == room
        assert agent.info["kind"] == "PARTICIPANT_KIND_AGENT"

        seen_agent = await caller.request("wait_participant", identity="agent")
        assert seen_agent["kind"] == "PARTICIPANT_KIND_AGENT"
        seen_caller = await agent.request("wait_participant", identity="caller")
        assert seen_caller["kind"] == "PARTICIPANT_KIND_STANDARD"

        # RPC: caller -> agent; the test itself supplies the agent's answer.
        await agent.request("register_rpc", method="curb.message")
        payload = json.dumps({"text": "hello agent", "n": 1})
        answer = json.dumps({"ok": True, "echo": "hello agent ✓"})
        results: dict[str, dict] = {}

        async def call() -> None:
            results["rpc"] = await caller.request(
                "perform_rpc",
                destination="agent",
                method="curb.message",
                payload=payload,
                response_timeout=8,
                timeout=15,
            )

        async with trio.open_nursery() as nursery:
            nursery.start_soon(call)
            invoked = await agent.expect("rpc_invoked", method="curb.message")
            assert invoked["caller"] == "caller"
            assert invoked["payload"] == payload
            await agent.request("rpc_reply", request_id=invoked["request_id"], response=answer)
        assert results["rpc"]["response"] == answer

        # A method nobody registered is refused by the callee with UNSUPPORTED_METHOD.
        with pytest.raises(PeerError) as refused:
            await caller.request(
                "perform_rpc",
                destination="agent",
                method="curb.nope",
                payload="x",
                response_timeout=5,
                timeout=10,
            )
        assert refused.value.result is not None
        assert refused.value.result["code"] == 1400

        # An error raised by the handler reaches the caller with its code and message.
        await agent.request("register_rpc", method="curb.update")
        failed: dict[str, PeerError] = {}

        async def call_update() -> None:
            try:
                await caller.request(
                    "perform_rpc",
                    destination="agent",
                    method="curb.update",
                    payload="{}",
                    response_timeout=8,
                    timeout=15,
                )
            except PeerError as exc:
                failed["error"] = exc

        async with trio.open_nursery() as nursery:
            nursery.start_soon(call_update)
            invoked = await agent.expect("rpc_invoked", method="curb.update")
            await agent.request(
                "rpc_reply",
                request_id=invoked["request_id"],
                error_code=1500,
                error_message="nope from the test",
            )
        result = failed["error"].result
        assert result is not None
        assert result["code"] == 1500
        assert result["error"] == "nope from the test"

        # Text stream on topic curb.message, both directions.
        await agent.request("register_text", topic="curb.message")
        await caller.request("register_text", topic="curb.message")
        text = "Hallo, Agent! ünïcödé ✓ " + "x" * 20_000  # several chunks
        sent = await caller.request("send_text", text=text, topic="curb.message", attributes={"k": "v"})
        got = await agent.expect("text_received", stream_id=sent["stream_id"])
        assert got["topic"] == "curb.message"
        assert got["sender"] == "caller"
        assert got["text"] == text
        assert got["attributes"].get("k") == "v"

        back = await agent.request("send_text", text="reply from agent", topic="curb.message")
        got_back = await caller.expect("text_received", stream_id=back["stream_id"])
        assert got_back["sender"] == "agent"
        assert got_back["text"] == "reply from agent"
