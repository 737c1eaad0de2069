"""What a turn reports: the one vocabulary of turn events, from its start to its result.

The turn engine (:mod:`.engine`) reports most of these as it runs a turn; the agent's owner
adds what only it knows (a tool's kind, the reply's mood, a barge-in, a call sent to the app).
Everyone downstream maps them and declares none again: the platform passes them to the people
in a conversation (``runner.platform``), the agent WebSocket writes them as ``ino.v2`` frames
(one ``match`` in ``runner.transports.websocket``), the console shows them, the call's
pipeline plays their audio. A new fact of a turn is one class here and one case in each map.
"""

from __future__ import annotations

from typing import Any

import attrs

# A tool call's kind and a turn's timings are stated by the agent socket's frames exactly as a
# turn knows them, so they are declared once, there (the lower layer), and used here as they are.
from ..ino_wire import ToolKind as ToolKind
from ..ino_wire import TurnTimings as TurnTimings
from ..providers import Usage


@attrs.frozen(kw_only=True)
class TurnStarted:
    turn: str


@attrs.frozen(kw_only=True)
class Heard:
    """A spoken turn's transcript, once the turn has heard it (before the reply)."""

    turn: str
    text: str
    audio_seconds: float


@attrs.frozen(kw_only=True)
class BargedIn:
    """The person was heard over the agent; their running turn (``turn``, if any) is cut.

    ``recording_id`` names the recording that heard them, where a transport names recordings.
    """

    text: str
    recording_id: str | None
    turn: str | None


@attrs.frozen(kw_only=True)
class Thought:
    """A piece of the model's thinking summary, for a turn run with ``thoughts=True``.

    Never part of the reply: not in :attr:`TurnResult.text`, the history the model reads
    next, nor what is spoken.
    """

    turn: str
    text: str


@attrs.frozen(kw_only=True)
class ReplyDelta:
    turn: str
    text: str


@attrs.frozen(kw_only=True)
class ReplyChunk:
    """A piece of the reply cut to be spoken (a sentence, mostly), numbered from 0."""

    turn: str
    chunk: int
    text: str


@attrs.frozen(kw_only=True)
class MoodJudged:
    """How the agent feels in its reply so far: once its text is written, before the usage."""

    turn: str
    mood: str
    intensity: float


@attrs.frozen(kw_only=True)
class AudioStart:
    turn: str
    chunk: int
    sample_rate_hz: int


@attrs.frozen(kw_only=True)
class AudioData:
    turn: str
    chunk: int
    pcm: bytes


@attrs.frozen(kw_only=True)
class AudioEnd:
    turn: str
    chunk: int
    bytes: int
    audio_seconds: float


@attrs.frozen(kw_only=True)
class SpeechFailed:
    """A chunk could not be spoken; the text turn carries on."""

    turn: str
    chunk: int
    code: str
    message: str


@attrs.frozen(kw_only=True)
class Muted:
    turn: str


@attrs.frozen(kw_only=True)
class ToolStarted:
    """A tool call begins; ``kind`` is filled in by an owner that tells kinds apart."""

    turn: str
    call_id: str
    name: str
    arguments: dict[str, Any]
    kind: ToolKind | None = None


@attrs.frozen(kw_only=True)
class ToolEnded:
    """A tool call ended; one cut short by the turn's end ends with ``ok=False``."""

    turn: str
    call_id: str
    name: str
    ok: bool
    ms: int
    result: Any
    error: str | None
    kind: ToolKind | None = None


@attrs.frozen(kw_only=True)
class ToolConfirmRequested:
    """A tool that asks first was called and has not run: the person must say yes."""

    turn: str
    call_id: str
    name: str
    arguments: dict[str, Any]


@attrs.frozen(kw_only=True)
class AppToolCalled:
    """The model called a tool the person's app runs: the call goes to the app to answer."""

    turn: str
    call_id: str
    name: str
    arguments: dict[str, Any]
    action_only: bool
    timeout_ms: int


@attrs.frozen(kw_only=True)
class UsageReported:
    turn: str
    usage: Usage
    generation_seconds: float


@attrs.frozen(kw_only=True)
class ToolRecord:
    call_id: str
    name: str
    arguments: dict[str, Any]
    result: Any
    ok: bool
    error: str | None
    ms: int
    round: int


@attrs.frozen(kw_only=True)
class TurnResult:
    """How a turn ended: exactly one per turn, ``interrupted`` or done."""

    turn: str
    text: str
    interrupted: bool
    reason: str | None
    error_code: str | None
    chunks_spoken: int
    tool_calls: tuple[ToolRecord, ...]
    usage: tuple[Usage, ...]
    timings: TurnTimings
    heard: str | None = None
    heard_seconds: float | None = None
    #: Where a failed turn failed (``"stt"``, ``"model"``), with ``error_code``.
    stage: str | None = None


@attrs.frozen(kw_only=True)
class TurnFinished:
    result: TurnResult


TurnEvent = (
    TurnStarted
    | Heard
    | BargedIn
    | Thought
    | ReplyDelta
    | ReplyChunk
    | MoodJudged
    | AudioStart
    | AudioData
    | AudioEnd
    | SpeechFailed
    | Muted
    | ToolStarted
    | ToolEnded
    | ToolConfirmRequested
    | AppToolCalled
    | UsageReported
    | TurnFinished
)
