"""What a conversation reports, as ``ino.v2`` frames: the one place the platform meets the wire.

A turn's event whose frame says just what it says is written as it is, under its frame's
type (:data:`EVENT_FRAMES`); every other event is one case of :func:`frames_of`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, assert_never

import attrs

from ... import ino_wire as w
from ...calls import keep_json
from ...platform import (
    HEARING_RATE_HZ,
    Charged,
    Compacted,
    ConversationEvent,
    Joined,
    KnowledgeSearched,
    NoVoice,
    Refused,
    TurnClosed,
    TurnFailed,
)
from ...voice.events import (
    AppToolCalled,
    AudioData,
    AudioEnd,
    AudioStart,
    BargedIn,
    Heard,
    MoodJudged,
    Muted,
    ReplyChunk,
    ReplyDelta,
    SpeechFailed,
    Thought,
    ToolConfirmRequested,
    ToolEnded,
    ToolStarted,
    TurnFinished,
    TurnStarted,
    UsageReported,
)
from ._common import REFUSALS, edge_version, relation_body, wire_call_id

# The frame type of each turn event the socket writes as it is: its fields are the frame's.
EVENT_FRAMES: dict[type[Any], str] = {
    ReplyDelta: "text.delta",
    Thought: "thought.delta",
    ReplyChunk: "text.chunk",
    Heard: "heard",
    BargedIn: "barge_in",
    MoodJudged: "mood",
    AudioEnd: "audio.end",
    Muted: "muted",
    ToolConfirmRequested: "tool.confirm",
    AppToolCalled: "tool.call",
}


def encode_frame(frame: Any, seq: int) -> str:
    """A frame of :func:`frames_of` as its JSON text, ``seq`` its number on the socket."""
    return w.encode_frame(frame, seq, kind=EVENT_FRAMES.get(type(frame)))


def frames_of(event: ConversationEvent, *, session_id: str, idle_seconds: int) -> Iterator[Any]:
    """The frames (and binary audio, as ``bytes``) that say ``event`` on a socket, in order.

    ``session_id`` is the conversation the socket is pinned to.
    """
    match event:
        case (
            ReplyDelta()
            | Thought()
            | ReplyChunk()
            | BargedIn()
            | MoodJudged()
            | Muted()
            | ToolConfirmRequested()
            | AppToolCalled()
        ):
            yield event  # as written (EVENT_FRAMES)
        case AudioData(pcm=pcm):
            yield pcm
        case AudioStart(turn=turn, chunk=chunk, sample_rate_hz=rate_hz):
            yield w.AudioStart(turn=turn, chunk=chunk, sample_rate=rate_hz)
        case AudioEnd(audio_seconds=seconds) | Heard(audio_seconds=seconds):
            yield attrs.evolve(event, audio_seconds=round(seconds, 3))
        case Joined():
            yield _ready(event, idle_seconds)
        case TurnStarted(turn=turn):
            yield w.TurnStart(turn=turn, session_id=session_id)
        case NoVoice(turn=turn):
            message = "this agent has no voice: the reply is text only"
            yield w.Error(code="unavailable", message=message, turn=turn, stage="speech")
        case Refused(reason=reason):
            code, message = REFUSALS[reason]
            yield w.Error(code=code, message=message)
        case KnowledgeSearched(turn=turn, via=via, outcome=outcome, hits=hits):
            entries = [w.KnowledgeEntry(entry_id=h.entry_id, title=h.title, score=h.score) for h in hits]
            yield w.Knowledge(turn=turn, via=via, outcome=outcome, entries=entries)
        case ToolStarted(turn=turn, call_id=call_id, name=name, kind=kind):
            kind = kind or "webhook"
            yield w.ToolStart(turn=turn, name=name, kind=kind, call_id=wire_call_id(kind, call_id))
        case ToolEnded(turn=turn, call_id=call_id, name=name, kind=kind, ok=ok, ms=ms):
            kind = kind or "webhook"
            yield w.ToolEnd(
                turn=turn, name=name, kind=kind, call_id=wire_call_id(kind, call_id), ok=ok, ms=ms
            )
        case UsageReported(turn=turn, usage=usage, generation_seconds=seconds):
            yield w.UsageFrame(
                turn=turn,
                model=usage.model,
                input_tokens=usage.input_tokens,
                output_tokens=usage.output_tokens,
                thought_tokens=usage.thought_tokens,
                cached_tokens=usage.cached_tokens,
                generation_seconds=round(seconds, 3),
            )
        case SpeechFailed(turn=turn, chunk=chunk, message=message):
            yield w.Error(
                code="provider_failed",
                message=f"speech failed: {message}",
                turn=turn,
                stage="speech",
                chunk=chunk,
            )
        case TurnFailed(turn=turn, text=text):
            yield w.Error(code="internal", message="the turn failed on our side", turn=turn)
            yield w.Interrupted(turn=turn, message=text, mood=None, mood_intensity=None, reason="internal")
        case TurnClosed():
            yield from _closed(event)
        case Compacted(conversation_id=conversation_id, after_position=after, trigger=trigger):
            yield w.Compacted(session_id=conversation_id, after_seq=after, trigger=trigger)
        case TurnFinished() | Charged():
            return  # the socket says a turn's end with TurnClosed; a charge has no frame
        case _:
            assert_never(event)


def _ready(event: Joined, idle_seconds: int) -> w.Ready:
    rate = event.voice_rate_hz
    return w.Ready(
        session_id=event.conversation_id,
        agent_id=event.agent_id,
        end_user_id=event.end_user_id,
        speaks=rate is not None,
        audio=w.AudioFormat(sample_rate=rate or 24_000),
        hearing=w.AudioFormat(sample_rate=HEARING_RATE_HZ),
        emotion=event.moods,
        relation=relation_body(event.relation) if event.relation is not None else None,
        greeting=event.greeting,
        idle_seconds=idle_seconds,
        edge_version=edge_version(),
    )


def _closed(event: TurnClosed) -> Iterator[Any]:
    result = event.result
    tid = event.turn
    mood, intensity = event.mood if event.mood is not None else (None, None)
    if result.interrupted:
        if result.error_code is not None:
            yield w.Error(
                code="provider_failed",
                message=(result.reason or result.error_code)[:500],
                turn=tid,
                stage=event.stage,
            )
        yield w.Interrupted(
            turn=tid, message=result.text, mood=mood, mood_intensity=intensity, reason=event.reason
        )
        return
    models = [u.model for u in result.usage]
    yield w.TurnDone(
        turn=tid,
        session_id=event.conversation_id,
        message=result.text,
        model=models[-1] if models else None,
        input_tokens=sum(u.input_tokens for u in result.usage) if models else None,
        output_tokens=sum(u.output_tokens for u in result.usage) if models else None,
        mood=mood,
        mood_intensity=intensity,
        truncated=False,
        chunks_spoken=result.chunks_spoken,
        heard=result.heard,
        heard_seconds=round(result.heard_seconds, 3) if result.heard_seconds is not None else None,
        tool_calls=[
            w.ToolCallRecord(
                call_id=c.call_id,
                name=c.name,
                kind=kind,
                arguments=dict(c.arguments),
                result=_kept(c.result) if c.ok else None,
                ok=c.ok,
                error=c.error,
                ms=c.ms,
                round=c.round,
            )
            for c, kind in event.reported_tools()
        ],
        sources=[],
        timings=result.timings,
    )
    if event.relation is not None:
        yield w.Relation(turn=tid, **attrs.asdict(relation_body(event.relation), recurse=False))


def _kept(value: Any) -> Any:
    """A tool's result as ``turn.done`` lists it: as read, cut at 4 KiB of JSON."""
    try:
        return keep_json(value)[0]
    except (TypeError, ValueError):
        return keep_json(str(value))[0]
