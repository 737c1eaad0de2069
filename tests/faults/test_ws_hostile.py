"""A WebSocket peer with no credential cannot stall or swell the runner (issue 27, items 1 and 2).

Before: the first message of the agent socket was read up to the listener's 16 MiB, parsed and
walked in full (twice when refused) before any credential was checked, freezing the whole
runner, /health included, for seconds per message; a message past the limit was closed but
everything sent after it still buffered; and permessage-deflate let 1 MB become a gigabyte.
"""

from __future__ import annotations

import base64
import contextlib
import os
from pathlib import Path

import pytest
import trio

from ..websocket.ino_client import Addresses, start_ino_runner
from ._raw import BINARY, TEXT, RawSocket, frame_head, open_raw_socket, read_answer, ws_frame

pytestmark = pytest.mark.slow

HEALTH_DEADLINE_S = 10.0  # generous: before, one such message held /health for 12 s and more
MiB = 1 << 20


def _rss_peak_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


async def _health_holds(addresses: Addresses, done: trio.Event) -> int:
    """Ask /health on the management listener until ``done``; each must answer within the deadline."""
    asked = 0
    async with addresses.management_client() as client:
        while not done.is_set() or asked < 3:
            with trio.fail_after(HEALTH_DEADLINE_S):
                assert (await client.get("/health")).status_code == 200
            asked += 1
            await trio.sleep(0.2)
    return asked


async def _send_until_closed(raw: RawSocket, head: bytes, size: int) -> int:
    """Send ``head`` and then up to ``size`` zero bytes, until the runner ends the connection."""
    sent = 0
    chunk = bytes(MiB)
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
        await raw.send_frame(head)
        while sent < size:
            await raw.send_frame(chunk[: min(MiB, size - sent)])
            sent += min(MiB, size - sent)
    return sent


async def test_a_first_frame_is_bounded_before_it_is_parsed(tmp_path: Path) -> None:
    async with start_ino_runner(tmp_path / "j.db", agent="text_only") as (runner, addresses):
        # Four first frames of a 16 MiB JSON list of lists, each refused unread.
        listed = b"[" + b"[]," * ((16 * MiB - 64) // 3) + b"[]]"
        done = trio.Event()
        closes: list[tuple[int, str]] = []

        async def attack() -> None:
            async with open_raw_socket(addresses.public, "/v1/agent/stream?session_id=x") as raw:
                await _send_until_closed(raw, frame_head(TEXT, len(listed)) + listed, 0)
                closes.append(await raw.closed(timeout=30))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(_health_holds, addresses, done)
            async with trio.open_nursery() as attackers:
                for _ in range(4):
                    attackers.start_soon(attack)
            done.set()
        assert closes == [(4001, "the first frame must be auth, at most 65536 bytes")] * 4

        # A first frame under the size limit but nested past any auth frame: refused unparsed.
        async with open_raw_socket(addresses.public, "/v1/agent/stream?session_id=x") as raw:
            await raw.send_frame(
                ws_frame(TEXT, b'{"type":"auth","key":' + b"[" * 30_000 + b"]" * 30_000 + b"}")
            )
            assert (await raw.closed()) == (4001, "the first frame must be auth")
        # Audio first, past the limit: the same.
        async with open_raw_socket(addresses.public, "/v1/agent/stream?session_id=x") as raw:
            await _send_until_closed(raw, frame_head(BINARY, 8 * MiB), 8 * MiB)
            assert (await raw.closed())[0] == 4001

        # A real auth frame still passes.
        token, session = await addresses.api().person()
        async with open_raw_socket(addresses.public, f"/v1/agent/stream?session_id={session}") as raw:
            await raw.auth(token, session)
    assert not any("Traceback" in line for line in runner.stderr), "\n".join(runner.stderr)


async def test_permessage_deflate_is_not_offered(tmp_path: Path) -> None:
    async with start_ino_runner(tmp_path / "j.db", agent="text_only") as (_, addresses):
        host, port = addresses.public.rsplit(":", 1)
        stream = await trio.open_tcp_stream(host, int(port))
        async with stream:
            key = base64.b64encode(os.urandom(16))
            await stream.send_all(
                b"GET /v1/agent/stream?session_id=x HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\n"
                b"Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: ino.v2\r\n"
                b"Sec-WebSocket-Key: " + key + b"\r\n"
                b"Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n\r\n"
            )
            with trio.fail_after(10):
                status, headers, _ = await read_answer(stream)
            assert status == 101
            assert "sec-websocket-extensions" not in headers, headers
        # A compressed frame is then a protocol error, never inflated.
        async with open_raw_socket(addresses.public, "/v1/agent/stream?session_id=x") as raw:
            await raw.send_frame(ws_frame(TEXT, b"\xab\xad\x00\x00", rsv=0b100))
            assert (await raw.closed())[0] == 1002


async def test_what_follows_an_over_limit_message_is_dropped(tmp_path: Path) -> None:
    async with start_ino_runner(tmp_path / "j.db", agent="text_only") as (runner, addresses):
        pid = runner.process.pid
        token, session = await addresses.api().person()
        before = _rss_peak_kib(pid)
        done = trio.Event()
        sent: list[int] = []
        closes: list[tuple[int, str]] = []

        async def flood(authenticated: bool, opcode: int) -> None:
            target = f"/v1/agent/stream?session_id={session}"
            async with open_raw_socket(addresses.public, target) as raw:
                if authenticated:
                    await raw.auth(token, session)
                sent.append(await _send_until_closed(raw, frame_head(opcode, 1 << 40), 256 * MiB))
                with contextlib.suppress(EOFError, trio.TooSlowError):
                    closes.append(await raw.closed(timeout=10))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(_health_holds, addresses, done)
            async with trio.open_nursery() as flooders:
                flooders.start_soon(flood, False, BINARY)
                flooders.start_soon(flood, True, TEXT)
            done.set()
        grown_mib = (_rss_peak_kib(pid) - before) / 1024
        # Past the limit (64 KiB before auth, 16 MiB after), nothing is kept: before, every byte
        # sent after it was (256 MiB each here).
        assert grown_mib < 96, (grown_mib, sent)
        # And the runner ended both connections itself, rather than reading them for ever.
        assert all(n < 256 * MiB for n in sent) or len(closes) == 2, (sent, closes)
        async with open_raw_socket(addresses.public, f"/v1/agent/stream?session_id={session}") as raw:
            await raw.auth(token, session)
            await raw.send_json({"type": "ping"})
            assert await raw.receive() == {"type": "pong"}
