"""What a conversation reports to the people in it: its turns' events, and its own.

A transport turns these into whatever its callers read (the agent WebSocket: ``ino.v2``
frames). Nothing here knows a socket or a frame.
"""

from __future__ import annotations

from typing import Literal

import attrs

from journal import KnowledgeHit, RelationRow, Spent

from ..voice.events import ToolKind, ToolRecord, TurnEvent, TurnResult

# Where a turn was when it failed.
Stage = Literal["transcription", "model", "speech"]


@attrs.frozen(kw_only=True)
class Joined:
    """The participant is in the conversation; ``greeting``: the opening turn starts next."""

    conversation_id: str
    agent_id: str
    end_user_id: str
    voice_rate_hz: int | None
    moods: bool
    relation: RelationRow | None
    greeting: bool


@attrs.frozen(kw_only=True)
class NoVoice:
    """Speech was asked for, but the agent has none: the reply is text only."""

    turn: str


@attrs.frozen(kw_only=True)
class Refused:
    """A turn the participant asked for was not taken, and why.

    ``busy``: another turn runs; ``not_waiting``: the confirmed tool call waits no more;
    ``ending``: the call is ending.
    """

    reason: Literal["busy", "not_waiting", "ending"]


@attrs.frozen(kw_only=True)
class KnowledgeSearched:
    turn: str
    via: Literal["first", "tool"]
    outcome: Literal["found", "none", "failed"]
    hits: tuple[KnowledgeHit, ...]


@attrs.frozen(kw_only=True)
class TurnFailed:
    """The turn failed on the runner's side; ``text`` is what the reply had said."""

    turn: str
    text: str


@attrs.frozen(kw_only=True)
class TurnClosed:
    """The turn's end: its result, its mood, and what it recorded about the person.

    Attributes:
        reason: For an interrupted turn, why (``cancel``, ``barge_in``, ``provider_failed``...).
        stage: Where an interrupted turn with an error was.
        tool_kinds: The kind of each tool call of the result, by call id.
    """

    turn: str
    conversation_id: str
    result: TurnResult
    mood: tuple[str, float] | None
    relation: RelationRow | None
    reason: str
    stage: Stage
    tool_kinds: dict[str, ToolKind]

    def reported_tools(self) -> list[tuple[ToolRecord, ToolKind]]:
        """The calls a person's side sees: every one but the platform's own."""
        return [
            (call, self.tool_kinds[call.call_id])
            for call in self.result.tool_calls
            if self.tool_kinds[call.call_id] != "platform"
        ]


@attrs.frozen(kw_only=True)
class Compacted:
    """The stored messages up to ``after_position`` were folded into the summary."""

    conversation_id: str
    after_position: int
    trigger: Literal["automatic", "manual"]


@attrs.frozen(kw_only=True)
class Charged:
    """A turn or a transcription of the participant was charged; ``spent`` is where the totals stand."""

    token_id: str
    spent: Spent


# A conversation tells its people what its turns report (the one vocabulary of turn events,
# passed on with what only the platform knows filled in: a tool's kind) and its own facts.
ConversationEvent = (
    TurnEvent | Joined | NoVoice | Refused | KnowledgeSearched | TurnFailed | TurnClosed | Compacted | Charged
)
