"""Raw HTTP/1.1 and WebSocket over a socket, for what httpx and trio-websocket will not send:
a body that never comes, a handshake, a malformed frame, a client that never reads."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio
from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    RejectConnection,
    Request,
    TextMessage,
)


async def exchange(address: str, request: bytes, *, timeout: float = 10) -> tuple[int, dict[str, str], bytes]:
    """Send ``request`` as is on a new connection; the answer's status, headers and body so far."""
    host, port = address.rsplit(":", 1)
    with trio.fail_after(timeout):
        stream = await trio.open_tcp_stream(host, int(port))
        async with stream:
            await stream.send_all(request)
            return await read_answer(stream)


async def read_answer(stream: trio.SocketStream) -> tuple[int, dict[str, str], bytes]:
    buffer = b""
    while b"\r\n\r\n" not in buffer:
        data = await stream.receive_some(65536)
        if not data:
            raise EOFError(f"the connection closed before an answer: {buffer!r}")
        buffer += data
    head, body = buffer.split(b"\r\n\r\n", 1)
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}
    need = int(headers.get("content-length", "0"))
    while len(body) < need:
        data = await stream.receive_some(65536)
        if not data:
            break
        body += data
    return int(status_line.split()[1]), headers, body


async def closed_by_peer(stream: trio.SocketStream, *, timeout: float = 10) -> bool:
    """Whether the peer closes the connection (EOF or reset) within ``timeout``."""
    with trio.move_on_after(timeout):
        try:
            while await stream.receive_some(65536):
                pass
        except trio.BrokenResourceError:
            pass
        return True
    return False


# -- A raw WebSocket client: frames as bytes, so a test can send what no library would ---------

TEXT, BINARY, CLOSE, PING = 0x1, 0x2, 0x8, 0x9


def ws_frame(opcode: int, payload: bytes, *, masked: bool = True, fin: bool = True, rsv: int = 0) -> bytes:
    """One WebSocket frame (RFC 6455 5.2), masked as a client's must be unless told otherwise."""
    if not masked:
        return frame_head(opcode, len(payload), fin=fin, rsv=rsv, mask=None) + payload
    key = os.urandom(4)
    head = frame_head(opcode, len(payload), fin=fin, rsv=rsv, mask=key)
    return head + bytes(b ^ key[i % 4] for i, b in enumerate(payload))


def frame_head(
    opcode: int, size: int, *, fin: bool = True, rsv: int = 0, mask: bytes | None = b"\0\0\0\0"
) -> bytes:
    """A frame's head announcing ``size`` bytes. With the default all-zero mask the payload
    goes as is: a test can send megabytes, or a frame it never finishes."""
    mask_bit = 0 if mask is None else 0x80
    head = bytes([(0x80 if fin else 0) | rsv << 4 | opcode])
    if size < 126:
        head += bytes([mask_bit | size])
    elif size < 1 << 16:
        head += bytes([mask_bit | 126]) + size.to_bytes(2, "big")
    else:
        head += bytes([mask_bit | 127]) + size.to_bytes(8, "big")
    return head + (mask or b"")


class RawSocket:
    """A WebSocket client that writes frames as given and parses what comes back with wsproto."""

    def __init__(self, stream: trio.SocketStream, parser: WSConnection) -> None:
        self.stream = stream
        self._parser = parser
        self._events: list[Any] = []
        self._partial: list[Any] = []
        self.eof = False

    async def send_frame(self, frame: bytes) -> None:
        await self.stream.send_all(frame)

    async def send_json(self, value: Any) -> None:
        await self.send_frame(ws_frame(TEXT, json.dumps(value).encode()))

    async def auth(self, token: str, session_id: str) -> dict[str, Any]:
        """The ino.v2 ``auth`` frame; its ``ready``."""
        await self.send_json({"type": "auth", "key": token, "session_id": session_id})
        ready = await self.receive()
        assert isinstance(ready, dict) and ready["type"] == "ready", ready
        return ready

    async def _fill(self) -> bool:
        try:
            data = await self.stream.receive_some(65536)
        except trio.BrokenResourceError:
            data = b""
        if not data:
            self.eof = True
            return False
        self._parser.receive_data(data)
        self._events.extend(self._parser.events())
        return True

    async def receive(self, timeout: float = 20) -> dict[str, Any] | bytes | tuple[int, str]:
        """The next whole message (a JSON frame, binary audio) or, last, the close ``(code, reason)``.

        Raises:
            EOFError: TCP ended with no close frame.
        """
        with trio.fail_after(timeout):
            while True:
                while self._events:
                    event = self._events.pop(0)
                    if isinstance(event, CloseConnection):
                        return event.code, event.reason
                    if isinstance(event, (TextMessage, BytesMessage)):
                        self._partial.append(event.data)
                        if not event.message_finished:
                            continue
                        parts, self._partial = self._partial, []
                        if isinstance(event, TextMessage):
                            frame: dict[str, Any] = json.loads("".join(parts))
                            return frame
                        return b"".join(parts)
                if self.eof or not await self._fill():
                    raise EOFError("the connection ended with no close frame")

    async def closed(self, timeout: float = 20) -> tuple[int, str]:
        """Read to the close frame; its code and reason (EOFError: TCP ended without one)."""
        with trio.fail_after(timeout):
            while True:
                got = await self.receive(timeout)
                if isinstance(got, tuple):
                    return got


@asynccontextmanager
async def open_raw_socket(
    address: str,
    target: str,
    *,
    receive_buffer: int | None = None,
    subprotocols: tuple[str, ...] = ("ino.v2",),
) -> AsyncIterator[RawSocket]:
    """A WebSocket handshake to ``ws://ADDRESS/TARGET`` over a plain socket; nothing sent after it."""
    host, port = address.rsplit(":", 1)
    sock = trio.socket.socket()
    if receive_buffer is not None:
        sock.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_RCVBUF, receive_buffer)
    with trio.fail_after(10):
        await sock.connect((host, int(port)))
    stream = trio.SocketStream(sock)
    async with stream:
        parser = WSConnection(ConnectionType.CLIENT)
        await stream.send_all(
            parser.send(Request(host=address, target=target, subprotocols=list(subprotocols)))
        )
        raw = RawSocket(stream, parser)
        with trio.fail_after(10):
            while not any(isinstance(e, (AcceptConnection, RejectConnection)) for e in raw._events):
                if not await raw._fill():
                    raise EOFError("the connection ended during the handshake")
        answer = raw._events.pop(0)
        assert isinstance(answer, AcceptConnection), answer
        yield raw
