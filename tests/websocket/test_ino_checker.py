"""The frame checker fails on broken streams: each case breaks one rule of a valid stream."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from .ino_checker import FrameChecker, ProtocolViolation

TURN = "turn_1"
OTHER = "turn_2"
AUDIO = b"\x01\x00" * 2205  # 0.1 s at 22,050 Hz

DEFAULTS: dict[str, dict[str, Any]] = {
    "ready": {
        "protocol": "ino.v2",
        "session_id": "s",
        "agent_id": "a",
        "end_user_id": "e",
        "speaks": True,
        "audio": {"codec": "pcm_s16le", "sample_rate": 22050, "channels": 1},
        "hearing": {"codec": "pcm_s16le", "sample_rate": 16000, "channels": 1},
        "emotion": False,
        "relation": None,
        "greeting": False,
        "idle_seconds": 300,
        "edge_version": "0.1.0",
    },
    "turn.start": {"turn": TURN, "session_id": "s"},
    "heard": {"turn": TURN, "text": "hello", "audio_seconds": 1.0},
    "thought.delta": {"turn": TURN, "text": "They greet me. "},
    "text.delta": {"turn": TURN, "text": "Hi there. "},
    "text.chunk": {"turn": TURN, "chunk": 0, "text": "Hi there."},
    "audio.start": {"turn": TURN, "chunk": 0, "codec": "pcm_s16le", "sample_rate": 22050, "channels": 1},
    "audio.end": {"turn": TURN, "chunk": 0, "bytes": len(AUDIO), "audio_seconds": 0.1},
    "usage": {
        "turn": TURN,
        "model": "local",
        "input_tokens": 3,
        "output_tokens": 2,
        "thought_tokens": 0,
        "cached_tokens": 0,
        "generation_seconds": 0.1,
    },
    "tool.start": {"turn": TURN, "name": "open_page", "kind": "app", "call_id": "call_1"},
    "tool.call": {
        "turn": TURN,
        "call_id": "call_1",
        "name": "open_page",
        "arguments": {},
        "action_only": False,
        "timeout_ms": 1000,
    },
    "tool.end": {"turn": TURN, "name": "open_page", "kind": "app", "call_id": "call_1", "ok": True, "ms": 3},
    "muted": {"turn": TURN},
    "turn.done": {
        "turn": TURN,
        "session_id": "s",
        "message": "Hi there. ",
        "model": "local",
        "input_tokens": 3,
        "output_tokens": 2,
        "mood": None,
        "mood_intensity": None,
        "truncated": False,
        "chunks_spoken": 1,
        "heard": None,
        "heard_seconds": None,
        "tool_calls": [],
        "sources": [],
        "timings": {"model_first_text_ms": 1, "first_audio_sent_ms": 2, "total_ms": 3},
    },
    "interrupted": {
        "turn": TURN,
        "message": "Hi there. ",
        "mood": None,
        "mood_intensity": None,
        "reason": "cancel",
    },
    "error": {
        "code": "conflict",
        "message": "busy",
        "turn": None,
        "stage": None,
        "chunk": None,
        "request_id": None,
        "recording_id": None,
    },
    "relation": {"turn": TURN},
    "compacted": {"session_id": "s", "after_seq": 4, "trigger": "automatic"},
    "heard.partial": {"text": "hel"},
    "transcript": {"text": "hello", "audio_seconds": 1.0, "request_id": "req_1", "recording_id": None},
}

Step = tuple[str, dict[str, Any]] | bytes


def f(kind: str, **fields: Any) -> Step:
    return (kind, {**DEFAULTS.get(kind, {}), **fields})


def typed_turn() -> list[Step]:
    return [
        f("ready"),
        f("turn.start"),
        f("text.delta"),
        f("text.chunk"),
        f("audio.start"),
        AUDIO,
        f("audio.end"),
        f("usage"),
        f("turn.done"),
    ]


def feed(steps: list[Step], *, seqs: dict[int, Any] | None = None) -> FrameChecker:
    """Feed the steps with gapless seqs (``seqs`` overrides by JSON frame index); return the checker."""
    checker = FrameChecker()
    seq = 0
    for index, step in enumerate(steps):
        if isinstance(step, bytes):
            checker.feed(step)
            continue
        kind, fields = step
        frame: dict[str, Any] = {"type": kind}
        if kind != "pong":
            seq += 1
            frame["seq"] = (seqs or {}).get(index, seq)
        frame.update(fields)
        checker.feed(json.dumps(frame))
    return checker


def _no_thoughts(steps: list[Step]) -> FrameChecker:
    checker = FrameChecker(thoughts_allowed=False)
    for seq, step in enumerate(steps, start=1):
        assert not isinstance(step, bytes)
        kind, fields = step
        checker.feed(json.dumps({"type": kind, "seq": seq, **fields}))
    return checker


def test_thoughts_are_read_apart_from_the_reply() -> None:
    checker = feed(
        [
            f("ready"),
            f("turn.start"),
            f("thought.delta", text="Hm, "),
            f("thought.delta", text="noon."),
            f("text.delta", text="Hi."),
            f("turn.done", message="Hi.", chunks_spoken=0),
        ]
    )
    checker.finish()
    assert [x["text"] for x in checker.of_type("thought.delta")] == ["Hm, ", "noon."]


def test_a_valid_stream_passes_and_is_read_back() -> None:
    steps = [
        *typed_turn(),
        f("relation"),
        ("pong", {}),
        f("transcript"),
        f("compacted"),
        f("turn.start", turn=OTHER),
        f("heard", turn=OTHER),
        f("tool.start", turn=OTHER),
        f("tool.call", turn=OTHER),
        f("tool.end", turn=OTHER),
        f("error", turn=OTHER, code="provider_failed", stage="speech", chunk=0),
        f("heard.partial"),
        f("muted", turn=OTHER),
        f("interrupted", turn=OTHER, message=""),
    ]
    checker = feed(steps)
    checker.finish()
    assert [x["type"] for x in checker.of_type("turn.done")] == ["turn.done"]
    assert checker.binary == [AUDIO] and checker.ended_turns == [TURN, OTHER]


def _without(kind: str, field: str) -> Step:
    fields = dict(DEFAULTS[kind])
    del fields[field]
    return (kind, fields)


BROKEN: list[tuple[str, Callable[[], FrameChecker], str]] = [
    ("a gap in seq", lambda: feed(typed_turn(), seqs={3: 5}), "seq 5 where 4 was due"),
    ("a repeated seq", lambda: feed(typed_turn(), seqs={3: 3}), "seq 3 where 4 was due"),
    ("a pong with a seq", lambda: feed([f("ready"), ("pong", {"seq": 2})]), "not a valid frame"),
    (
        "a missing field",
        lambda: feed([*typed_turn()[:-1], _without("turn.done", "timings")]),
        "'timings' is a required property",
    ),
    (
        "a field left out as absent rather than null",
        lambda: feed([*typed_turn()[:-1], _without("turn.done", "heard")]),
        "'heard' is a required property",
    ),
    ("an extra field", lambda: feed([f("ready", colour="red")]), "Additional properties are not allowed"),
    (
        "null where a value is due",
        lambda: feed([f("ready"), f("turn.start"), f("text.delta", text=None)]),
        "None is not of type 'string'",
    ),
    ("an unknown event", lambda: feed([f("ready"), ("shout", {})]), "no schema for event 'shout'"),
    ("text that is not JSON", lambda: FrameChecker().feed("{nope"), "not JSON"),
    ("ready that is not first", lambda: feed([f("transcript"), f("ready")]), "ready comes first"),
    ("a second ready", lambda: feed([f("ready"), f("ready")]), "ready comes first"),
    (
        "a turn's frame outside any turn",
        lambda: feed([f("ready"), f("text.delta")]),
        "text.delta outside a turn",
    ),
    (
        "a frame naming another turn",
        lambda: feed([f("ready"), f("turn.start"), f("text.delta", turn=OTHER)]),
        "names turn 'turn_2' inside turn 'turn_1'",
    ),
    (
        "a turn that starts inside another",
        lambda: feed([f("ready"), f("turn.start"), f("turn.start", turn=OTHER)]),
        "still running",
    ),
    ("two ends of one turn", lambda: feed([*typed_turn(), f("interrupted")]), "interrupted outside a turn"),
    ("a turn id used twice", lambda: feed([*typed_turn(), f("turn.start")]), "used twice"),
    ("audio outside a window", lambda: feed([f("ready"), f("turn.start"), AUDIO]), "outside an audio window"),
    (
        "audio.end that miscounts",
        lambda: feed([*typed_turn()[:6], f("audio.end", bytes=7)]),
        "the window carried 4410",
    ),
    (
        "audio.end with the wrong seconds",
        lambda: feed([*typed_turn()[:6], f("audio.end", audio_seconds=0.2)]),
        "0.100 s",
    ),
    (
        "two windows open at once",
        lambda: feed([*typed_turn()[:5], f("text.chunk", chunk=1), f("audio.start", chunk=1)]),
        "while the window of chunk 0 is open",
    ),
    (
        "a window for a chunk not yet sent",
        lambda: feed([f("ready"), f("turn.start"), f("audio.start")]),
        "before its text.chunk",
    ),
    ("windows out of chunk order", lambda: feed([*typed_turn()[:7], f("audio.start")]), "after chunk 0's"),
    (
        "a skipped chunk index",
        lambda: feed([f("ready"), f("turn.start"), f("text.chunk", chunk=1)]),
        "text.chunk 1 where 0 was due",
    ),
    (
        "audio after muted",
        lambda: feed([f("ready"), f("turn.start"), f("text.chunk"), f("muted"), f("audio.start")]),
        "after muted",
    ),
    ("muted inside a window", lambda: feed([*typed_turn()[:6], f("muted")]), "muted while the window"),
    (
        "heard after the reply began",
        lambda: feed([f("ready"), f("turn.start"), f("text.delta"), f("heard")]),
        "heard comes once, before the reply",
    ),
    (
        "tool.end with no tool.start",
        lambda: feed([f("ready"), f("turn.start"), f("tool.end")]),
        "no tool.start",
    ),
    (
        "tool.call outside its pair",
        lambda: feed([f("ready"), f("turn.start"), f("tool.call")]),
        "outside its tool.start/tool.end",
    ),
    (
        "a turn that ends with a tool open",
        lambda: feed([f("ready"), f("turn.start"), f("tool.start"), f("interrupted", message="")]),
        "tools still open",
    ),
    (
        "turn.done that is not the deltas joined",
        lambda: feed([*typed_turn()[:-1], f("turn.done", message="Hi.")]),
        "not the text deltas joined",
    ),
    (
        "turn.done that miscounts spoken chunks",
        lambda: feed([*typed_turn()[:-1], f("turn.done", chunks_spoken=2)]),
        "chunks_spoken 2 but 1",
    ),
    (
        "turn.done whose heard is not the heard",
        lambda: feed(
            [
                f("ready"),
                f("turn.start"),
                f("heard"),
                f("turn.done", message="", chunks_spoken=0, heard="bye"),
            ]
        ),
        "not the heard text",
    ),
    (
        "relation not just after its turn.done",
        lambda: feed([*typed_turn(), ("pong", {}), f("transcript"), f("relation")]),
        "relation comes just after",
    ),
    (
        "compacted inside a turn",
        lambda: feed([f("ready"), f("turn.start"), f("compacted")]),
        "compacted arrived inside a turn",
    ),
    (
        "a thought.delta that was not asked for",
        lambda: _no_thoughts([f("ready"), f("turn.start"), f("thought.delta")]),
        "no thoughts were asked for",
    ),
    (
        "an empty thought.delta",
        lambda: feed([f("ready"), f("turn.start"), f("thought.delta", text="")]),
        "an empty thought.delta",
    ),
    (
        "turn.done that counts a thought as reply",
        lambda: feed(
            [
                f("ready"),
                f("turn.start"),
                f("thought.delta", text="Hm."),
                f("turn.done", message="Hm.", chunks_spoken=0),
            ]
        ),
        "not the text deltas joined",
    ),
    (
        "an error naming a turn that is not running",
        lambda: feed([f("ready"), f("error", turn=TURN)]),
        "which is not running",
    ),
    (
        "a text chunk after its usage",
        lambda: feed([f("ready"), f("turn.start"), f("text.delta"), f("usage"), f("text.chunk")]),
        "text.chunk after the usage of its text",
    ),
    (
        "a mood after the usage",
        lambda: feed(
            [
                f("ready"),
                f("turn.start"),
                f("text.delta"),
                f("text.chunk"),
                f("usage"),
                ("mood", {"turn": TURN, "mood": "calm", "intensity": 0.2}),
            ]
        ),
        "mood after the usage of its text",
    ),
    (
        "a bad sample rate",
        lambda: feed([f("ready", audio={"codec": "pcm_s16le", "sample_rate": 12345, "channels": 1})]),
        "12345 is not one of",
    ),
]


@pytest.mark.parametrize(("case", "broken", "why"), BROKEN, ids=[c[0] for c in BROKEN])
def test_a_broken_stream_fails_the_checker(case: str, broken: Callable[[], FrameChecker], why: str) -> None:
    with pytest.raises(
        ProtocolViolation, match=why.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")
    ):
        broken()


@pytest.mark.parametrize(
    ("steps", "why"),
    [
        (typed_turn()[:5], "inside the audio window of chunk 0"),
        (typed_turn()[:3], "inside turn turn_1"),
    ],
    ids=["an open window", "an open turn"],
)
def test_a_connection_that_ends_mid_turn_fails_unless_allowed(steps: list[Step], why: str) -> None:
    checker = feed(steps)
    with pytest.raises(ProtocolViolation, match=why):
        checker.finish()
    if "window" not in why:
        checker.finish(turn_may_be_open=True)
