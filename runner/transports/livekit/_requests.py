"""Requests from the caller's app (RPC ``curb.message`` and ``curb.update``).

Taken on the session's loop, answered by the agent's handler in Trio (each in a system task:
the session has no nursery of its own), and the answer handed back to the loop. A refusal is
an ``RpcError`` (code 1500) whose message is the code and whose data, when there is any, is
JSON; a request over 15 KiB is refused ``payload_too_large``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging

import attrs
import trio
from livekit import rtc

from ...sessions import ClientRefusal, RequestHandler
from ._loop import LoopThread

log = logging.getLogger("runner.transports.livekit")

RPC_METHODS = ("curb.message", "curb.update")
MAX_REQUEST_BYTES = 15 * 1024
REFUSAL_RPC_CODE = 1500  # RpcError.ErrorCode.APPLICATION_ERROR
REQUEST_WAIT_S = 10.0  # a request that arrives before the agent's runtime took requests
REQUESTS_CANCEL_TIMEOUT_S = 2.0


@attrs.define(eq=False)
class _Request:
    """One RPC from the caller's app, on its way from the loop to Trio and back."""

    method: str
    payload: str
    caller: str
    answer: asyncio.Future[tuple[str | None, str | None, str | None]]
    loop: asyncio.AbstractEventLoop
    scope: trio.CancelScope | None = None
    cancelled: bool = False

    def resolve(self, reply: str | None, code: str | None = None, data: str | None = None) -> None:
        """Hand the outcome back to the loop (from Trio): a reply, or a refusal code."""

        def settle() -> None:
            if not self.answer.done():
                self.answer.set_result((reply, code, data))

        # The loop may be gone: the caller learns it from LiveKit.
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(settle)

    def cancel(self) -> None:
        """The caller stopped waiting (Trio side)."""
        self.cancelled = True
        if self.scope is not None:
            self.scope.cancel()


_GONE = "\x00gone"  # a request whose answer is LiveKit's own "recipient disconnected"


class Requests:
    """The requests of one session: :meth:`a_on_rpc` takes them on the loop; the rest is Trio.

    Args:
        thread: The session's loop thread.
        session_id: The call's, for the log.
    """

    def __init__(self, thread: LoopThread, session_id: str) -> None:
        self._thread = thread
        self._session_id = session_id
        self._handler: RequestHandler | None = None
        self._handler_set = trio.Event()
        self._requests: set[_Request] = set()
        self._idle = trio.Event()
        self._idle.set()
        self._closing = False

    def set_handler(self, handler: RequestHandler) -> None:
        """Answer the requests (those waiting for a handler, too) with ``handler``."""
        self._handler = handler
        self._handler_set.set()

    async def aclose(self) -> None:
        """Refuse new requests, cancel those in flight, and wait for their ends (bounded)."""
        self._closing = True
        for request in list(self._requests):
            request.cancel()
        with trio.move_on_after(REQUESTS_CANCEL_TIMEOUT_S):
            await self._idle.wait()

    async def a_on_rpc(self, data: rtc.RpcInvocationData) -> str:
        """The room's RPC handler (on the loop): wait for Trio's answer."""
        if len(data.payload.encode()) > MAX_REQUEST_BYTES:
            raise rtc.RpcError(REFUSAL_RPC_CODE, "payload_too_large")
        loop = asyncio.get_running_loop()
        request = _Request(
            method=data.method,
            payload=data.payload,
            caller=data.caller_identity,
            answer=loop.create_future(),
            loop=loop,
        )
        if not self._thread.to_trio(self._t_start, request):
            raise _recipient_gone()
        try:
            reply, code, error_data = await request.answer
        except asyncio.CancelledError:
            self._thread.to_trio(request.cancel)
            raise
        if code == _GONE:
            raise _recipient_gone()
        if code is not None:
            raise rtc.RpcError(REFUSAL_RPC_CODE, code, error_data)
        return reply or ""

    def _t_start(self, request: _Request) -> None:
        if self._closing:
            request.resolve(None, _GONE)
            return
        request.scope = trio.CancelScope()
        if request.cancelled:
            request.scope.cancel()
        self._requests.add(request)
        self._idle = trio.Event()
        # A system task: the session has no nursery of its own (calls.py enters the session
        # inside its start timeout), so the session keeps the set and cancels it on close.
        trio.lowlevel.spawn_system_task(self._t_serve, request, name=f"livekit {request.method}")

    async def _t_serve(self, request: _Request) -> None:
        outcome: tuple[str | None, str | None, str | None] = (None, _GONE, None)
        try:
            assert request.scope is not None
            with request.scope:
                outcome = await self._t_answer(request)
        except Exception:
            log.exception("call %s: the %s request failed", self._session_id, request.method)
            outcome = (None, "internal", None)
        finally:
            request.resolve(*outcome)
            self._requests.discard(request)
            if not self._requests:
                self._idle.set()

    async def _t_answer(self, request: _Request) -> tuple[str | None, str | None, str | None]:
        if self._handler is None:
            with trio.move_on_after(REQUEST_WAIT_S):
                await self._handler_set.wait()
        if self._handler is None:
            return None, ("not_adjustable" if request.method == "curb.update" else "no_handler"), None
        try:
            reply = await self._handler(request.method, request.payload, request.caller)
        except ClientRefusal as refusal:
            data = json.dumps(refusal.data, separators=(",", ":")) if refusal.data else None
            return None, refusal.code, data
        return reply, None, None


def _recipient_gone() -> rtc.RpcError:
    code = rtc.RpcError.ErrorCode.RECIPIENT_DISCONNECTED
    return rtc.RpcError(code, rtc.RpcError.ErrorMessage[code])
