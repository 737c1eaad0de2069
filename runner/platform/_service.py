"""The agent platform of one runner: keys, conversations, their turns, and what they cost."""

from __future__ import annotations

import collections
import hashlib
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Literal

import attrs
import trio

from journal import AgentStore, ConversationRow, RelationRow, Spent, StoredMessage, TokenRow, now_ms

from ..errors import NotFound, RunnerError, Unauthorized
from ._conversation import Conversation
from ._events import Compacted
from ._history import chat_message
from ._rules import agent_id_of, new_session_id, summarise, transcription_row

if TYPE_CHECKING:
    from ..agent import Agent


class TurnRunning(RunnerError):
    """A conversation cannot be compacted while a turn of it runs."""

    status = 409
    code = "conflict"


class TurnRateExceeded(Exception):
    """A token asked for more turns in a minute than it may take."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"this token may take {limit} turns a minute")
        self.limit = limit


# Why a token cannot be used now.
TokenProblem = Literal["revoked", "expired", "spent"]


@attrs.frozen(kw_only=True)
class MintedKey:
    token: str
    row: TokenRow


class Platform:
    """Conversations with one agent, kept in ``store``; their turns run in :meth:`serve`'s nursery.

    Args:
        store: Tokens, conversations, messages, knowledge, relations and usage.
        agent: The agent every conversation talks to.
        credit_pool: The runner's own credits; ``None``: no pool.
        token_turns_per_minute: Turns one token may take a minute; ``None``: no limit.
    """

    def __init__(
        self,
        store: AgentStore,
        agent: Agent,
        *,
        credit_pool: float | None = None,
        token_turns_per_minute: int | None = None,
    ) -> None:
        self.store = store
        self.agent = agent
        self.agent_id = agent_id_of(agent)
        self.credit_pool = credit_pool
        self.token_turns_per_minute = token_turns_per_minute
        self.live: dict[str, Conversation] = {}
        self._turns_at: dict[str, collections.deque[float]] = {}
        self._nursery: trio.Nursery | None = None

    # -- Keys --------------------------------------------------------------------------------

    async def mint_key(
        self, *, end_user_id: str | None, ttl_seconds: int, credit_limit: float | None
    ) -> MintedKey:
        """An ephemeral token for ``end_user_id`` (a new one if ``None``), good for ``ttl_seconds``."""
        token_id = secrets.token_hex(8)
        token = f"ek_{token_id}_{secrets.token_urlsafe(32)}"
        row = await self.store.insert_token(
            token_id=token_id,
            token_sha256=_digest(token),
            end_user_id=end_user_id or "eu_" + secrets.token_urlsafe(12).replace("-", "x").replace("_", "y"),
            expires_at=now_ms() + ttl_seconds * 1000,
            credit_limit=credit_limit,
        )
        return MintedKey(token=token, row=row)

    async def find_token(self, token: str) -> TokenRow | None:
        if not token.startswith("ek_"):
            return None
        token_id, _, secret = token[3:].partition("_")
        if not token_id or not secret:
            return None
        return await self.store.find_token(token_id, _digest(token))

    async def valid_token(self, token: str) -> TokenRow:
        """The token a request carries, if it is good now.

        Raises:
            Unauthorized: Unknown, expired, revoked or spent.
        """
        row = await self.find_token(token)
        if row is None or token_problem(row) is not None:
            raise Unauthorized()
        return row

    async def revoke(self, token_id: str) -> bool:
        return await self.store.revoke_token(token_id)

    # -- Conversations -------------------------------------------------------------------------

    async def create_conversation(self, token: TokenRow) -> ConversationRow:
        return await self.store.create_conversation(
            conversation_id=new_session_id(), agent_id=self.agent_id, end_user_id=token.end_user_id
        )

    async def conversation_for(self, conversation_id: str, *, end_user_id: str | None) -> ConversationRow:
        """A live conversation the caller may see (any, for the API key: ``end_user_id=None``).

        Raises:
            NotFound: Unknown, deleted, or another person's.
        """
        row = await self.store.get_conversation(conversation_id)
        if (
            row is None
            or row.deleted_at is not None
            or (end_user_id is not None and row.end_user_id != end_user_id)
        ):
            raise NotFound(f"no conversation {conversation_id!r}")
        return row

    async def get_conversation(self, conversation_id: str) -> ConversationRow | None:
        """The stored conversation, deleted or not; ``None`` if there never was one."""
        return await self.store.get_conversation(conversation_id)

    async def transcript(self, conversation_id: str) -> list[StoredMessage]:
        """What the person and the agent said, in order (summaries leave it whole)."""
        stored = await self.store.load_messages(conversation_id)
        return [m for m in stored if m.role in ("user", "assistant") and m.content]

    async def delete_conversation(self, conversation_id: str) -> bool:
        return await self.store.delete_conversation(conversation_id)

    @contextmanager
    def open_conversation(self, conversation_id: str) -> Iterator[Conversation]:
        """The conversation while its call runs (compaction on request reaches it here)."""
        conversation = Conversation(conversation_id, self)
        self.live[conversation_id] = conversation
        try:
            yield conversation
        finally:
            if self.live.get(conversation_id) is conversation:
                del self.live[conversation_id]

    async def compact(self, conversation_id: str) -> Compacted | None:
        """Compact a conversation on request: what a conversation does itself after a long reply.

        Returns ``None`` when there is nothing before the person's last message to fold in.

        Raises:
            TurnRunning: A turn of the conversation runs (compaction never happens inside one).
        """
        live = self.live.get(conversation_id)
        if live is not None and live.runtime is not None and not live.closed:
            if live.turn is not None or live.runtime.busy:
                raise TurnRunning("a turn of this conversation is running; compact it after turn.done")
            compacted = await live.history.compact("manual")
            if compacted is not None:
                live.announce_compacted(compacted)
            return compacted
        stored = await self.store.load_messages(conversation_id)
        latest = await self.store.latest_summary(conversation_id)
        after = latest.after_position if latest is not None else 0
        rest = [m for m in stored if m.position > after]
        cut = max((i for i, m in enumerate(rest) if m.role == "user"), default=0)
        if cut <= 0:
            return None
        summary = summarise(
            latest.summary if latest is not None else None, [chat_message(m) for m in rest[:cut]]
        )
        position = rest[cut - 1].position
        await self.store.add_summary(
            conversation_id, after_position=position, summary=summary, trigger="manual"
        )
        return Compacted(conversation_id=conversation_id, after_position=position, trigger="manual")

    async def relations_for(self, end_user_id: str | None) -> list[RelationRow]:
        """The agent's relationships: one person's, or everyone's (``None``). Empty when it keeps none."""
        if not self.agent.relations:
            return []
        if end_user_id is None:
            return await self.store.relations(self.agent_id)
        row = await self.store.relation(self.agent_id, end_user_id)
        return [row] if row is not None else []

    # -- Credits and limits ------------------------------------------------------------------

    async def pool_spent(self) -> bool:
        """Whether the runner's credit pool is spent."""
        return self.credit_pool is not None and await self.store.runner_spent() >= self.credit_pool

    def pool_spent_by(self, spent: Spent) -> bool:
        return self.credit_pool is not None and spent.runner_spent >= self.credit_pool

    def check_turn_rate(self, token_id: str) -> None:
        """Count a turn the token asks for.

        Raises:
            TurnRateExceeded: Past the token's turns a minute.
        """
        limit = self.token_turns_per_minute
        if limit is None:
            return
        now = trio.current_time()
        recent = self._turns_at.setdefault(token_id, collections.deque())
        while recent and recent[0] <= now - 60:
            recent.popleft()
        if len(recent) >= limit:
            raise TurnRateExceeded(limit)
        recent.append(now)

    async def charge_transcription(
        self, *, conversation_id: str, request_id: str, token_id: str, end_user_id: str, seconds: float
    ) -> Spent:
        """Charge a transcription outside any turn (a recording sent only to be transcribed)."""
        return await self.store.charge(
            conversation_id=conversation_id,
            turn_id=request_id,
            token_id=token_id,
            end_user_id=end_user_id,
            rows=[transcription_row(seconds)],
        )

    # -- Turns -------------------------------------------------------------------------------

    def start_turn_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run a conversation's turn in the platform's nursery (a call cannot hold one)."""
        assert self._nursery is not None, "Platform.serve is not running"
        self._nursery.start_soon(fn, *args)

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Host the conversations' turns until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()


def token_spent(spent: Spent) -> bool:
    """Whether a token has spent its credit limit."""
    return spent.token_limit is not None and spent.token_spent >= spent.token_limit


def token_problem(row: TokenRow) -> TokenProblem | None:
    if row.revoked_at is not None:
        return "revoked"
    if row.expires_at <= now_ms():
        return "expired"
    if row.credit_limit is not None and row.credit_spent >= row.credit_limit:
        return "spent"
    return None


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()
