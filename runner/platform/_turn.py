"""Who is in a conversation, what they ask of it, and how the turn it runs for them stands."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Literal, Protocol

import attrs
import trio

from journal import AgentStore, RelationRow

from ..voice.events import MoodJudged, ToolKind
from ..voice.recording import Recording
from ._events import ConversationEvent, Stage
from ._rules import mood_of

if TYPE_CHECKING:
    from ..agent import Agent


class Participant(Protocol):
    """Someone in a conversation (a socket of the agent WebSocket): who, and where its events go."""

    end_user_id: str
    token_id: str
    app_tools: tuple[str, ...]

    def deliver(self, event: ConversationEvent) -> None:
        """Take an event of the conversation, in order, without waiting."""
        ...

    def turn_over(self) -> None:
        """A turn this participant asked for is over (it may close now)."""
        ...


class ConversationHost(Protocol):
    """What a conversation needs from the platform that holds it (:class:`~._service.Platform`)."""

    store: AgentStore
    agent: Agent
    agent_id: str

    def start_turn_soon(self, fn: Callable[..., Any], *args: Any) -> None: ...

    def check_turn_rate(self, token_id: str) -> None: ...


class ConversationClosed(Exception):
    """The conversation's call is ending, or its agent did not start: ``reason`` says which."""


@attrs.frozen(kw_only=True)
class TurnRequest:
    """What a participant asked for: typed words, a recording, a confirmation, or the opening."""

    text: str | None = None
    scripted: str | None = None
    recording: Recording | None = None
    confirm_call_id: str | None = None
    yes: bool = False
    speech: bool | None = None
    thoughts: bool = False


# What became of a participant's request: taken now, held behind a turn that unwinds, or refused.
Outcome = Literal["started", "held", "conflict"]


@attrs.define(eq=False, kw_only=True)
class RunningTurn:
    """A turn of the conversation, from the request to the owner's last event of it.

    Attributes:
        app_tools: The app's tools this turn offers (the owner's, the agent allows).
        platform_tools: The platform's own tools, by name.
        moods: Whether the agent reports its moods.
    """

    id: str
    owner: Participant
    request: TurnRequest
    app_tools: frozenset[str]
    platform_tools: frozenset[str] = frozenset()
    moods: bool = False
    stage: Stage = "model"
    cancel_reason: str | None = None
    mute_requested: bool = False
    muted_sent: bool = False
    started: bool = False
    finished: bool = False
    text: str = ""
    open_tools: dict[str, tuple[str, ToolKind, float]] = attrs.Factory(dict)
    knowledge: str | None = None
    relation: RelationRow | None = None
    speech_seconds: float = 0.0
    # The reply's text the last mood was judged on.
    mood_text: str | None = None
    # The open audio window: its rate, and the bytes of it handed to the owner so far.
    window_rate_hz: int = 0
    window_chunk: int = 0
    window_bytes: int = 0
    done: trio.Event = attrs.Factory(trio.Event)
    scope: trio.CancelScope = attrs.Factory(trio.CancelScope)

    def kind(self, name: str) -> ToolKind:
        """Whose tool ``name`` is, in this turn."""
        if name in self.platform_tools:
            return "platform"
        return "app" if name in self.app_tools else "webhook"

    def judge_mood(self, text: str) -> tuple[str, float] | None:
        """The reply's mood, told to the owner when the text changed since the last judgement."""
        if not self.moods or not text.strip():
            return None
        mood = mood_of(text)
        if self.mood_text != text:
            self.mood_text = text
            self.owner.deliver(MoodJudged(turn=self.id, mood=mood[0], intensity=mood[1]))
        return mood

    def hearing(self, recording: Recording) -> Callable[[], Awaitable[tuple[str, float]]]:
        """How the turn hears its recording: while it does, a failure is the transcription's."""

        async def hear() -> tuple[str, float]:
            self.stage = "transcription"
            text, seconds = await recording.words()
            self.stage = "model"
            return text, seconds

        return hear
