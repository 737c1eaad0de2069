"""What the agent WebSocket's parts share: limits, close reasons, small helpers and setup."""

from __future__ import annotations

import logging
from contextlib import AbstractAsyncContextManager
from importlib import metadata
from typing import TYPE_CHECKING, Any, Protocol

import attrs

from journal import ConversationRow, RelationRow, Spent

from ... import ino_wire as w
from ...platform import HEARING_RATE_HZ as HEARING_RATE_HZ
from ...platform import Participant, Platform

if TYPE_CHECKING:
    from ...agent import Agent

log = logging.getLogger("runner.websocket")

SCHEME = "ino"
AUTH_TIMEOUT_S = 10.0
DEFAULT_IDLE_SECONDS = 300
MAX_TRANSCRIBING = 3
# Frames queued for a client that has not read them yet; past it the socket closes with 4006
# (the default of AgentSocketSetup.max_unsent_bytes, --agent-max-unsent-bytes).
MAX_UNSENT_BYTES = 8 << 20
MAX_CONNECTIONS_PER_END_USER = 3
DEFAULT_TTL_SECONDS = 600
MAX_TTL_SECONDS = 86_400
# Bounds on cleanup: a socket that leaves lets its turn unwind for this long.
TOKEN_EXPIRED = "this token has expired: mint another and reconnect"
_UNWIND_S = 10.0
_CLOSE_S = 5.0

CLOSE_REASONS = {
    4001: "No credentials were sent. Send auth as the first frame, within 10 seconds.",
    4002: "Invalid, revoked or expired credentials, or an API key instead of a token.",
    4003: "This token has expired. Mint another and reconnect.",
    4004: "This token was revoked, or has spent its credit limit.",
    4005: "Your organisation has no credits left.",
    4006: "Too many turns, or too many connections on one token. Slow down and reconnect.",
    4007: "Closed after a period with no activity. ping does not count as activity.",
    4008: "That conversation is not available: unknown, deleted, or its agent or person was deleted.",
    4009: "The frame could not be understood, or the session in the URL and the auth frame differ.",
    4010: "This capability is not available.",
    4011: "Unaccountable audio: too much for one turn, or no user_audio.start before it.",
    4013: "The connection failed on our side. Reconnect.",
    4014: "This end user already has 3 open connections.",
}


CONFLICT = "A turn is already running on this connection. Wait for turn.done, or send cancel."
NOT_WAITING = (
    "That tool call is no longer waiting: it was answered already, expired, or dropped by a later turn."
)
# A refused turn's error frame, by the platform's reason.
REFUSALS: dict[str, tuple[w.ErrorCode, str]] = {
    "busy": ("conflict", CONFLICT),
    "not_waiting": ("not_found", NOT_WAITING),
    "ending": ("unavailable", "the call is ending and takes no more turns"),
}


def edge_version() -> str:
    try:
        return metadata.version("curb-runner")
    except metadata.PackageNotFoundError:
        return "0.0.0"


def wire_call_id(kind: w.ToolKind, call_id: str) -> str | None:
    """The platform's own calls carry no call_id on the wire."""
    return None if kind == "platform" else call_id


def relation_body(row: RelationRow) -> w.RelationBody:
    return w.RelationBody(
        agent_id=row.agent_id,
        end_user_id=row.end_user_id,
        conversations=row.conversations,
        first_at=w.rfc3339(row.first_at),
        last_at=w.rfc3339(row.last_at),
        notes=[w.RelationNoteBody(note=n.note, recorded_at=w.rfc3339(n.recorded_at)) for n in row.notes],
    )


class CloseSocket(Exception):
    """End the socket with ``code``; ``reason`` is the specific cause, else the code's own text."""

    def __init__(self, code: int, reason: str | None = None) -> None:
        self.code = code
        self.reason = (reason or CLOSE_REASONS.get(code, ""))[:120]
        super().__init__(f"{code} {self.reason}")


class SocketIO(Protocol):
    """What the driver needs from the server's WebSocket (Quart's, behind ``runner.api``)."""

    @property
    def requested_subprotocols(self) -> list[str]: ...

    async def accept(self, subprotocol: str | None) -> None: ...

    async def receive(self) -> str | bytes: ...

    async def send(self, data: str | bytes) -> None: ...

    def corked(self) -> AbstractAsyncContextManager[None]:
        """Sends inside the block may reach the network together, as one write, when it ends."""
        ...

    async def close(self, code: int, reason: str) -> None: ...


class Socket(Participant, Protocol):
    """What a conversation's call needs from one of its sockets (a :class:`~._connection.Connection`)."""

    def close_nowait(self, code: int, reason: str | None = None) -> None: ...


class SocketHost(Protocol):
    """What a socket needs from the service that serves it (:class:`~._service.AgentSocketService`).

    Sockets are passed as ``Any``: the service takes the socket it made, a type this module
    is below.
    """

    idle_seconds: int
    max_unsent_bytes: int
    platform: Platform
    connections: set[Any]

    async def authenticate(self, conn: Any, auth: w.Auth) -> ConversationRow: ...

    async def attach(self, conn: Any, conversation: ConversationRow) -> None: ...

    def uncount(self, end_user_id: str, token_id: str) -> None: ...

    def after_charge(self, token_id: str, spent: Spent) -> None: ...


@attrs.frozen(kw_only=True)
class AgentSocketSetup:
    """What a runner needs to serve the agent WebSocket on its public listener.

    Attributes:
        agent: The agent every conversation talks to.
        api_key: The key that mints ephemeral tokens (``CURB_API_KEY``); ``None``: none can be minted.
        idle_seconds: A socket with no activity for this long is closed with 4007.
        credit_pool: The runner's own credits (``CURB_CREDIT_POOL``); once every token's
            turns spent them, sockets close with 4005. ``None``: no pool.
        token_turns_per_minute: Turns one token may take a minute (4006 past it); ``None``: no limit.
        token_connections: Open sockets one token may hold (4006 past it); ``None``: no limit.
        max_unsent_bytes: Frames queued for a client that has not read them; past it the
            socket closes with 4006 ("slow down and reconnect").
    """

    agent: Agent
    api_key: str | None
    idle_seconds: int = DEFAULT_IDLE_SECONDS
    credit_pool: float | None = None
    token_turns_per_minute: int | None = None
    token_connections: int | None = None
    max_unsent_bytes: int = MAX_UNSENT_BYTES
