"""A token that expires while its socket is open closes that socket (issue 27, item 10).

Before, an expired token went on working on a socket opened while it was good: turns were
taken and charged. Revoked and spent tokens already closed theirs (4004); an expired one now
closes with 4003, the ino.v2 code for "this token has expired: mint another and reconnect".
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ..websocket.ino_client import start_ino_runner
from ._raw import open_raw_socket

pytestmark = pytest.mark.slow

TOKEN_EXPIRED = "this token has expired: mint another and reconnect"


async def test_a_token_that_expires_closes_its_open_socket(tmp_path: Path) -> None:
    async with start_ino_runner(tmp_path / "j.db", agent="text_only") as (runner, addresses):
        api = addresses.api()
        token, session = await api.person(ttl_seconds=4)
        async with open_raw_socket(addresses.public, f"/v1/agent/stream?session_id={session}") as raw:
            await raw.auth(token, session)
            # A turn while the token is good is answered.
            await raw.send_json({"type": "user_message", "text": "hello"})
            while True:
                frame = await raw.receive()
                assert isinstance(frame, dict | bytes), frame
                if isinstance(frame, dict) and frame["type"] == "turn.done":
                    break
            # Then it expires: the socket closes (it would otherwise stay open for the 300 s idle limit).
            assert await raw.closed(timeout=60) == (4003, TOKEN_EXPIRED)
        # And it cannot open another.
        async with open_raw_socket(addresses.public, f"/v1/agent/stream?session_id={session}") as raw:
            await raw.send_json({"type": "auth", "key": token, "session_id": session})
            assert (await raw.closed())[0] == 4003
    assert not any("Traceback" in line for line in runner.stderr), "\n".join(runner.stderr)
