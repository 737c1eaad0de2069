"""``GET /v1/runner`` timed from a process of its own: the runner's answer, not the client's reading.

    python -m bench._status_timer HOST:PORT TOKEN COUNT

Sends COUNT sequential requests on one keep-alive connection and prints, per request, the
milliseconds from sending it to having the last byte of its body, and the body's length.
It reads with a plain socket into one preallocated buffer (no HTTP library parsing a 3.7 MB
body in 64 KiB pieces), so on a 2-core machine it takes as little CPU from the runner as a
client can. ``bench.calls`` runs it at each level beside its in-process client.
"""

from __future__ import annotations

import socket
import sys
import time


def _get(sock: socket.socket, request: bytes, buffer: bytearray) -> int:
    """Send one request; read its whole answer into ``buffer``; return the body's length."""
    sock.sendall(request)
    view = memoryview(buffer)
    got = 0
    end = -1
    while end < 0:
        n = sock.recv_into(view[got:])
        if n == 0:
            raise ConnectionError("the runner closed the connection")
        got += n
        end = buffer.find(b"\r\n\r\n", 0, got)
    head = bytes(buffer[:end]).decode("latin-1").split("\r\n")
    if not head[0].startswith("HTTP/1.1 200"):
        raise RuntimeError(f"GET /v1/runner answered {head[0]!r}")
    length = next(
        int(line.split(":", 1)[1]) for line in head[1:] if line.lower().startswith("content-length:")
    )
    total = end + 4 + length
    if total > len(buffer):
        raise RuntimeError(f"an answer of {total} bytes does not fit the buffer")
    while got < total:
        n = sock.recv_into(view[got:total])
        if n == 0:
            raise ConnectionError("the runner closed the connection mid-body")
        got += n
    return length


def main() -> int:
    address, token, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    host, port = address.rsplit(":", 1)
    request = f"GET /v1/runner HTTP/1.1\r\nHost: {address}\r\nAuthorization: Bearer {token}\r\n\r\n".encode()
    buffer = bytearray(64 << 20)
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        _get(sock, request, buffer)  # warm: the connection, the runner's first join
        for _ in range(count):
            began = time.perf_counter()
            length = _get(sock, request, buffer)
            print(f"{(time.perf_counter() - began) * 1000:.3f} {length}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
