"""The agent WebSocket as a service of the runner: tokens, conversations, sockets, REST."""

from __future__ import annotations

import hmac
from typing import TYPE_CHECKING

import trio

from journal import AgentStore, ConversationRow, Spent, TokenRow

from ... import ino_wire as w
from ...agent import AgentRuntime
from ...errors import (
    GenerationMismatch,
    JournalUnwritable,
    RunnerAtCapacity,
    RunnerDraining,
    StartFailed,
)
from ...platform import MintedKey, Platform, TokenProblem, token_problem, token_spent
from ...wire import StartCallRequest
from ._call import WebSocketTransport
from ._common import (
    _UNWIND_S,
    DEFAULT_TTL_SECONDS,
    MAX_CONNECTIONS_PER_END_USER,
    MAX_TTL_SECONDS,
    SCHEME,
    TOKEN_EXPIRED,
    AgentSocketSetup,
    CloseSocket,
    SocketIO,
    relation_body,
)
from ._connection import Connection

if TYPE_CHECKING:
    from ...calls import Runner


# -- The service -------------------------------------------------------------------------------


class AgentSocketService:
    """The agent WebSocket of one runner: its sockets, their limits and drain, and the REST
    routes' mapping onto the :class:`~runner.platform.Platform`.

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
        self.platform = Platform(
            store,
            setup.agent,
            credit_pool=setup.credit_pool,
            token_turns_per_minute=setup.token_turns_per_minute,
        )
        self.agent = setup.agent
        self.agent_id = self.platform.agent_id
        self.api_key = setup.api_key
        self.idle_seconds = setup.idle_seconds
        self.max_unsent_bytes = setup.max_unsent_bytes
        self.credit_pool = setup.credit_pool
        self.token_turns_per_minute = setup.token_turns_per_minute
        self.token_connections = setup.token_connections
        self.connections: set[Connection] = set()
        self._per_end_user: dict[str, int] = {}
        self._per_token: dict[str, int] = {}
        transport.platform = self.platform
        transport.draining = lambda: runner.draining

    # -- REST ------------------------------------------------------------------------------

    def is_api_key(self, given: str) -> bool:
        return self.api_key is not None and hmac.compare_digest(given.encode(), self.api_key.encode())

    async def mint_key(self, request: w.EphemeralKeyRequest) -> MintedKey:
        ttl = request.ttl_seconds if request.ttl_seconds is not None else DEFAULT_TTL_SECONDS
        if not 1 <= ttl <= MAX_TTL_SECONDS:
            raise w.FrameInvalid("body", "ttl_seconds", f"must be 1 to {MAX_TTL_SECONDS}")
        if request.credit_limit is not None and request.credit_limit < 0:
            raise w.FrameInvalid("body", "credit_limit", "must not be negative")
        return await self.platform.mint_key(
            end_user_id=request.end_user_id, ttl_seconds=ttl, credit_limit=request.credit_limit
        )

    async def valid_token(self, token: str) -> TokenRow:
        """The token a REST call carries, if it is good now.

        Raises:
            Unauthorized: Unknown, expired, revoked or spent.
        """
        return await self.platform.valid_token(token)

    async def revoke(self, token_id: str) -> bool:
        revoked = await self.platform.revoke(token_id)
        if revoked:
            for conn in list(self.connections):
                if conn.token_id == token_id:
                    conn.close_when_idle(4004, "this token was revoked")
        return revoked

    async def create_conversation(self, token: TokenRow) -> ConversationRow:
        return await self.platform.create_conversation(token)

    async def conversation_for(self, conversation_id: str, *, end_user_id: str | None) -> ConversationRow:
        """A live conversation the caller may see (any, for the API key: ``end_user_id=None``).

        Raises:
            NotFound: Unknown, deleted, or another person's.
        """
        return await self.platform.conversation_for(conversation_id, end_user_id=end_user_id)

    async def compact(self, conversation_id: str) -> w.Compacted | None:
        """Compact a conversation on request; ``None`` when there is nothing to fold in.

        Raises:
            TurnRunning: A turn of the conversation runs (compaction never happens inside one).
        """
        compacted = await self.platform.compact(conversation_id)
        if compacted is None:
            return None
        return w.Compacted(
            session_id=compacted.conversation_id,
            after_seq=compacted.after_position,
            trigger=compacted.trigger,
        )

    async def relations_for(self, end_user_id: str | None) -> list[w.RelationBody]:
        """The agent's relationships: one person's (a token's), or everyone's (the API key's)."""
        return [relation_body(r) for r in await self.platform.relations_for(end_user_id)]

    async def delete_conversation(self, conversation_id: str) -> bool:
        deleted = await self.platform.delete_conversation(conversation_id)
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
        row = await self.platform.find_token(auth.key)
        if row is None:
            raise CloseSocket(4002, "invalid token")
        problem = token_problem(row)
        if problem is not None:
            raise CloseSocket(*_TOKEN_CLOSES[problem])
        conversation = await self.platform.get_conversation(auth.session_id)
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
        if await self.platform.pool_spent():
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
        conn.token_expires_at_ms = row.expires_at
        conn.app_tools = tuple(auth.tools or ())
        return conversation

    def uncount(self, end_user_id: str, token_id: str) -> None:
        for counts, key in ((self._per_end_user, end_user_id), (self._per_token, token_id)):
            left = counts.get(key, 0) - 1
            if left > 0:
                counts[key] = left
            else:
                counts.pop(key, None)

    def after_charge(self, token_id: str, spent: Spent) -> None:
        """A turn was charged: close the token's sockets when it spent its limit (4004), and every
        socket when the runner's pool is spent (4005), each after its running turn.
        """
        if token_spent(spent):
            for conn in list(self.connections):
                if conn.token_id == token_id:
                    conn.close_when_idle(4004, "this token has spent its credit limit")
        if self.platform.pool_spent_by(spent):
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
            except JournalUnwritable:
                raise CloseSocket(4013, "the journal cannot write now") from None
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
            conn.call = session
            return
        raise CloseSocket(4013, "the conversation's call could not be joined; reconnect")

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Host the conversations' turns until the runner drained.

        Once the runner drains, idle sockets close with 4013 at once and busy ones after
        their turn; the calls end as their last socket closes.
        """
        async with trio.open_nursery() as nursery:
            await nursery.start(self.platform.serve)
            task_status.started()
            await self.runner.wait_draining()
            for conn in list(self.connections):
                conn.close_when_idle(4013, "runner draining")
            await self.runner.wait_drained()
            nursery.cancel_scope.cancel()


_TOKEN_CLOSES: dict[TokenProblem, tuple[int, str]] = {
    "revoked": (4004, "this token was revoked"),
    "expired": (4003, TOKEN_EXPIRED),
    "spent": (4004, "this token has spent its credit limit"),
}
