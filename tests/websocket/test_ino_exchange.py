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


def _segments(steps: list[tuple[str, Any]]) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """Each frame the app sends, with the JSON frames the page shows arriving after it."""
    segments: list[tuple[dict[str, Any], list[dict[str, Any]]]] = []
    for kind, frame in steps:
        if kind == "send":
            segments.append((frame, []))
        elif kind == "receive":
            segments[-1][1].append(frame)
    return segments


def _joined(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Consecutive ``text.delta`` frames of a turn as one: the runner joins pieces that wait
    for the socket (docs/agent-websocket.md), so how the text is split varies from run to run.
    """
    out: list[dict[str, Any]] = []
    for frame in frames:
        last = out[-1] if out else None
        if (
            last is not None
            and frame["type"] == last["type"] == "text.delta"
            and frame["turn"] == last["turn"]
        ):
            out[-1] = {**last, "text": last["text"] + frame["text"]}
        else:
            out.append(frame)
    return out


def _key(frame: dict[str, Any]) -> str:
    return json.dumps({k: v for k, v in frame.items() if k not in VOLATILE and k != "seq"}, sort_keys=True)


async def test_the_documented_exchange_is_what_the_runner_sends(tmp_path: Path) -> None:
    steps = _documented()
    segments = _segments(steps)
    assert [sent["type"] for sent, _ in segments] == ["auth", "user_message"]
    async with start_runner(
        tmp_path / "j.db", agent="tests.websocket.doc_agents:pizzeria", env=RUNNER_ENV
    ) as runner:
        address = public_address(runner.stderr)
        assert address is not None
        addresses = Addresses(management=runner.address, public=address)
        api = addresses.api()
        token = (await api.mint("eu_ada"))["token"]
        session_id = (await api.session(token))["session_id"]
        async with open_socket(addresses, session_id) as sock:
            seq = 0
            for sent, documented in segments:
                frame = dict(sent)
                if frame["type"] == "auth":
                    frame.update(key=token, session_id=session_id)
                await sock.send_raw(json.dumps(frame))
                got: list[dict[str, Any]] = []
                audio: list[int] = []  # binary frames, by the audio window they arrived in
                while not got or got[-1]["type"] != documented[-1]["type"]:
                    message = await sock.receive()
                    if isinstance(message, bytes):
                        assert got and got[-1]["type"] == "audio.start", "audio outside an audio window"
                        audio.append(got[-1]["chunk"])
                        continue
                    got.append(message)
                # The same frames: the page's order where the protocol fixes one (a turn starts
                # with turn.start and ends with turn.done; text.chunk and usage may interleave).
                assert sorted(map(_key, _joined(got))) == sorted(map(_key, _joined(documented)))
                assert [f["type"] for f in got][:: len(got) - 1] == [
                    documented[0]["type"],
                    documented[-1]["type"],
                ]
                assert [f["seq"] for f in got] == list(range(seq + 1, seq + 1 + len(got)))
                seq += len(got)
                for each in got:
                    if "session_id" in each:
                        assert each["session_id"] == session_id
                    if "turn" in each:
                        assert re.fullmatch(r"turn_[0-9a-f]{16}", each["turn"])
                    if each["type"] == "audio.end":
                        assert audio.count(each["chunk"]) > 0  # its PCM came inside its window
                        assert abs(each["audio_seconds"] - each["bytes"] / 2 / 22_050) < 0.002, each
