"""The agent WebSocket as a service of the runner: tokens, conversations, sockets, REST."""

from __future__ import annotations

import collections
import hashlib
import hmac
import secrets
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs
import trio

from journal import AgentStore, ConversationRow, Spent, TokenRow, now_ms

from ... import ino_wire as w
from ...agent._runtime import AgentRuntime
from ...errors import (
    GenerationMismatch,
    NotFound,
    RunnerAtCapacity,
    RunnerDraining,
    StartFailed,
    Unauthorized,
)
from ...wire import StartCallRequest
from ._call import WebSocketTransport, _chat_message
from ._common import (
    _UNWIND_S,
    DEFAULT_TTL_SECONDS,
    MAX_CONNECTIONS_PER_END_USER,
    MAX_TTL_SECONDS,
    SCHEME,
    AgentSocketSetup,
    CloseSocket,
    SocketIO,
    TurnRunning,
    agent_id_of,
    new_session_id,
    relation_body,
    summarise,
)
from ._connection import Connection

if TYPE_CHECKING:
    from ...calls import Runner


# -- The service -------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class MintedKey:
    token: str
    row: TokenRow


class AgentSocketService:
    """The agent WebSocket of one runner: keys, conversations, sockets, and their drain.

    Args:
        runner: Whose calls the conversations are.
        transport: The transport registered with ``runner`` for ``ino://`` calls.
        store: Tokens, conversations and messages.
        setup: The agent, the API key and the idle limit.
    """

    def __init__(
        self, runner: Runner, transport: WebSocketTransport, store: AgentStore, setup: AgentSocketSetup
    ) -> None:
        self.runner = runner
        self.transport = transport
        self.store = store
        self.agent = setup.agent
        self.agent_id = agent_id_of(setup.agent)
        self.api_key = setup.api_key
        self.idle_seconds = setup.idle_seconds
        self.credit_pool = setup.credit_pool
        self.token_turns_per_minute = setup.token_turns_per_minute
        self.token_connections = setup.token_connections
        self.connections: set[Connection] = set()
        self._per_end_user: dict[str, int] = {}
        self._per_token: dict[str, int] = {}
        self._turns_at: dict[str, collections.deque[float]] = {}
        self._nursery: trio.Nursery | None = None
        transport.service = self

    # -- REST ------------------------------------------------------------------------------

    def is_api_key(self, given: str) -> bool:
        return self.api_key is not None and hmac.compare_digest(given.encode(), self.api_key.encode())

    async def mint_key(self, request: w.EphemeralKeyRequest) -> MintedKey:
        ttl = request.ttl_seconds if request.ttl_seconds is not None else DEFAULT_TTL_SECONDS
        if not 1 <= ttl <= MAX_TTL_SECONDS:
            raise w.FrameInvalid("body", "ttl_seconds", f"must be 1 to {MAX_TTL_SECONDS}")
        if request.credit_limit is not None and request.credit_limit < 0:
            raise w.FrameInvalid("body", "credit_limit", "must not be negative")
        token_id = secrets.token_hex(8)
        token = f"ek_{token_id}_{secrets.token_urlsafe(32)}"
        row = await self.store.insert_token(
            token_id=token_id,
            token_sha256=_digest(token),
            end_user_id=request.end_user_id
            or "eu_" + secrets.token_urlsafe(12).replace("-", "x").replace("_", "y"),
            expires_at=now_ms() + ttl * 1000,
            credit_limit=request.credit_limit,
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
        """The token a REST call carries, if it is good now.

        Raises:
            Unauthorized: Unknown, expired, revoked or spent.
        """
        row = await self.find_token(token)
        if row is None or _token_problem(row) is not None:
            raise Unauthorized()
        return row

    async def revoke(self, token_id: str) -> bool:
        revoked = await self.store.revoke_token(token_id)
        if revoked:
            for conn in list(self.connections):
                if conn.token_id == token_id:
                    conn.close_when_idle(4004, "this token was revoked")
        return revoked

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

    async def compact(self, conversation_id: str) -> w.Compacted | None:
        """Compact a conversation on request: what :meth:`InoCall.compact` does after a reply.

        Returns ``None`` when there is nothing before the person's last message to fold in.

        Raises:
            TurnRunning: A turn of the conversation runs (compaction never happens inside one).
        """
        call = self.transport.calls.get(conversation_id)
        if call is not None and call.runtime is not None and not call.closed:
            if call.turn is not None or call.runtime.busy:
                raise TurnRunning("a turn of this conversation is running; compact it after turn.done")
            compacted = await call.compact("manual")
            if compacted is not None:
                if call.turn is not None:
                    call.pending_compacted = compacted  # a turn began meanwhile: announce it after
                else:
                    for conn in list(call.sockets):
                        conn.send(compacted)
            return compacted
        stored = await self.store.load_messages(conversation_id)
        latest = await self.store.latest_summary(conversation_id)
        after = latest.after_position if latest is not None else 0
        rest = [m for m in stored if m.position > after]
        cut = max((i for i, m in enumerate(rest) if m.role == "user"), default=0)
        if cut <= 0:
            return None
        summary = summarise(
            latest.summary if latest is not None else None, [_chat_message(m) for m in rest[:cut]]
        )
        position = rest[cut - 1].position
        await self.store.add_summary(
            conversation_id, after_position=position, summary=summary, trigger="manual"
        )
        return w.Compacted(session_id=conversation_id, after_seq=position, trigger="manual")

    async def relations_for(self, end_user_id: str | None) -> list[w.RelationBody]:
        """The agent's relationships: one person's (a token's), or everyone's (the API key's).
        Empty when the agent keeps none.
        """
        if not self.agent.relations:
            return []
        if end_user_id is None:
            rows = await self.store.relations(self.agent_id)
        else:
            row = await self.store.relation(self.agent_id, end_user_id)
            rows = [row] if row is not None else []
        return [relation_body(r) for r in rows]

    async def delete_conversation(self, conversation_id: str) -> bool:
        deleted = await self.store.delete_conversation(conversation_id)
        call = self.transport.calls.get(conversation_id)
        if call is not None:
            call.close_all(4008, "the conversation was deleted")
        return deleted

    # -- Sockets -----------------------------------------------------------------------------

    async def serve_socket(self, io: SocketIO, url_session_id: str | None) -> None:
        conn = Connection(self, io, url_session_id)
        self.connections.add(conn)
        try:
            await conn.serve()
        finally:
            self.connections.discard(conn)

    async def authenticate(self, conn: Connection, auth: w.Auth) -> ConversationRow:
        """Check an auth frame in the order the close codes are documented; count the socket.

        Raises:
            CloseSocket: 4009, 4002, 4003, 4004, 4008, 4013 or 4014.
        """
        if not conn.url_session_id:
            raise CloseSocket(4009, "the URL names no session_id")
        if auth.session_id != conn.url_session_id:
            raise CloseSocket(4009, "the session_id of the URL and of the auth frame differ")
        if self.is_api_key(auth.key):
            raise CloseSocket(4002, "an API key is not accepted on this socket: mint an ephemeral token")
        row = await self.find_token(auth.key)
        if row is None:
            raise CloseSocket(4002, "invalid token")
        problem = _token_problem(row)
        if problem is not None:
            raise CloseSocket(*problem)
        conversation = await self.store.get_conversation(auth.session_id)
        if conversation is None:
            raise CloseSocket(4008, "unknown conversation")
        if conversation.deleted_at is not None:
            raise CloseSocket(4008, "the conversation was deleted")
        if conversation.agent_id != self.agent_id:
            raise CloseSocket(4008, "the conversation's agent is not served here")
        if conversation.end_user_id != row.end_user_id:
            raise CloseSocket(4008, "the conversation belongs to another person")
        if self.runner.draining:
            raise CloseSocket(4013, "runner draining")
        if self.credit_pool is not None and await self.store.runner_spent() >= self.credit_pool:
            raise CloseSocket(4005, "the runner's credit pool is spent")
        count = self._per_end_user.get(row.end_user_id, 0)
        if count >= MAX_CONNECTIONS_PER_END_USER:
            raise CloseSocket(
                4014, f"this end user already has {MAX_CONNECTIONS_PER_END_USER} open connections"
            )
        held = self._per_token.get(row.token_id, 0)
        if self.token_connections is not None and held >= self.token_connections:
            raise CloseSocket(4006, f"this token already holds {self.token_connections} connections")
        self._per_end_user[row.end_user_id] = count + 1
        self._per_token[row.token_id] = held + 1
        conn.end_user_id = row.end_user_id
        conn.token_id = row.token_id
        conn.app_tools = tuple(auth.tools or ())
        return conversation

    def uncount(self, end_user_id: str, token_id: str) -> None:
        for counts, key in ((self._per_end_user, end_user_id), (self._per_token, token_id)):
            left = counts.get(key, 0) - 1
            if left > 0:
                counts[key] = left
            else:
                counts.pop(key, None)

    def check_turn_rate(self, token_id: str) -> None:
        """Count a turn the token asks for.

        Raises:
            CloseSocket: 4006, past the token's turns a minute.
        """
        limit = self.token_turns_per_minute
        if limit is None:
            return
        now = trio.current_time()
        recent = self._turns_at.setdefault(token_id, collections.deque())
        while recent and recent[0] <= now - 60:
            recent.popleft()
        if len(recent) >= limit:
            raise CloseSocket(4006, f"this token may take {limit} turns a minute")
        recent.append(now)

    def after_charge(self, token_id: str, spent: Spent) -> None:
        """A turn was charged: close the token's sockets when it spent its limit (4004), and every
        socket when the runner's pool is spent (4005), each after its running turn.
        """
        if spent.token_limit is not None and spent.token_spent >= spent.token_limit:
            for conn in list(self.connections):
                if conn.token_id == token_id:
                    conn.close_when_idle(4004, "this token has spent its credit limit")
        if self.credit_pool is not None and spent.runner_spent >= self.credit_pool:
            for conn in list(self.connections):
                conn.close_when_idle(4005, "the runner's credit pool is spent")

    async def attach(self, conn: Connection, conversation: ConversationRow) -> None:
        """Join the conversation's call, starting it if no socket holds it.

        Raises:
            CloseSocket: 4013 when the runner is full, draining, or the call cannot start.
        """
        conversation_id = conversation.conversation_id
        for _ in range(3):
            existing = self.runner.calls.get(conversation_id)
            if existing is not None and existing.state in ("ending", "ended"):
                with trio.move_on_after(_UNWIND_S):
                    await existing.wait_ended()
                continue
            start = StartCallRequest(
                session_id=conversation_id, realtime_url=f"{SCHEME}://{conversation_id}", realtime_token="-"
            )
            try:
                call, _ = await self.runner.start_call(start)
            except RunnerDraining:
                raise CloseSocket(4013, "runner draining") from None
            except RunnerAtCapacity:
                raise CloseSocket(
                    4013, f"runner full: it holds {self.runner.config.max_sessions} calls"
                ) from None
            except (StartFailed, GenerationMismatch) as exc:
                raise CloseSocket(4013, f"the call did not start: {exc.detail}") from None
            session = self.transport.calls.get(conversation_id)
            if session is None or session.closed:
                with trio.move_on_after(_UNWIND_S):
                    await call.wait_ended()
                continue
            runtime = call.conversation
            if not isinstance(runtime, AgentRuntime):
                raise CloseSocket(4013, "this runner has no agent to talk to")
            await session.attach(conn, runtime)
            return
        raise CloseSocket(4013, "the conversation's call could not be joined; reconnect")

    def start_turn_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run a conversation's turn in the service's nursery (a call cannot hold one)."""
        assert self._nursery is not None, "AgentSocketService.serve is not running"
        self._nursery.start_soon(fn, *args)

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Host the conversations' turns until the runner drained.

        Once the runner drains, idle sockets close with 4013 at once and busy ones after
        their turn; the calls end as their last socket closes.
        """
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await self.runner.wait_draining()
            for conn in list(self.connections):
                conn.close_when_idle(4013, "runner draining")
            await self.runner.wait_drained()
            nursery.cancel_scope.cancel()


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _token_problem(row: TokenRow) -> tuple[int, str] | None:
    if row.revoked_at is not None:
        return 4004, "this token was revoked"
    if row.expires_at <= now_ms():
        return 4003, "this token has expired: mint another and reconnect"
    if row.credit_limit is not None and row.credit_spent >= row.credit_limit:
        return 4004, "this token has spent its credit limit"
    return None
