"""An agent-socket client that never reads is closed 4006 once it falls too far behind (issue 14,
item 14), and nobody else notices.

A raw socket with a small receive buffer sends frames that each earn an error frame and reads
nothing; the runner's send queue grows past ``--agent-max-unsent-bytes`` and the socket must
end with 4006 ("slow down and reconnect"), not hold the runner's memory for ever.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from ..websocket.ino_client import start_ino_runner
from ._raw import TEXT, open_raw_socket, ws_frame

pytestmark = pytest.mark.slow

LIMIT = 64 << 10
# Each earns a ~230-byte error frame (not_found: no tool call waits for it).
REFUSED = ws_frame(TEXT, b'{"type":"tool.confirmed","call_id":"call_none","yes":true}')


async def test_a_client_that_never_reads_is_closed_4006(tmp_path: Path) -> None:
    async with start_ino_runner(
        tmp_path / "j.db", "--max-sessions", "4", "--agent-max-unsent-bytes", str(LIMIT), agent="text_only"
    ) as (runner, addresses):
        api = addresses.api()
        token, session = await api.person()
        other_token, other_session = await api.person()
        target = "/v1/agent/stream?session_id="
        async with (
            open_raw_socket(addresses.public, target + other_session) as other,
            open_raw_socket(addresses.public, target + session, receive_buffer=4096) as slow,
        ):
            await other.auth(other_token, other_session)
            await slow.auth(token, session)
            said = "closing it with 4006"

            async def flood() -> None:
                for _ in range(600):
                    await slow.send_frame(REFUSED * 100)

            # Far more replies than the limit and every buffer between; the runner stops reading
            # this socket once it decided to close it, so the flood blocks and is dropped then.
            async with trio.open_nursery() as nursery:
                nursery.start_soon(flood)
                await runner.wait_for(lambda: any(said in line for line in runner.stderr), timeout=30)
                nursery.cancel_scope.cancel()
            # Now read what is buffered: the last frame must be the close, 4006.
            code, reason = await slow.closed(timeout=30)
            assert code == 4006, (code, reason)
            await other.send_json({"type": "ping"})
            assert await other.receive() == {"type": "pong"}
        async with addresses.management_client() as client:
            assert (await client.get("/health")).status_code == 200
    assert not any("Traceback" in line for line in runner.stderr), "\n".join(runner.stderr)
