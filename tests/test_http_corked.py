"""The HTTP server's corked writes: WebSocket frames sent together reach the kernel as one write.

A real Hypercorn listener (``runner.api._server``) serves a small Quart-Trio app on
127.0.0.1; a trio-websocket client counts the TCP segments that carried the frames to it
(``TCP_INFO``'s ``tcpi_data_segs_in``: Linux, loopback, ``TCP_NODELAY`` as Trio sets it, so
each write to the kernel is a segment of its own).
"""

from __future__ import annotations

import logging
import socket
import struct

import trio
from quart import websocket
from quart_trio import QuartTrio
from trio_websocket import open_websocket_url

from runner.api import HttpLimits, listen, serve_http
from runner.api._server import corked

FRAMES = 20
# struct tcp_info: tcpi_data_segs_in is the u32 at byte 152 (Linux 4.6 and later).
_DATA_SEGS_IN = 152


def _segments_in(sock: socket.socket) -> int:
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    (count,) = struct.unpack_from("I", info, _DATA_SEGS_IN)
    return int(count)


def _app() -> QuartTrio:
    app = QuartTrio(__name__)

    @app.websocket("/frames")
    async def frames() -> None:
        while True:
            how = await websocket.receive()
            if how == "corked":
                async with corked():
                    for i in range(FRAMES):
                        await websocket.send(f"frame {i}")
            else:
                for i in range(FRAMES):
                    await websocket.send(f"frame {i}")

    return app


# Reads Linux's TCP_INFO layout, as the suite runs only on Linux (namespaces, LiveKit).
async def test_frames_sent_corked_reach_the_client_in_one_segment_in_order() -> None:
    listening = listen("127.0.0.1:0", HttpLimits(), errorlog=logging.getLogger("test"), graceful_s=1)
    shutdown = trio.Event()
    async with trio.open_nursery() as nursery:
        address = await nursery.start(serve_http, _app(), listening, shutdown)
        async with open_websocket_url(f"ws://{address}/frames") as ws:
            sock = ws._stream.socket  # trio-websocket's stream is a trio.SocketStream here
            segments = {}
            for how in ("one by one", "corked"):
                before = _segments_in(sock)
                await ws.send_message(how)
                with trio.fail_after(10):
                    got = [await ws.get_message() for _ in range(FRAMES)]
                assert got == [f"frame {i}" for i in range(FRAMES)]
                segments[how] = _segments_in(sock) - before
        shutdown.set()
    # One by one, each frame is its own write (and segment); corked, all of them are one.
    assert segments["one by one"] >= FRAMES // 2
    assert segments["corked"] <= 2
