"""A checker of what an ``ino.v2`` socket sends, fed every frame in wire order.

It fails (``ProtocolViolation``) on the first frame that breaks the contract of
``seeds/002``, as ``runner/ino.schema.json`` and the page's prose state it:

* every JSON frame is valid against the schema of its type (every field, nothing else);
* ``seq`` is 1 on ``ready`` and rises by one with every JSON frame but ``pong``, which has none;
* ``ready`` comes first and once;
* a turn opens with ``turn.start`` and ends with exactly one of ``turn.done`` or
  ``interrupted``; everything of a turn carries that turn's id and arrives between the two;
  ``heard`` comes before the reply; ``relation`` only just after its ``turn.done``;
  ``compacted`` never inside a turn;
* ``text.chunk`` indexes count 0, 1, 2, ...; an audio window opens (``audio.start``) for a
  chunk already sent, one window at a time, in chunk order; binary frames arrive only inside a
  window; ``audio.end`` names its window's chunk and counts its bytes and seconds;
* a round's ``text.chunk`` frames and its ``mood`` come before its ``usage`` ("knowledge, mood,
  thought.delta, text.delta, text.chunk and audio windows, interleaved → usage"): after a
  ``usage``, neither comes until the model writes again (a ``text.delta``);
* ``tool.start``/``tool.end`` come in pairs; ``tool.call`` and ``tool.confirm`` fall inside their
  call's pair; ``muted`` comes after the last ``audio.end`` and no window opens after it;
* ``turn.done`` repeats the reply (``message`` is the text deltas joined), its spoken chunks,
  and a spoken turn's ``heard``; ``interrupted.message`` is the text written before it stopped;
* ``thought.delta`` carries text and is never part of the reply: ``message`` leaves it out.
  Whether it may come at all (the frame asked ``thoughts: true`` and the agent's
  ``thinking_summaries`` is ``auto``) is the sender's to know: see ``thoughts_allowed``.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import attrs
from jsonschema import Draft202012Validator

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "runner" / "ino.schema.json"
SCHEMA: dict[str, Any] = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))

# Frames that belong to a turn and carry it as ``turn``.
TURN_FRAMES = frozenset(
    {
        "turn.start",
        "heard",
        "knowledge",
        "mood",
        "thought.delta",
        "text.delta",
        "text.chunk",
        "tool.start",
        "tool.end",
        "tool.call",
        "tool.confirm",
        "audio.start",
        "audio.end",
        "muted",
        "usage",
        "turn.done",
        "interrupted",
    }
)
REPLY_FRAMES = frozenset(
    {"knowledge", "mood", "thought.delta", "text.delta", "text.chunk", "tool.start", "audio.start", "usage"}
)


class ProtocolViolation(AssertionError):
    """A frame broke the contract; the message says which frame and how."""


@cache
def validator(kind: str, side: str = "event") -> Draft202012Validator:
    """A validator of ``$defs['<side>.<kind>']`` resolved inside the schema document."""
    name = f"{side}.{kind}"
    if name not in SCHEMA["$defs"]:
        raise ProtocolViolation(f"no schema for {side} {kind!r}")
    return Draft202012Validator({**SCHEMA, "$ref": f"#/$defs/{name}"})


def schema_errors(frame: Any, side: str = "event") -> list[str]:
    if not isinstance(frame, dict) or not isinstance(frame.get("type"), str):
        return ["a frame is an object with a string type"]
    try:
        check = validator(frame["type"], side)
    except ProtocolViolation as exc:
        return [str(exc)]
    return [f"{list(e.absolute_path)}: {e.message}" for e in check.iter_errors(frame)]


@attrs.define
class _Turn:
    id: str
    frames: list[str] = attrs.Factory(list)
    text: str = ""
    chunks: int = 0
    windows: list[int] = attrs.Factory(list)
    spoken: int = 0
    open_tools: dict[str, str] = attrs.Factory(dict)
    heard: str | None = None
    muted: bool = False
    replied: bool = False
    thoughts: str = ""
    after_usage: bool = False


@attrs.define
class FrameChecker:
    """Feed every message of one connection, in order; read what was seen."""

    frames: list[dict[str, Any]] = attrs.Factory(list)
    binary: list[bytes] = attrs.Factory(list)
    next_seq: int = 1
    turn: _Turn | None = None
    ended_turns: list[str] = attrs.Factory(list)
    window: tuple[int, int, int] | None = None  # (chunk, sample rate, bytes so far)
    last_type: str | None = None
    last_turn_done: str | None = None
    #: ``False``: a test that never asked for thoughts (or whose agent allows none) fails on
    #: any ``thought.delta``.
    thoughts_allowed: bool = True

    def feed(self, message: str | bytes) -> dict[str, Any] | bytes:
        """Check one message; return it decoded (JSON frames) or as it is (audio)."""
        if isinstance(message, (bytes, bytearray)):
            self._audio(bytes(message))
            return bytes(message)
        try:
            frame = json.loads(message)
        except ValueError:
            raise ProtocolViolation(f"a text frame that is not JSON: {message[:200]!r}") from None
        self._frame(frame)
        return frame

    def fail(self, why: str, frame: Any = None) -> None:
        where = f" (frame {len(self.frames) + 1}: {json.dumps(frame)[:300]})" if frame is not None else ""
        raise ProtocolViolation(why + where)

    # -- audio ---------------------------------------------------------------------------------

    def _audio(self, data: bytes) -> None:
        if self.window is None:
            self.fail(f"{len(data)} bytes of binary audio outside an audio window")
        assert self.window is not None
        if not data:
            self.fail("an empty binary frame")
        chunk, rate, count = self.window
        self.window = (chunk, rate, count + len(data))
        self.binary.append(data)

    # -- JSON frames -----------------------------------------------------------------------------

    def _frame(self, frame: Any) -> None:
        errors = schema_errors(frame)
        if errors:
            self.fail("not a valid frame: " + "; ".join(errors), frame)
        kind = frame["type"]
        if kind == "pong":
            self.frames.append(frame)
            return
        if frame["seq"] != self.next_seq:
            self.fail(f"seq {frame['seq']} where {self.next_seq} was due", frame)
        self.next_seq += 1
        if (kind == "ready") != (len([f for f in self.frames if f["type"] != "pong"]) == 0):
            self.fail("ready comes first, and only once", frame)
        if kind == "relation":
            if self.last_type != "turn.done" or frame["turn"] != self.last_turn_done:
                self.fail("relation comes just after the turn.done of its turn", frame)
        elif kind == "compacted" and self.turn is not None:
            self.fail("compacted arrived inside a turn", frame)
        elif kind in ("error", "barge_in"):
            if frame["turn"] is not None and (self.turn is None or frame["turn"] != self.turn.id):
                self.fail(f"{kind} names turn {frame['turn']!r}, which is not running", frame)
        elif kind in TURN_FRAMES:
            self._turn_frame(kind, frame)
        self.frames.append(frame)
        self.last_type = kind

    def _turn_frame(self, kind: str, frame: dict[str, Any]) -> None:
        if kind == "turn.start":
            if self.turn is not None:
                self.fail(f"turn.start while turn {self.turn.id} is still running", frame)
            if frame["turn"] in self.ended_turns:
                self.fail("a turn id was used twice", frame)
            self.turn = _Turn(id=frame["turn"])
            return
        turn = self.turn
        if turn is None:
            self.fail(f"{kind} outside a turn", frame)
        assert turn is not None
        if frame["turn"] != turn.id:
            self.fail(f"{kind} names turn {frame['turn']!r} inside turn {turn.id!r}", frame)
        if kind == "heard":
            if turn.replied or turn.heard is not None:
                self.fail("heard comes once, before the reply", frame)
            turn.heard = frame["text"]
        if kind in REPLY_FRAMES:
            turn.replied = True
        if self.window is not None and kind in ("audio.start", "muted", "turn.done", "interrupted"):
            self.fail(f"{kind} while the window of chunk {self.window[0]} is open", frame)
        if kind == "thought.delta":
            if not self.thoughts_allowed:
                self.fail("thought.delta where no thoughts were asked for or allowed", frame)
            if not frame["text"]:
                self.fail("an empty thought.delta", frame)
            turn.thoughts += frame["text"]
        if kind == "usage":
            turn.after_usage = True
        elif kind == "text.delta":
            turn.after_usage = False
        elif kind in ("text.chunk", "mood") and turn.after_usage:
            self.fail(f"{kind} after the usage of its text", frame)
        if kind == "text.delta":
            turn.text += frame["text"]
        elif kind == "text.chunk":
            if frame["chunk"] != turn.chunks:
                self.fail(f"text.chunk {frame['chunk']} where {turn.chunks} was due", frame)
            turn.chunks += 1
        elif kind == "audio.start":
            chunk = frame["chunk"]
            if turn.muted:
                self.fail("an audio window opened after muted", frame)
            if chunk >= turn.chunks:
                self.fail(f"audio for chunk {chunk} before its text.chunk", frame)
            if turn.windows and chunk <= turn.windows[-1]:
                self.fail(f"audio for chunk {chunk} after chunk {turn.windows[-1]}'s", frame)
            turn.windows.append(chunk)
            self.window = (chunk, frame["sample_rate"], 0)
        elif kind == "audio.end":
            if self.window is None or self.window[0] != frame["chunk"]:
                self.fail(f"audio.end for chunk {frame['chunk']} with no such window open", frame)
            assert self.window is not None
            chunk, rate, count = self.window
            if frame["bytes"] != count:
                self.fail(f"audio.end counts {frame['bytes']} bytes; the window carried {count}", frame)
            if abs(frame["audio_seconds"] - count / 2 / rate) > 0.002:
                self.fail(
                    f"audio.end says {frame['audio_seconds']} s; {count} bytes at {rate} Hz are {count / 2 / rate:.3f} s",
                    frame,
                )
            if count:
                turn.spoken += 1
            self.window = None
        elif kind == "tool.start":
            key = frame["call_id"] or frame["name"]
            if key in turn.open_tools:
                self.fail(f"tool.start for {key!r} twice", frame)
            turn.open_tools[key] = frame["name"]
        elif kind in ("tool.call", "tool.confirm"):
            if frame["call_id"] not in turn.open_tools:
                self.fail(f"{kind} for {frame['call_id']!r} outside its tool.start/tool.end", frame)
        elif kind == "tool.end":
            key = frame["call_id"] or frame["name"]
            if turn.open_tools.pop(key, None) != frame["name"]:
                self.fail(f"tool.end for {key!r} with no tool.start", frame)
        elif kind == "muted":
            if turn.muted:
                self.fail("muted twice in one turn", frame)
            turn.muted = True
        elif kind in ("turn.done", "interrupted"):
            if turn.open_tools:
                self.fail(f"{kind} with tools still open: {sorted(turn.open_tools)}", frame)
            if frame["message"] != turn.text:
                self.fail(f"{kind}.message is not the text deltas joined ({turn.text!r})", frame)
            if kind == "turn.done":
                if frame["chunks_spoken"] != turn.spoken:
                    self.fail(
                        f"chunks_spoken {frame['chunks_spoken']} but {turn.spoken} windows carried audio",
                        frame,
                    )
                if turn.heard is not None and frame["heard"] != turn.heard:
                    self.fail("turn.done.heard is not the heard text", frame)
                if frame["session_id"] is None:
                    self.fail("turn.done without session_id", frame)
                self.last_turn_done = turn.id
            self.ended_turns.append(turn.id)
            self.turn = None

    # -- reading ---------------------------------------------------------------------------------

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [f for f in self.frames if f["type"] == kind]

    def turn_frames(self, turn: str) -> list[dict[str, Any]]:
        return [f for f in self.frames if f.get("turn") == turn]

    def finish(self, *, turn_may_be_open: bool = False) -> None:
        """The connection ended: no audio window may be left open, nor a turn unless allowed."""
        if self.window is not None:
            self.fail(f"the connection ended inside the audio window of chunk {self.window[0]}")
        if self.turn is not None and not turn_may_be_open:
            self.fail(f"the connection ended inside turn {self.turn.id}")
