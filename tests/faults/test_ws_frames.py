"""Frames the agent socket cannot parse fail the connection with a close frame (RFC 6455 7.1.7).

wsproto reports them and Hypercorn used to drop TCP with no close frame (issue 14, item 11):
the client then cannot tell a broken frame from a broken network.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import trio

from runner.ino_wire import RECORDING_TOO_LONG

from ..websocket.ino_client import start_ino_runner
from ._raw import BINARY, PING, TEXT, open_raw_socket, ws_frame

pytestmark = pytest.mark.slow

UNPARSABLE = {
    # 1007: "data within a message that was not consistent with the type of the message".
    "invalid UTF-8 in a text frame": (ws_frame(TEXT, b'{"type":"ping","x":"\xff\xfe"}'), 1007),
    "a surrogate encoded in UTF-8": (ws_frame(TEXT, b'"\xed\xa0\x80"'), 1007),
    # 1002: a protocol error.
    "a reserved opcode": (ws_frame(0x3, b"{}"), 1002),
    "a reserved control opcode": (ws_frame(0xB, b""), 1002),
    "an unmasked client frame": (ws_frame(TEXT, b'{"type":"ping"}', masked=False), 1002),
    "a reserved bit": (ws_frame(TEXT, b'{"type":"ping"}', rsv=0b100), 1002),
    "a fragmented ping": (ws_frame(PING, b"x", fin=False), 1002),
    "a continuation with nothing to continue": (ws_frame(0x0, b"x"), 1002),
}


async def test_an_unparsable_frame_is_answered_with_its_close_code(tmp_path: Path) -> None:
    async with start_ino_runner(tmp_path / "j.db", agent="text_only") as (runner, addresses):
        api = addresses.api()
        for case, (frame, code) in UNPARSABLE.items():
            token, session = await api.person()
            async with open_raw_socket(addresses.public, f"/v1/agent/stream?session_id={session}") as raw:
                await raw.auth(token, session)
                await raw.send_frame(frame)
                assert (await raw.closed())[0] == code, case
        # Found by tests/fuzz: an empty binary frame is audio like any other (Quart hands it over
        # as None), and JSON nested too deep for json is not JSON before auth either; both were 4013.
        deep = b'{"type":"auth","key":' + b"[" * 5000 + b"]" * 5000 + b"}"
        for authenticated, frame, code in (
            (False, ws_frame(BINARY, b""), 4001),
            (True, ws_frame(BINARY, b""), 4011),
            (False, ws_frame(TEXT, deep), 4001),
        ):
            token, session = await api.person()
            async with open_raw_socket(addresses.public, f"/v1/agent/stream?session_id={session}") as raw:
                if authenticated:
                    await raw.auth(token, session)
                await raw.send_frame(frame)
                assert (await raw.closed())[0] == code, frame[:40]
        # One message past the listener's 16 MiB limit: as audio it is past the 10 MB recording
        # cap too (4011, the seed's code; Hypercorn alone closed 1009), as text it is too big (1009).
        too_big = 16 * 1024 * 1024 + 1
        for opcode, code in ((BINARY, 4011), (TEXT, 1009)):
            token, session = await api.person()
            async with open_raw_socket(addresses.public, f"/v1/agent/stream?session_id={session}") as raw:
                await raw.auth(token, session)
                with contextlib.suppress(trio.BrokenResourceError):  # it may close before the end
                    await raw.send_frame(ws_frame(opcode, b"\0" * too_big))
                assert (await raw.closed()) == (code, RECORDING_TOO_LONG if code == 4011 else ""), opcode
        # Before auth as well, and the socket's neighbours are unharmed.
        async with open_raw_socket(addresses.public, "/v1/agent/stream?session_id=x") as raw:
            await raw.send_frame(ws_frame(BINARY, b"", masked=False))
            assert (await raw.closed())[0] == 1002
        token, session = await api.person()
        async with open_raw_socket(addresses.public, f"/v1/agent/stream?session_id={session}") as raw:
            await raw.auth(token, session)
            await raw.send_json({"type": "ping"})
            assert await raw.receive() == {"type": "pong"}
    assert not any("Traceback" in line for line in runner.stderr), "\n".join(runner.stderr)
