"""A password in a realtime URL is used to join and shown nowhere: not in the journal, the
events stream, the answer or the log (stored as ``wss://***@host/...``)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from ..runner_process import read_stream, records, start_runner
from ._runner import start

pytestmark = pytest.mark.slow

SECRET = "s3cret-Pw"


async def test_url_userinfo_is_redacted_in_every_record_answer_and_log_line(tmp_path: Path) -> None:
    # A bound port that never listens: the LiveKit SDK's connect is refused at once, and the
    # transport's reason quotes the URL it was given.
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        url = f"ws://agent:{SECRET}@127.0.0.1:{closed.getsockname()[1]}/rtc"
        async with (
            start_runner(tmp_path / "j.db", "--drain-grace-ms", "100") as runner,
            runner.client() as client,
        ):
            refused = await client.post("/v1/sessions", json=start("c1", realtimeUrl=url))
            assert refused.status_code == 502, refused.text
            lines = records(
                await read_stream(
                    runner, "from=0", until=lambda ls: any(r["body"].get("name") == "curb.ended" for r in ls)
                )
            )
            await client.post("/v1/runner/drain")
            assert await runner.wait_exit() == 0
    (ended,) = [r for r in lines if r["body"].get("name") == "curb.ended"]
    reason = ended["body"]["payload"]["reason"]
    assert f"ws://***@127.0.0.1:{url.rsplit(':', 1)[1].split('/')[0]}/rtc" in reason, reason
    shown = [refused.text, *(str(r) for r in lines), *runner.stderr, *runner.stdout]
    assert not [text for text in shown if SECRET in text]
    assert (tmp_path / "j.db").read_bytes().find(SECRET.encode()) == -1
    assert any("***@127.0.0.1" in line for line in runner.stderr)
