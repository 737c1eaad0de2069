"""The REST bodies of the public listener (keys, sessions, transcripts, relations, compaction)."""

from __future__ import annotations

from typing import Literal

import attrs

from ._frames import RelationBody
from ._limits import check_length

# -- REST bodies of the public listener ------------------------------------------------------


@attrs.frozen(kw_only=True)
class EphemeralKeyRequest:
    end_user_id: str | None = attrs.field(default=None, validator=check_length(1, 128))
    ttl_seconds: int | None = None
    credit_limit: float | None = None


@attrs.frozen(kw_only=True)
class EphemeralKey:
    token: str
    end_user_id: str
    scope: Literal["agent"] = "agent"
    expires_at: str


@attrs.frozen(kw_only=True)
class AgentSessionRequest:
    """``POST /v1/agent/sessions`` takes no fields today; an empty object or no body."""


@attrs.frozen(kw_only=True)
class AgentSession:
    session_id: str
    agent_id: str
    end_user_id: str
    created_at: str


@attrs.frozen(kw_only=True)
class TranscriptMessage:
    position: int
    role: str
    text: str
    turn: str | None
    created_at: str


@attrs.frozen(kw_only=True)
class AgentSessionMessages:
    session_id: str
    messages: list[TranscriptMessage]


@attrs.frozen(kw_only=True)
class Revoked:
    token_id: str
    revoked: bool


@attrs.frozen(kw_only=True)
class Relations:
    relations: list[RelationBody]


@attrs.frozen(kw_only=True)
class CompactionDone:
    """``POST /v1/agent/sessions/{id}/compact``: ``after_seq`` is ``None`` when nothing was folded in."""

    session_id: str
    compacted: bool
    after_seq: int | None


@attrs.frozen(kw_only=True)
class Deleted:
    session_id: str
    deleted: bool
