"""Raw HTTP/1.1 over a socket, for what httpx will not send: a body that never comes, a handshake."""

from __future__ import annotations

import trio


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
