"""One socket: the ``ino.v2`` protocol driver (auth, verbs, recordings, seq, close codes)."""

from __future__ import annotations

from collections import deque
from typing import Any

import attrs
import trio

from journal import now_ms

from ... import ino_wire as w
from ...platform import Charged, ConversationEvent, TurnRateExceeded, TurnRequest
from ...voice.events import ReplyDelta
from ...wire import parse_json
from ._call import InoCall
from ._common import (
    _CLOSE_S,
    _UNWIND_S,
    AUTH_TIMEOUT_S,
    CONFLICT,
    NOT_WAITING,
    TOKEN_EXPIRED,
    CloseSocket,
    SocketHost,
    SocketIO,
    log,
)
from ._frames import encode_frame, frames_of
from ._recordings import Recordings

_FLUSH_S = 15.0
# An auth frame holds one object and its list of tools: a first frame with more brackets than
# this is not one, and is refused before it is parsed.
_AUTH_MAX_BRACKETS = 16
# Audio frames waiting in the outbox are joined into one binary frame up to this size.
_JOIN_AUDIO_BYTES = 64 << 10

# -- One socket ------------------------------------------------------------------------------


@attrs.frozen
class _Close:
    code: int
    reason: str


@attrs.define(eq=False)
class _Delta:
    """A ``text.delta`` not written yet: the same turn's next pieces join it (one seq)."""

    seq: int
    turn: str
    text: str
    size: int


# ``bytes``: a window's first audio, never joined into; ``bytearray``: audio that may grow.
_Item = str | bytes | bytearray | _Delta | _Close


class _Outbox:
    """What waits to be written to one socket, in order.

    While a write is in flight, frames that may be joined are joined: a ``text.delta``
    after a ``text.delta`` of the same turn, audio after audio of the same window (no JSON
    frame between them: the window's ``audio.end`` comes between two windows), except a
    window's first piece, which leaves alone so that playing starts as soon as before. The client
    reads the same text and the same samples, in the same order, in fewer frames.
    """

    def __init__(self) -> None:
        self._items: deque[_Item] = deque()
        self._ready = trio.Event()
        self._closed = False

    def last(self) -> _Item | None:
        return self._items[-1] if self._items else None

    def put(self, item: _Item) -> None:
        self._items.append(item)
        self._ready.set()

    def clear(self) -> None:
        self._items.clear()

    def close(self) -> None:
        """Nothing more comes: the writer ends once what is queued went out."""
        self._closed = True
        self._ready.set()

    async def take(self) -> list[_Item]:
        """All that is queued, once there is something; ``[]``: closed and empty."""
        while not self._items and not self._closed:
            self._ready = trio.Event()
            await self._ready.wait()
        items = list(self._items)
        self._items.clear()
        return items


class Connection:
    """The protocol driver of one socket: auth, verbs, recordings, frames in seq order."""

    def __init__(self, service: SocketHost, io: SocketIO, url_session_id: str | None) -> None:
        self.service = service
        self.io = io
        self.url_session_id = url_session_id
        self.seq = 0
        self.end_user_id = ""
        self.token_id = ""
        self.token_expires_at_ms = 0
        self.app_tools: tuple[str, ...] = ()
        self.call: InoCall | None = None
        self.recordings = Recordings(self)
        self.closing: _Close | None = None
        self.close_after_turn: _Close | None = None
        self.last_activity = trio.current_time()
        # Unbounded in frames, bounded in bytes: a client that falls max_unsent_bytes
        # behind is closed with 4006 ("slow down and reconnect") rather than held in memory.
        self._outbox = _Outbox()
        self._unsent = 0
        self._window_opened = False
        self._reading = trio.CancelScope()
        self._counted = False

    # -- Writing -----------------------------------------------------------------------------

    def send(self, frame: Any) -> None:
        """Queue a JSON frame with the next seq; frames leave in the order they were queued."""
        if self.closing is not None:
            return
        self.last_activity = trio.current_time()
        if isinstance(frame, ReplyDelta):
            last = self._outbox.last()
            if isinstance(last, _Delta) and last.turn == frame.turn:
                last.text += frame.text
                last.size += len(frame.text)
                self._count(len(frame.text))
                return
            self.seq += 1
            # Encoded when written: until then the turn's next pieces may join it.
            size = len(frame.text) + 64
            self._queue(_Delta(self.seq, frame.turn, frame.text, size), size)
            return
        self.seq += 1
        data = encode_frame(frame, self.seq)
        self._queue(data, len(data))
        self._window_opened = isinstance(frame, w.AudioStart)

    def deliver(self, event: ConversationEvent) -> None:
        """Say what the conversation reports, as frames on this socket."""
        frames = frames_of(
            event, session_id=self.url_session_id or "", idle_seconds=self.service.idle_seconds
        )
        for frame in frames:
            if isinstance(frame, bytes):
                self.send_binary(frame)
            else:
                self.send(frame)
        if isinstance(event, Charged):
            self.service.after_charge(event.token_id, event.spent)

    def turn_over(self) -> None:
        self.check_close_after_turn()

    def send_binary(self, pcm: bytes) -> None:
        if self.closing is not None or not pcm:
            return
        if self._window_opened:
            # A client plays a frame once it has all of it: the first stays small.
            self._window_opened = False
            self._queue(bytes(pcm), len(pcm))
            return
        last = self._outbox.last()
        if isinstance(last, bytearray) and len(last) + len(pcm) <= _JOIN_AUDIO_BYTES:
            last += pcm
            self._count(len(pcm))
            return
        self._queue(bytearray(pcm), len(pcm))

    def _queue(self, item: _Item, size: int) -> None:
        self._outbox.put(item)
        self._count(size)

    def _count(self, size: int) -> None:
        """Count ``size`` more bytes queued: past the limit, the client is closed with 4006."""
        self._unsent += size
        limit = self.service.max_unsent_bytes
        if self._unsent <= limit:
            return
        # Fallen too far behind: what it has not read is dropped, and the close goes next.
        self._outbox.clear()
        self._unsent = 0
        log.warning("an agent socket fell %d bytes behind in reading: closing it with 4006", limit)
        self.close_nowait(4006, f"the client fell {limit} bytes behind: read faster, then reconnect")

    def close_nowait(self, code: int, reason: str | None = None) -> None:
        """Close after what is queued: the writer sends the close frame last."""
        if self.closing is not None:
            return
        close = CloseSocket(code, reason)
        self.closing = _Close(close.code, close.reason)
        self._outbox.put(self.closing)
        self._reading.cancel()

    def close_when_idle(self, code: int, reason: str) -> None:
        """Close now if no turn of this socket runs, else once it ended (drain, revoke)."""
        if self.busy:
            self.close_after_turn = _Close(code, reason)
        else:
            self.close_nowait(code, reason)

    def check_close_after_turn(self) -> None:
        if self.close_after_turn is not None and not self.busy:
            self.close_nowait(self.close_after_turn.code, self.close_after_turn.reason)

    @property
    def busy(self) -> bool:
        call = self.call
        if call is None:
            return False
        return call.conversation.holds_turn_of(self) or self.recordings.transcribing > 0

    async def _write(self) -> None:
        while batch := await self._outbox.take():
            close: _Close | None = None
            try:
                # What was queued together leaves in one write to the kernel.
                async with self.io.corked():
                    for item in batch:
                        if isinstance(item, _Close):
                            close = item
                            break
                        await self._send_item(item)
                if close is not None:
                    with trio.move_on_after(_CLOSE_S):
                        await self.io.close(close.code, close.reason)
                    return
            except Exception as exc:  # noqa: BLE001 - any write failure: the peer is gone; the reader learns it too
                log.info("socket write failed: %r", exc)
                self._reading.cancel()
                return

    async def _send_item(self, item: str | bytes | bytearray | _Delta) -> None:
        if isinstance(item, _Delta):
            await self.io.send(encode_frame(ReplyDelta(turn=item.turn, text=item.text), item.seq))
            self._unsent -= item.size
        else:
            await self.io.send(bytes(item) if isinstance(item, bytearray) else item)
            self._unsent -= len(item)

    # -- The connection's life -------------------------------------------------------------

    async def serve(self) -> None:
        """Accept, authenticate, join the conversation and take frames until the socket ends.

        The writer lives in the outer nursery so that it outlasts the reader and the socket's
        own tasks (partial recognition, transcriptions, the idle watch): frames already
        queued, then the close frame, still go out.
        """
        offered = w.PROTOCOL in self.io.requested_subprotocols
        await self.io.accept(w.PROTOCOL if offered else None)
        async with trio.open_nursery() as writing:
            writing.start_soon(self._write)
            try:
                async with trio.open_nursery() as tasks:
                    try:
                        with self._reading:
                            if not offered:
                                raise CloseSocket(4009, f"the subprotocol must be {w.PROTOCOL}")
                            await self._run(tasks)
                    except CloseSocket as close:
                        self.close_nowait(close.code, close.reason)
                    except Exception:  # noqa: BLE001 - a socket's failure closes it with 4013, never the runner
                        log.exception("a socket failed")
                        self.close_nowait(4013)
                    finally:
                        tasks.cancel_scope.cancel()
                        with trio.CancelScope(shield=True), trio.move_on_after(_UNWIND_S + _CLOSE_S):
                            await self._leave()
            finally:
                if self.closing is None:
                    writing.cancel_scope.cancel()  # the peer left: nobody to say goodbye to
                else:
                    self._outbox.close()
                    # What is queued, then the close frame, may take a client that reads slowly
                    # this long to take (the listener's write deadline bounds each write too).
                    writing.cancel_scope.deadline = trio.current_time() + _FLUSH_S

    async def _run(self, tasks: trio.Nursery) -> None:
        auth = await self._receive_auth()
        conversation = await self.service.authenticate(self, auth)
        self._counted = True
        await self.service.attach(self, conversation)
        tasks.start_soon(self._watch_idle)
        tasks.start_soon(self._watch_expiry)
        while True:
            message = await self.io.receive()
            if isinstance(message, bytes):
                self.last_activity = trio.current_time()
                self.recordings.add(message)
                continue
            try:
                verb = w.decode_verb(message)
            except w.FrameRejected as exc:
                raise CloseSocket(4009, str(exc)) from None
            except w.FrameInvalid as exc:
                self.last_activity = trio.current_time()
                self.send(w.Error(code="validation_failed", message=str(exc), recording_id=exc.recording_id))
                continue
            if isinstance(verb, w.Ping):
                if self.closing is None:
                    self._queue(w.PONG, len(w.PONG))
                continue
            self.last_activity = trio.current_time()
            await self._on_verb(verb, tasks)

    async def _receive_auth(self) -> w.Auth:
        with trio.move_on_after(AUTH_TIMEOUT_S):
            message = await self.io.receive()
            if isinstance(message, bytes):
                raise CloseSocket(4001, "the first frame must be auth, not audio")
            # Read before any credential: bounded in size by the listener (64 KiB), in nesting
            # here, before it is parsed, and parsed once.
            if message.count("[") + message.count("{") > _AUTH_MAX_BRACKETS:
                raise CloseSocket(4001, "the first frame must be auth")
            try:
                value = parse_json(message)
            except ValueError:
                raise CloseSocket(4001, "the first frame must be auth") from None
            try:
                verb = w.verb_of(value)
            except w.FrameRejected as exc:
                if isinstance(value, dict) and value.get("type") == "auth":
                    raise CloseSocket(4009, str(exc)) from None
                raise CloseSocket(4001, "the first frame must be auth") from None
            except w.FrameInvalid as exc:
                raise CloseSocket(4009, str(exc)) from None
            if not isinstance(verb, w.Auth):
                raise CloseSocket(4001, f"the first frame must be auth, not {verb.TYPE}")
            return verb
        raise CloseSocket(4001, "no auth frame within 10 seconds")

    async def _leave(self) -> None:
        if self.recordings.open is not None:
            self.recordings.close()
        self.service.connections.discard(self)
        if self._counted:
            self._counted = False
            self.service.uncount(self.end_user_id, self.token_id)
        if self.call is not None:
            with trio.move_on_after(_UNWIND_S):
                await self.call.detach(self)

    async def _watch_expiry(self) -> None:
        """Once the token expires, close with 4003 (after a running turn), as a revoked one closes 4004."""
        left_ms = self.token_expires_at_ms - now_ms()
        while left_ms > 0:  # again if the wall clock was set back meanwhile
            await trio.sleep(left_ms / 1000)
            left_ms = self.token_expires_at_ms - now_ms()
        self.close_when_idle(4003, TOKEN_EXPIRED)

    async def _watch_idle(self) -> None:
        idle_s = self.service.idle_seconds
        while True:
            deadline = self.last_activity + idle_s
            if trio.current_time() >= deadline:
                if self.busy:
                    self.last_activity = trio.current_time()
                    continue
                self.close_nowait(
                    4007, f"closed after {idle_s} seconds with no activity; ping does not count"
                )
                return
            await trio.sleep_until(deadline)

    # -- Verbs ---------------------------------------------------------------------------------

    def request_turn(self, request: TurnRequest) -> bool:
        """Ask for a turn; ``False``: one runs already (the caller says so).

        Raises:
            CloseSocket: 4006, past the token's turns a minute.
        """
        assert self.call is not None
        try:
            return self.call.conversation.request_turn(self, request) != "conflict"
        except TurnRateExceeded as exc:
            raise CloseSocket(4006, str(exc)) from None

    async def _on_verb(self, verb: w.Verb, nursery: trio.Nursery) -> None:
        call = self.call
        assert call is not None
        conversation = call.conversation
        if isinstance(verb, w.Auth):
            raise CloseSocket(4009, "auth was already sent on this connection")
        if isinstance(verb, w.UserMessage):
            request = TurnRequest(text=verb.text, speech=verb.speech, thoughts=verb.thoughts is True)
            if not self.request_turn(request):
                self.send(w.Error(code="conflict", message=CONFLICT))
        elif isinstance(verb, w.UserAudioStart):
            await self.recordings.start(verb, nursery)
        elif isinstance(verb, w.UserAudioEnd):
            self.recordings.end(verb, nursery)
        elif isinstance(verb, w.Cancel):
            state = conversation.owned_turn(self)
            if state is not None:
                conversation.cancel_turn(state, "cancel")
            if self.recordings.open is not None:
                self.recordings.close()
            conversation.drop_held(self)
        elif isinstance(verb, w.Mute):
            state = conversation.owned_turn(self)
            if state is not None:
                conversation.mute_turn(state)
        elif isinstance(verb, w.ToolConfirmed):
            self._confirm(verb)
        elif isinstance(verb, w.ToolResult):
            conversation.app_result(verb.call_id, verb.result, verb.error)

    def _confirm(self, verb: w.ToolConfirmed) -> None:
        call = self.call
        assert call is not None
        if not call.conversation.check_confirmation(verb.call_id):
            self.send(w.Error(code="not_found", message=NOT_WAITING))
            return
        request = TurnRequest(
            text="Yes." if verb.yes else "No.",
            confirm_call_id=verb.call_id,
            yes=verb.yes,
            speech=verb.speech,
            thoughts=verb.thoughts is True,
        )
        if not self.request_turn(request):
            self.send(w.Error(code="conflict", message=CONFLICT))
