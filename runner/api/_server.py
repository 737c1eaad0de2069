"""The HTTP server of both listeners: Hypercorn's Trio worker, with an unattended runner's limits.

Hypercorn serves the protocol; this module adds what it leaves open (docs/operations.md):

- the socket is bound by :func:`listen`, before the journal is opened, so a taken port is
  refused before anything changes;
- at most ``max_connections`` connections at once: past the cap, new ones wait in the
  kernel's backlog rather than taking a descriptor each;
- a write to a client that reads nothing fails after ``send_s`` (Hypercorn shields its
  writes from cancellation, so a stuck reader would otherwise hold its connection, and
  the process at shutdown, for ever);
- a request's whole body must arrive within ``body_s``, else ``400 invalid_request``;
- a connection is always closed when Hypercorn means to close it (it closes from inside
  the app's task, which Quart may be cancelling: the close must not be cancellable);
- once the listener closes, open connections get ``shutdown_s`` to finish;
- a WebSocket frame that cannot be parsed (invalid UTF-8 in a text message, a reserved
  opcode or bit, an unmasked client frame) fails the connection with a close frame, 1007
  or 1002 (RFC 6455 7.1.7), where Hypercorn dropped TCP without one.

An idle keep-alive connection, and one whose request head never completes, is closed
after ``keep_alive_s`` by Hypercorn itself.

Hypercorn writes each WebSocket frame with its own ``send_all``, so each is its own system
call (and, on loopback, its own trip through the receiving side's stack). Inside
:func:`corked`, a task's writes to its connection are held and go to the kernel as one
write when the block ends; writes of other tasks to that connection meanwhile join them,
so the bytes keep their order.
"""

from __future__ import annotations

import contextlib
import json
import math
import socket
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from contextvars import ContextVar
from functools import partial
from typing import Any

import attrs
import h11
import hypercorn.protocol
import hypercorn.protocol.h2
import hypercorn.protocol.h11
import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.config import Sockets
from hypercorn.events import Closed
from hypercorn.protocol.events import Body, Data, EndBody, Response, StreamClosed
from hypercorn.protocol.http_stream import ASGIHTTPState, HTTPStream
from hypercorn.protocol.ws_stream import WSStream
from hypercorn.trio.lifespan import Lifespan
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ConnectionState
from hypercorn.utils import repr_socket_addr, wrap_app
from wsproto.connection import ConnectionState as WebSocketState
from wsproto.events import BytesMessage, CloseConnection, Message, Ping
from wsproto.frame_protocol import CloseReason

from ..ino_wire import AGENT_STREAM_PATH, RECORDING_TOO_LONG
from ..wire import ErrorBody, ErrorCode, json_bytes


@attrs.frozen(kw_only=True)
class HttpLimits:
    """The limits of one listener (flags: ``--http-*``)."""

    keep_alive_s: float = 5.0
    body_s: float = 30.0
    send_s: float = 30.0
    max_connections: int = 1024
    shutdown_s: float = 5.0


@attrs.frozen
class Listening:
    """A bound, listening socket and the Hypercorn configuration that will serve it."""

    config: HypercornConfig
    sockets: Sockets
    limits: HttpLimits

    def close(self) -> None:
        for sock in self.sockets.insecure_sockets:
            sock.close()


def listen(address: str, limits: HttpLimits, *, errorlog: Any, graceful_s: float) -> Listening:
    """Bind and listen on ``address`` now.

    Raises:
        OSError: The address is taken or cannot be bound.
    """
    config = HypercornConfig()
    config.bind = [address]
    config.accesslog = None
    config.errorlog = errorlog
    config.graceful_timeout = graceful_s
    config.keep_alive_timeout = limits.keep_alive_s
    config.h11_max_incomplete_size = HEAD_MAX_BYTES
    config.alpn_protocols = ["http/1.1"]  # no TLS here; should it come, HTTP/2 stays unoffered
    sockets = config.create_sockets()
    try:
        for sock in sockets.insecure_sockets:
            sock.listen(config.backlog)
    except OSError:
        for sock in sockets.insecure_sockets:
            sock.close()
        raise
    return Listening(config, sockets, limits)


class _Guard:
    """What every connection of one listener shares: the cap and the deadline of writes."""

    def __init__(self, limits: HttpLimits) -> None:
        self.slots = trio.Semaphore(limits.max_connections)
        self.send_s = limits.send_s
        self.shutdown_at = math.inf
        self._sending: set[trio.CancelScope] = set()

    @contextmanager
    def sending(self) -> Iterator[trio.CancelScope]:
        scope = trio.CancelScope(deadline=min(trio.current_time() + self.send_s, self.shutdown_at))
        self._sending.add(scope)
        try:
            with scope:
                yield scope
        finally:
            self._sending.discard(scope)

    def shut_down(self, at: float) -> None:
        """Writes in flight, and later ones, end by ``at``."""
        self.shutdown_at = at
        for scope in self._sending:
            scope.deadline = min(scope.deadline, at)


class _Cork:
    def __init__(self) -> None:
        self.streams: list[_Stream] = []


_corking: ContextVar[_Cork | None] = ContextVar("curb_corking", default=None)


@asynccontextmanager
async def corked() -> AsyncIterator[None]:
    """Hold this task's writes to its connection; on exit they go to the kernel as one write.

    Raises:
        trio.BrokenResourceError: That write failed (the peer is gone, or read nothing for
            the listener's ``send_s``).
    """
    cork = _Cork()
    token = _corking.set(cork)
    try:
        yield
    finally:
        _corking.reset(token)
        for stream in cork.streams:
            await stream.uncork()


class _Stream(trio.abc.HalfCloseableStream):
    """One accepted connection: its writes have a deadline, its close cannot be cancelled."""

    def __init__(self, inner: trio.SocketStream, guard: _Guard) -> None:
        self._inner = inner
        self._guard = guard
        self._held = True
        # Corked writes wait here; the lock keeps a flush and Hypercorn's own writes apart.
        self._corks = 0
        self._waiting: list[bytes] = []
        self._writing = trio.Lock()

    @property
    def socket(self) -> trio.socket.SocketType:
        return self._inner.socket

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        cork = _corking.get()
        if cork is not None and self not in cork.streams:
            cork.streams.append(self)
            self._corks += 1
        if self._corks:
            # Held, not written: no checkpoint (the corked block is bounded by its caller).
            self._waiting.append(bytes(data))
            return
        await self._write(data)

    async def uncork(self) -> None:
        """One corked block ended: once none is left, what waits goes out as one write."""
        self._corks -= 1
        if self._corks:
            return
        await self._flush()

    async def _flush(self) -> None:
        if not self._waiting:
            await trio.lowlevel.checkpoint()
            return
        data = b"".join(self._waiting)
        self._waiting.clear()
        # Shielded as Hypercorn shields its own writes: a write cut short would leave half
        # a frame on the wire. The guard's deadline still bounds it.
        with trio.CancelScope(shield=True):
            await self._write(data)

    async def _write(self, data: bytes | bytearray | memoryview) -> None:
        async with self._writing:
            with self._guard.sending() as scope:
                await self._inner.send_all(data)
        if scope.cancelled_caught:
            # A write cut short leaves the stream in no known state: it is over.
            self._release()
            self._inner.socket.close()
            raise trio.BrokenResourceError(f"the client read nothing for {self._guard.send_s:g} s")

    async def wait_send_all_might_not_block(self) -> None:
        await self._inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        return await self._inner.receive_some(max_bytes)

    async def send_eof(self) -> None:
        await self._flush_before_close()
        # Synchronous, then a checkpoint that is never cancelled: Hypercorn calls this from
        # inside a request's task that Quart may be cancelling, and the close must happen.
        with contextlib.suppress(OSError):
            self._inner.socket.shutdown(socket.SHUT_WR)
        await trio.lowlevel.cancel_shielded_checkpoint()

    async def aclose(self) -> None:
        await self._flush_before_close()
        self._release()
        await self._inner.aclose()  # closes the socket before its checkpoint

    async def _flush_before_close(self) -> None:
        # Written while a corked block was open (Hypercorn's own close frame): it goes first.
        if self._waiting and self._held:
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                await self._flush()

    def _release(self) -> None:
        if self._held:
            self._held = False
            self._guard.slots.release()


class _CappedListener(trio.abc.Listener[_Stream]):
    def __init__(self, inner: trio.SocketListener, guard: _Guard) -> None:
        self._inner = inner
        self._guard = guard

    async def accept(self) -> _Stream:
        await self._guard.slots.acquire()
        try:
            stream = await self._inner.accept()
        except BaseException:
            self._guard.slots.release()
            raise
        return _Stream(stream, self._guard)

    async def aclose(self) -> None:
        await self._inner.aclose()


class _TCPServer(TCPServer):
    async def _read_data(self) -> None:
        await super()._read_data()
        # The peer closed its side: do not hold the connection (and its slot) until the
        # keep-alive timer would have closed it.
        await self.idle_task.stop()


FIRST_MESSAGE_MAX_BYTES = 64 * 1024
"""The largest first message of the agent socket (its ``auth`` frame), read before any credential."""
_FAILED_LINGER_S = 2.0  # a failed connection's bytes are dropped this long for its close to arrive


class _WSStream(WSStream):
    """Hypercorn's WebSocket stream, with bounds for a peer nobody has authenticated yet.

    - A frame that cannot be parsed fails the connection with a close frame. wsproto reports
      it as a :class:`CloseConnection` carrying the code to fail with (1007 for invalid UTF-8
      in a text message, 1002 for any other protocol error) while its own state is still
      open: nobody sent it. Hypercorn only answers a close the peer sent, so it dropped TCP
      with no close frame.
    - A message is refused before it is buffered past its limit: the agent socket's first
      message (its ``auth`` frame) at :data:`FIRST_MESSAGE_MAX_BYTES`, any other at the
      listener's 16 MiB. Then the connection has failed: its close frame goes out, nothing it
      sends is kept or parsed, and it ends :data:`_FAILED_LINGER_S` later. (Hypercorn kept
      appending to the message past the limit, so a peer that kept sending grew the process
      without bound.)
    - permessage-deflate is not offered: a message is at most as large as its bytes on the
      wire (wsproto inflates a frame whole, so 1 MB deflated became a gigabyte).

    Otherwise the loop is Hypercorn's (0.18) own.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._received = 0
        self._failed = False

    async def handle(self, event: Any) -> None:
        if self._failed and isinstance(event, (Body, Data)):
            return
        was_closed = self.closed
        await super().handle(event)
        if self.closed and not was_closed and not isinstance(event, StreamClosed):
            # The handshake was refused: its connection is over (Hypercorn left it open).
            await self.send(StreamClosed(stream_id=self.stream_id))

    async def _accept(self, message: Any) -> None:
        self.handshake.extensions = None  # permessage-deflate (or any other) is not offered
        await super()._accept(message)

    def _limit(self) -> int:
        if self._received == 0 and self.scope["path"] == AGENT_STREAM_PATH:
            return FIRST_MESSAGE_MAX_BYTES
        return self.buffer.max_length

    async def _handle_events(self) -> None:
        for event in self.connection.events():
            if isinstance(event, Message):
                if self.buffer.length + len(event.data) > self._limit():
                    await self._fail(_too_big(self.scope["path"], event, first=self._received == 0))
                    break
                self.buffer.extend(event)
                if event.message_finished:
                    assert self.app_put is not None
                    self._received += 1
                    await self.app_put(self.buffer.to_message())
                    self.buffer.clear()
            elif isinstance(event, Ping):
                await self._send_wsproto_event(event.response())
            elif isinstance(event, CloseConnection):
                if self.connection.state is WebSocketState.REMOTE_CLOSING:
                    await self._send_wsproto_event(event.response())
                elif self.connection.state is WebSocketState.OPEN:
                    await self._send_wsproto_event(event)  # a frame that could not be parsed
                await self.send(StreamClosed(stream_id=self.stream_id))

    async def _fail(self, close: CloseConnection) -> None:
        await self._send_wsproto_event(close)
        self.buffer.clear()
        self._failed = True
        self.task_group.spawn(self._end_failed)

    async def _end_failed(self) -> None:
        await self.context.sleep(_FAILED_LINGER_S)
        if not self.closed:
            await self.send(StreamClosed(stream_id=self.stream_id))

    async def _send_error_response(self, status_code: int) -> None:
        bad = status_code == 400  # the handshake is not one (RFC 6455 4.2.1)
        await _send_refusal(self, status_code, "not a WebSocket handshake" if bad else None)


def _too_big(path: str, message: Message[Any], *, first: bool) -> CloseConnection:
    if path == AGENT_STREAM_PATH and first:
        return CloseConnection(
            code=4001, reason=f"the first frame must be auth, at most {FIRST_MESSAGE_MAX_BYTES} bytes"
        )
    # On the agent socket a binary message is audio, and one past the listener's message limit
    # (16 MiB) is past the seed's 10 MB recording cap too: that closes 4011, as the driver's own
    # count does for a recording that grows past it.
    if path == AGENT_STREAM_PATH and isinstance(message, BytesMessage):
        return CloseConnection(code=4011, reason=RECORDING_TOO_LONG)
    return CloseConnection(code=CloseReason.MESSAGE_TOO_BIG)


# Hypercorn's protocols name the stream class they build: every listener of this process
# is built here, so each of their WebSocket connections gets the stream above.
hypercorn.protocol.h11.WSStream = _WSStream  # type: ignore[attr-defined]  # not re-exported: the one hook Hypercorn leaves
hypercorn.protocol.h2.WSStream = _WSStream  # type: ignore[attr-defined]  # not re-exported: the one hook Hypercorn leaves


# -- Refusals made by the HTTP layer itself -----------------------------------------------------

HEAD_MAX_BYTES = 16 * 1024
"""The largest request head (request line and headers) either listener reads (431 past it)."""

_REFUSED = {
    400: "the request is not HTTP/1.1 that this runner can read",
    403: "the WebSocket was refused",
    404: "no such host",
    431: f"the request's head is over {HEAD_MAX_BYTES} bytes",
    500: "internal error",
    501: "only Transfer-Encoding: chunked is supported",
    505: "HTTP/2 is not served here: use HTTP/1.1",
}


def _refusal(status: int, detail: str | None = None) -> tuple[list[tuple[bytes, bytes]], bytes]:
    """The headers and ErrorBody of a refusal the HTTP layer makes; the connection closes after it."""
    code: ErrorCode = "internal" if status == 500 else "not_found" if status == 404 else "invalid_request"
    body = json_bytes(ErrorBody(error=code, detail=detail or _REFUSED.get(status)))
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]
    return headers, body


class _Refused(Exception):
    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


class _H11Protocol(hypercorn.protocol.h11.H11Protocol):
    """Hypercorn's HTTP/1.1, refusing what it would let through or answer with no body.

    - A request with both ``Content-Length`` and ``Transfer-Encoding`` is ``400`` and the
      connection closes (RFC 9112 6.3: the two framings disagree, which is how a request is
      smuggled past a proxy that reads the other one). h11 alone reads the chunked body and
      keeps the connection, so the bytes after it ran as a second request.
    - HTTP/2 is not offered: an ``Upgrade: h2c`` is ignored (RFC 9110 7.8 lets a server) and
      the request is answered in HTTP/1.1; HTTP/2's preface is ``505``.
    - Every refusal of the layer (a malformed request ``400``, a head over
      :data:`HEAD_MAX_BYTES` ``431``, a transfer coding other than chunked ``501``) carries an
      ErrorBody, as every non-2xx answer of the host protocol does.
    """

    async def handle(self, event: Any) -> None:
        try:
            await super().handle(event)
        except _Refused as refused:
            await self._refuse(refused.status, refused.detail)
            await self.send(Closed())

    async def _check_protocol(self, event: h11.Request) -> None:
        names = {name for name, _ in event.headers}  # h11 gives them lower-cased
        if b"content-length" in names and b"transfer-encoding" in names:
            raise _Refused(400, "a request may not carry both Content-Length and Transfer-Encoding")
        if event.method == b"PRI" and event.target == b"*" and event.http_version == b"2.0":
            raise _Refused(505, _REFUSED[505])

    async def _send_error_response(self, status_code: int) -> None:
        await self._refuse(status_code, None)

    async def _refuse(self, status: int, detail: str | None) -> None:
        headers, body = _refusal(status, detail)
        await self._send_h11_event(h11.Response(status_code=status, headers=headers))
        await self._send_h11_event(h11.Data(data=body))
        await self._send_h11_event(h11.EndOfMessage())


class _HTTPStream(HTTPStream):
    """Hypercorn's request stream, whose own refusals (a 500 when the app answered nothing) carry an ErrorBody."""

    async def _send_error_response(self, status_code: int) -> None:
        await _send_refusal(self, status_code)
        self.state = ASGIHTTPState.CLOSED


async def _send_refusal(stream: HTTPStream | WSStream, status: int, detail: str | None = None) -> None:
    headers, body = _refusal(status, detail)
    await stream.send(Response(stream_id=stream.stream_id, headers=headers, status_code=status))
    await stream.send(Body(stream_id=stream.stream_id, data=body))
    await stream.send(EndBody(stream_id=stream.stream_id))


# Hypercorn's protocol wrapper and its HTTP/1.1 protocol name the classes they build: every
# listener of this process is built here, so each of their connections gets the ones above.
hypercorn.protocol.H11Protocol = _H11Protocol  # type: ignore[attr-defined]  # not re-exported: the one hook Hypercorn leaves
hypercorn.protocol.h11.HTTPStream = _HTTPStream  # type: ignore[attr-defined]  # not re-exported: the one hook Hypercorn leaves


_BODY_LATE = json.dumps({"error": "invalid_request", "detail": "the request's body did not arrive in time"})


class _BodyDeadline:
    """ASGI middleware: a request's body must be whole within ``body_s`` of its head."""

    def __init__(self, app: Any, body_s: float) -> None:
        self.app = app
        self.body_s = body_s

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        deadline = trio.current_time() + self.body_s
        complete = late = started = False

        async def timed_receive() -> Any:
            nonlocal complete, late
            if complete:
                return await receive()
            with trio.move_on_at(deadline):
                message = await receive()
                if message["type"] != "http.request" or not message.get("more_body", False):
                    complete = True
                return message
            late = True
            return {"type": "http.disconnect"}

        async def tracked_send(message: Any) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        await self.app(scope, timed_receive, tracked_send)
        if late and not started:
            body = _BODY_LATE.encode()
            headers = [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ]
            await send({"type": "http.response.start", "status": 400, "headers": headers})
            await send({"type": "http.response.body", "body": body})


class _HeadEnds:
    """ASGI middleware: a ``HEAD`` request's answer ends with its head, and so does its handler.

    Quart answers ``HEAD`` with its ``GET`` handler and Hypercorn drops the body: an endless
    body (the events stream) then never ended, so its connection took no next request and,
    since nothing was written, never noticed its reader leave: the connection and its
    follower were held for good.
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return
        with trio.CancelScope() as handler:

            async def head_send(message: Any) -> None:
                if handler.cancel_called:
                    return
                await send(message)
                if message["type"] == "http.response.start":
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                    handler.cancel()

            await self.app(scope, receive, head_send)


async def serve_http(
    app: Any,
    listening: Listening,
    shutdown: trio.Event,
    *,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` on a bound listener until ``shutdown`` is set; started with its address.

    Then the listener closes, idle connections close, and the others get
    ``limits.shutdown_s`` to finish before they are cut.
    """
    config, limits = listening.config, listening.limits
    asgi = wrap_app(_HeadEnds(_BodyDeadline(app, limits.body_s)), config.wsgi_max_body_size, "asgi")
    lifespan_state: dict[str, Any] = {}
    lifespan = Lifespan(asgi, config, lifespan_state)
    context = WorkerContext(None)
    guard = _Guard(limits)
    (sock,) = listening.sockets.insecure_sockets
    async with trio.open_nursery() as lifespan_nursery:
        await lifespan_nursery.start(lifespan.handle_lifespan)
        await lifespan.wait_for_startup()
        async with trio.open_nursery() as connections:
            listener = _CappedListener(trio.SocketListener(trio.socket.from_stdlib_socket(sock)), guard)
            handler = partial(_TCPServer, asgi, config, context, ConnectionState(lifespan_state.copy()))
            task_status.started(repr_socket_addr(sock.family, sock.getsockname()))
            async with trio.open_nursery() as accepting:
                accepting.start_soon(
                    partial(trio.serve_listeners, handler, [listener], handler_nursery=connections)
                )
                await shutdown.wait()
                accepting.cancel_scope.cancel()
            await context.terminated.set()  # idle keep-alive connections close now
            at = trio.current_time() + limits.shutdown_s
            guard.shut_down(at)
            connections.cancel_scope.deadline = at
        await lifespan.wait_for_shutdown()
        lifespan_nursery.cancel_scope.cancel()
