"""The LiveKit transport's edges that need no room: which URLs it takes, failed and abandoned
joins, and that a session never leaves its thread behind.

These connect only to sockets on this machine's loopback that never get as far as WebRTC
(a refused port, a listener that never answers), so they run outside the namespace.
"""

from __future__ import annotations

import threading
from functools import partial

import pytest
import trio

from runner.transports import CallTarget, TransportError
from runner.transports.livekit import LiveKitTransport


def livekit_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("livekit-")]


def target(url: str) -> CallTarget:
    return CallTarget(session_id="unit", url=url, token="not-a-jwt")


@pytest.mark.parametrize(
    ("url", "handled"),
    [
        ("ws://10.0.0.1:7880", True),
        ("wss://lk.example.com", True),
        ("loopback://dev", False),
        ("https://lk.example.com", False),
        ("lk.example.com", False),
    ],
)
def test_it_takes_websocket_urls(url: str, handled: bool) -> None:
    assert LiveKitTransport().handles(url) is handled
    assert LiveKitTransport.name == "livekit"


async def test_a_refused_join_is_a_transport_error_and_leaves_no_thread() -> None:
    before = livekit_threads()
    listener = trio.socket.socket()
    await listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.close()  # nothing listens there now
    with trio.fail_after(10):
        with pytest.raises(TransportError) as caught:
            async with LiveKitTransport().open_session(target(f"ws://127.0.0.1:{port}")):
                pytest.fail("joined a room that is not there")
    assert str(caught.value).startswith(f"could not join the LiveKit room at ws://127.0.0.1:{port}: ")
    assert "refused" in str(caught.value).lower()
    assert livekit_threads() == before


async def test_an_abandoned_join_stops_at_once_and_leaves_no_thread() -> None:
    before = livekit_threads()
    # A server that accepts and then says nothing: the join hangs until Trio gives up on it.
    accepted: list[trio.SocketStream] = []

    async def silent(stream: trio.SocketStream) -> None:
        accepted.append(stream)
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, silent, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        began = trio.current_time()
        with trio.move_on_after(0.5) as scope:
            async with LiveKitTransport().open_session(target(f"ws://127.0.0.1:{port}")):
                pytest.fail("joined a room that never answered")
        assert scope.cancelled_caught
        assert trio.current_time() - began < 3
        assert accepted, "the join never reached the listener"
        nursery.cancel_scope.cancel()
    for stream in accepted:
        await stream.aclose()
    assert livekit_threads() == before
