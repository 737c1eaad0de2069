"""What a conversation reports, as ``ino.v2`` frames: the one place the platform meets the wire."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import attrs

from ... import ino_wire as w
from ...calls import keep_json
from ...platform import HEARING_RATE_HZ
from ...platform._events import (
    AppToolCalled,
    BargedIn,
    Charged,
    Compacted,
    ConversationEvent,
    Joined,
    KnowledgeSearched,
    MoodJudged,
    NoVoice,
    Refused,
    ToolClosed,
    ToolOpened,
    TurnClosed,
    TurnFailed,
    TurnOpened,
)
from ...voice.engine import (
    AudioData,
    AudioEnd,
    AudioStart,
    Heard,
    Muted,
    ReplyChunk,
    ReplyDelta,
    SpeechFailed,
    Thought,
    ToolConfirmRequested,
    UsageReported,
)
from ._common import REFUSALS, edge_version, relation_body, wire_call_id


def frames_of(event: ConversationEvent, *, idle_seconds: int) -> Iterator[Any]:
    """The frames (and binary audio, as ``bytes``) that say ``event`` on a socket, in order."""
    if isinstance(event, ReplyDelta):
        yield w.TextDelta(turn=event.turn, text=event.text)
    elif isinstance(event, AudioData):
        yield event.pcm
    elif isinstance(event, ReplyChunk):
        yield w.TextChunk(turn=event.turn, chunk=event.chunk, text=event.text)
    elif isinstance(event, AudioStart):
        yield w.AudioStart(turn=event.turn, chunk=event.chunk, sample_rate=event.sample_rate_hz)
    elif isinstance(event, AudioEnd):
        yield w.AudioEnd(
            turn=event.turn, chunk=event.chunk, bytes=event.bytes, audio_seconds=round(event.audio_seconds, 3)
        )
    elif isinstance(event, Joined):
        rate = event.voice_rate_hz
        yield w.Ready(
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
    elif isinstance(event, TurnOpened):
        yield w.TurnStart(turn=event.turn, session_id=event.conversation_id)
    elif isinstance(event, NoVoice):
        yield w.Error(
            code="unavailable",
            message="this agent has no voice: the reply is text only",
            turn=event.turn,
            stage="speech",
        )
    elif isinstance(event, Refused):
        code, message = REFUSALS[event.reason]
        yield w.Error(code=code, message=message)
    elif isinstance(event, Heard):
        yield w.Heard(turn=event.turn, text=event.text, audio_seconds=round(event.audio_seconds, 3))
    elif isinstance(event, Thought):
        yield w.ThoughtDelta(turn=event.turn, text=event.text)
    elif isinstance(event, KnowledgeSearched):
        yield w.Knowledge(
            turn=event.turn,
            via=event.via,
            outcome=event.outcome,
            entries=[w.KnowledgeEntry(entry_id=h.entry_id, title=h.title, score=h.score) for h in event.hits],
        )
    elif isinstance(event, MoodJudged):
        yield w.Mood(turn=event.turn, mood=event.mood, intensity=event.intensity)
    elif isinstance(event, ToolOpened):
        yield w.ToolStart(
            turn=event.turn, name=event.name, kind=event.kind, call_id=wire_call_id(event.kind, event.call_id)
        )
    elif isinstance(event, ToolClosed):
        yield w.ToolEnd(
            turn=event.turn,
            name=event.name,
            kind=event.kind,
            call_id=wire_call_id(event.kind, event.call_id),
            ok=event.ok,
            ms=event.ms,
        )
    elif isinstance(event, ToolConfirmRequested):
        yield w.ToolConfirm(
            turn=event.turn, call_id=event.call_id, name=event.name, arguments=dict(event.arguments)
        )
    elif isinstance(event, AppToolCalled):
        yield w.ToolCallFrame(
            turn=event.turn,
            call_id=event.call_id,
            name=event.name,
            arguments=event.arguments,
            action_only=event.action_only,
            timeout_ms=event.timeout_ms,
        )
    elif isinstance(event, UsageReported):
        usage = event.usage
        yield w.UsageFrame(
            turn=event.turn,
            model=usage.model,
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            thought_tokens=usage.thought_tokens,
            cached_tokens=usage.cached_tokens,
            generation_seconds=round(event.generation_seconds, 3),
        )
    elif isinstance(event, SpeechFailed):
        yield w.Error(
            code="provider_failed",
            message=f"speech failed: {event.message}",
            turn=event.turn,
            stage="speech",
            chunk=event.chunk,
        )
    elif isinstance(event, Muted):
        yield w.Muted(turn=event.turn)
    elif isinstance(event, BargedIn):
        yield w.BargeIn(text=event.text, recording_id=event.recording_id, turn=event.turn)
    elif isinstance(event, TurnFailed):
        yield w.Error(code="internal", message="the turn failed on our side", turn=event.turn)
        yield w.Interrupted(
            turn=event.turn, message=event.text, mood=None, mood_intensity=None, reason="internal"
        )
    elif isinstance(event, TurnClosed):
        yield from _closed(event)
    elif isinstance(event, Compacted):
        yield w.Compacted(
            session_id=event.conversation_id, after_seq=event.after_position, trigger=event.trigger
        )
    elif isinstance(event, Charged):
        return
    else:  # pragma: no cover - the union is exhaustive
        raise TypeError(f"no frame for {event!r}")


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
        timings=w.TurnTimings(
            model_first_text_ms=result.timings.model_first_text_ms,
            first_audio_sent_ms=result.timings.first_audio_sent_ms,
            total_ms=result.timings.total_ms,
        ),
    )
    if event.relation is not None:
        yield w.Relation(turn=tid, **attrs.asdict(relation_body(event.relation), recurse=False))


def _kept(value: Any) -> Any:
    """A tool's result as ``turn.done`` lists it: as read, cut at 4 KiB of JSON."""
    try:
        return keep_json(value)[0]
    except (TypeError, ValueError):
        return keep_json(str(value))[0]
