"""One conversation's call: the transport that hands it out, and the session its sockets share."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, Literal
from urllib.parse import urlsplit

import trio

from ...agent import AgentRuntime
from ...platform import Conversation, ConversationClosed, Platform
from ...sessions import CallTarget, Disconnected, RequestHandler, TransportError, TransportEvent
from ._common import SCHEME, CloseSocket, Socket

# -- The transport -------------------------------------------------------------------------


class WebSocketTransport:
    """Joins ``ino://<conversation id>`` calls: their caller is whoever holds a socket on it."""

    name = SCHEME

    def __init__(self) -> None:
        self.calls: dict[str, InoCall] = {}
        # Set by the service that serves the sockets (none: no socket can reach a call).
        self.platform: Platform | None = None
        self.draining: Callable[[], bool] = lambda: False

    def handles(self, url: str) -> bool:
        return urlsplit(url).scheme == SCHEME

    @asynccontextmanager
    async def open_session(self, target: CallTarget) -> AsyncIterator[InoCall]:
        if self.platform is None:
            raise TransportError("the agent WebSocket is not served on this runner")
        # No nursery or cancel scope may span this yield: the call enters it inside its own
        # start timeout. Turns run in the platform's nursery, each under its own cancel scope.
        with self.platform.open_conversation(target.session_id) as conversation:
            call = InoCall(conversation, self.draining)
            self.calls[target.session_id] = call
            try:
                yield call
            finally:
                with trio.CancelScope(shield=True):
                    await call.wind_down()
                if self.calls.get(target.session_id) is call:
                    del self.calls[target.session_id]


# -- One conversation's call ---------------------------------------------------------------


class InoCall:
    """The transport session of one conversation's call: the sockets in it."""

    kind = SCHEME
    # The client says where its caller's turns start and end (user_audio.start/end), and the
    # call does not open on its own: the first socket's ready comes first.
    delimits_turns = True

    def __init__(self, conversation: Conversation, draining: Callable[[], bool]) -> None:
        self.conversation = conversation
        self.conversation_id = conversation.conversation_id
        self._draining = draining
        self.sockets: list[Socket] = []
        self._events_send, self._events = trio.open_memory_channel[TransportEvent](math.inf)

    # -- TransportSession ----------------------------------------------------------------

    @property
    def events(self) -> trio.MemoryReceiveChannel[TransportEvent]:
        return self._events

    def set_request_handler(self, handler: RequestHandler) -> None:
        pass  # the socket has no client requests of the LiveKit kind

    def client_reachable(self) -> Literal["ok", "no_app", "phone"]:
        # ino.v2 has no frame for the agent's keyed messages to the app.
        return "no_app"

    async def send_to_client(self, key: str, payload: Any) -> None:
        await trio.lowlevel.checkpoint()

    async def publish_audio(self, pcm: bytes, sample_rate_hz: int) -> None:
        # To the socket whose turn speaks, as binary frames. No yield unless cancelled: a
        # sentence's pieces (synthesized together) queue together and leave as one frame,
        # while a cancel still stops the voice between two pieces.
        await trio.lowlevel.checkpoint_if_cancelled()
        self.conversation.play(pcm)

    async def clear_audio(self) -> None:
        # What was sent is the client's to stop (ino.v2's barge_in / interrupted tell it to).
        await trio.lowlevel.checkpoint()

    def ringing(self) -> trio.Event | None:
        return None

    async def send_dtmf(self, digits: str) -> None:
        raise TransportError("the call has no phone line: ino.v2 carries no telephone keys")

    # -- Sockets -------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self.conversation.closed

    async def attach(self, conn: Socket, runtime: AgentRuntime) -> None:
        """Add a socket: it is answered ``ready``, and a new conversation's opening turn starts.

        Raises:
            CloseSocket: The call is ending (4013).
        """
        try:
            await self.conversation.join(conn, runtime)
        except ConversationClosed as exc:
            raise CloseSocket(4013, str(exc)) from None
        self.sockets.append(conn)

    async def detach(self, conn: Socket) -> None:
        """Remove a socket; its turn is cancelled, and the last one to leave ends the call."""
        if conn in self.sockets:
            self.sockets.remove(conn)
        if await self.conversation.leave(conn):
            self._events_send.send_nowait(Disconnected(reason="the last socket closed"))

    async def wind_down(self) -> None:
        """The call is ending: close its sockets, and let a running turn unwind (bounded)."""
        reason = "runner draining" if self._draining() else "the call ended; reconnect"
        self.conversation.closed = True
        for conn in list(self.sockets):
            conn.close_nowait(4013, reason)
        await self.conversation.wind_down()

    def close_all(self, code: int, reason: str) -> None:
        for conn in list(self.sockets):
            conn.close_nowait(code, reason)
