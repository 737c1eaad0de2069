"""docs/agent-websocket.md's complete exchange, replayed against a runner of the same agent.

Every frame the page shows is one the runner sends, in that order, with the same fields and
values; only what differs from run to run (ids, turns, timings) may differ.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from tests.runner_process import start_runner

from .ino_client import RUNNER_ENV, Addresses, open_socket, public_address

PAGE = Path(__file__).resolve().parents[2] / "docs" / "agent-websocket.md"
# What a run of its own gives anew: the conversation, the turns, how long things took, and the
# speech's exact length (espeak-ng's output varies by a few samples).
VOLATILE = {"session_id", "turn", "timings", "generation_seconds", "bytes", "audio_seconds"}


def _documented() -> list[tuple[str, Any]]:
    """The page's exchange: ("send", frame), ("receive", frame) and ("binary", None), in order."""
    text = PAGE.read_text(encoding="utf-8")
    section = text.split("## A complete exchange", 1)[1].split("\n## ", 1)[0]
    steps: list[tuple[str, Any]] = []
    for line in section.splitlines():
        if line.startswith('>> {"type"'):
            steps.append(("send", json.loads(line[3:])))
        elif line.startswith('<< {"type"'):
            steps.append(("receive", json.loads(line[3:])))
        elif line.startswith("<< binary:"):
            steps.append(("binary", None))
    return steps


def _kept(frame: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in frame.items() if k not in VOLATILE}


async def test_the_documented_exchange_is_what_the_runner_sends(tmp_path: Path) -> None:
    steps = _documented()
    assert [kind for kind, _ in steps].count("send") == 2
    async with start_runner(
        tmp_path / "j.db", agent="tests.websocket.doc_agents:pizzeria", env=RUNNER_ENV
    ) as runner:
        address = public_address(runner.stderr)
        assert address is not None
        api = Addresses(management=runner.address, public=address).api()
        token = (await api.mint("eu_ada"))["token"]
        session_id = (await api.session(token))["session_id"]
        async with open_socket(Addresses(management=runner.address, public=address), session_id) as sock:
            pending_binary = False
            for kind, documented in steps:
                if kind == "send":
                    frame = dict(documented)
                    if frame["type"] == "auth":
                        frame.update(key=token, session_id=session_id)
                    await sock.send_raw(json.dumps(frame))
                    continue
                if kind == "binary":
                    pending_binary = True
                    continue
                got = await sock.receive()
                binaries = 0
                while isinstance(got, bytes):
                    binaries += 1
                    got = await sock.receive()
                # Audio came exactly where the page shows it.
                assert (binaries > 0) == pending_binary, (documented["type"], binaries)
                pending_binary = False
                assert set(got) == set(documented), got
                assert _kept(got) == _kept(documented)
                if "session_id" in got:
                    assert got["session_id"] == session_id
                if "turn" in got:
                    assert re.fullmatch(r"turn_[0-9a-f]{16}", got["turn"])
                if got["type"] == "audio.end":
                    assert abs(got["audio_seconds"] - got["bytes"] / 2 / 22_050) < 0.002, got
