"""An agent's messages in a call: keyed messages to its handlers, to the app and the host, asks.

:class:`CallMessages` delivers what the caller's app and the host send to the agent's
handlers, sends what agent code sends (``ctx.send``, in order, from one outbox), waits for
the host's answers to ``ctx.ask_host``, and answers the app's requests (``curb.message``,
``curb.update``). It is the link :class:`~._context.Context` gives agent code.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import trio

from ..calls import keep_json
from ..errors import HandlerFailed, InvalidPayload, InvalidRequest, NoHandler, NotAdjustable, RunnerError
from ..sessions import DTMF_DIGITS, ClientRefusal, TransportError, TransportSession
from ..wire import EffectiveSettings, HostMessage, Issue, WireError, decode, encode, parse_json
from ._authoring import Agent, Sender, call_maybe_async, check_key
from ._context import Context, HostTimeoutError, HostUnavailableError
from ._records import CallRecords
from ._settings import Origin

log = logging.getLogger("runner.agent")

CLIENT_WAIT_S = 10.0
MAX_CLIENT_REQUEST_BYTES = 15 * 1024


class CallMessages:
    """One call's messages.

    Args:
        agent: Whose handlers take the messages.
        records: Where deliveries and sends are journaled.
        session_id: The call's id (for its logs).
        host_connected: A host reads this call's record (else nothing goes to the host).
        adjust: Applies a settings update (``curb.update``).
        ready: Set once the call runs; the app's requests wait for it.
    """

    def __init__(
        self,
        agent: Agent,
        records: CallRecords,
        *,
        session_id: str,
        host_connected: bool,
        adjust: Callable[[Origin, object], Awaitable[EffectiveSettings]],
        ready: trio.Event,
    ) -> None:
        self._agent = agent
        self._records = records
        self._session_id = session_id
        self._adjust = adjust
        self._ready = ready
        self.host_connected = host_connected
        # Set by the runtime: the context handlers get, and the call's session once it runs.
        self.ctx: Context | None = None
        self.session: TransportSession | None = None
        self._asks: dict[str, trio.MemorySendChannel[Any]] = {}
        self._ask_count = 0
        self._host_count = 0
        self._warned: set[tuple[str, str]] = set()
        self.undelivered_to_client: dict[str, int] = {}
        self.refused_queued_host_messages = 0
        self._unsent = 0
        self._sent = trio.Event()
        self._sent.set()
        self._outbox_send, self._outbox = trio.open_memory_channel[Callable[[], Awaitable[None]]](math.inf)

    async def deliver(self, sender: Sender, key: str, payload: Any, *, message_id: str | None = None) -> Any:
        """Run the handlers of ``key`` from ``sender``; return the reply (the last handler's).

        Raises:
            NoHandler: Nothing listens for the key from that sender.
            InvalidPayload: A schema refused the payload; no handler ran.
            HandlerFailed: A handler raised; the others still ran.
        """
        ctx = self.ctx
        assert ctx is not None, "the runtime gives its context before any message"
        handlers = self._agent.handlers_for(key, sender, ctx)
        kept, truncated = keep_json(payload)
        event: dict[str, Any] = {"from": sender, "key": key, "id": message_id, "payload": kept}
        if not handlers:
            await self._records.event("curb.message", {**event, "outcome": "no_handler"})
            raise NoHandler(f"no_handler: nothing handles {key!r} from the {sender}")
        decoded: list[Any] = []
        issues: list[Issue] = []
        for handler in handlers:
            if handler.schema is None:
                decoded.append(payload)
                continue
            try:
                decoded.append(decode(handler.schema, payload))
            except WireError as exc:
                issues.extend(exc.issues)
        if issues:
            await self._records.event("curb.message", {**event, "outcome": "invalid_payload"})
            summary = "; ".join(f"{'.'.join(map(str, i.path)) or '(payload)'}: {i.message}" for i in issues)
            raise InvalidPayload(
                f"invalid_payload: the payload of {key!r} does not match its schema: {summary}", issues=issues
            )
        reply: Any = None
        failures: list[str] = []
        for handler, value in zip(handlers, decoded, strict=True):
            try:
                reply = await call_maybe_async(handler.fn, ctx, value)
            except Exception as exc:  # noqa: BLE001 - an author's handler may raise anything; the sender is told it failed
                log.warning("handler for %r from %s failed: %s", key, sender, exc)
                failures.append(f"{type(exc).__name__}: {exc}")
        if reply is not None:
            try:
                reply = encode(reply)
                # Held to the rules of every body (depth, numbers, Unicode), so a record keeps it.
                parse_json(json.dumps(reply, separators=(",", ":")))
            except (RecursionError, ValueError, TypeError) as exc:
                log.warning(
                    "handler for %r from %s replied with what no record can keep: %s", key, sender, exc
                )
                failures.append(f"its reply is not JSON a record can keep: {type(exc).__name__}: {exc}")
                reply = None
        if failures:
            await self._records.event(
                "curb.message", {**event, "outcome": "handler_failed", "error": failures[0]}
            )
            raise HandlerFailed(f"handler_failed: a handler of {key!r} raised {failures[0]}")
        kept_reply, reply_truncated = keep_json(reply)
        record = {**event, "outcome": "delivered", "reply": kept_reply}
        if truncated or reply_truncated:
            record["truncated"] = True
        await self._records.event("curb.message", record)
        return reply

    async def deliver_host(self, message: HostMessage) -> None:
        """A host message: a reply to a waiting ask resolves it; anything else goes to handlers."""
        if message.in_reply_to is not None:
            waiter = self._asks.pop(message.in_reply_to, None)
            if waiter is not None:
                waiter.send_nowait(message.payload)
                await self._records.event(
                    "curb.message",
                    {
                        "from": "host",
                        "key": message.name,
                        "id": message.id,
                        "inReplyTo": message.in_reply_to,
                        "payload": keep_json(message.payload)[0],
                        "outcome": "reply",
                    },
                )
                return
        await self.deliver("host", message.name, message.payload, message_id=message.id)

    async def handle_client_request(self, method: str, payload: str, caller: str) -> str:
        """The caller's app: ``curb.message`` (``{key, id, payload}`` -> ``{reply}``) and ``curb.update``.

        A refusal raises :class:`ClientRefusal` whose message is the code.
        """
        if len(payload.encode()) > MAX_CLIENT_REQUEST_BYTES:
            raise ClientRefusal("payload_too_large")
        if not self._ready.is_set():
            with trio.move_on_after(CLIENT_WAIT_S):
                await self._ready.wait()
            if not self._ready.is_set():
                raise ClientRefusal("not_adjustable" if method == "curb.update" else "no_handler")
        try:
            body = parse_json(payload)
        except ValueError:
            raise ClientRefusal("invalid_request") from None
        try:
            if method == "curb.update":
                return json.dumps(encode(await self._adjust("client", body)), separators=(",", ":"))
            if method == "curb.message":
                if not isinstance(body, dict) or not isinstance(body.get("key"), str):
                    raise InvalidRequest("curb.message takes {key, id, payload}")
                reply = await self.deliver(
                    "client", body["key"], body.get("payload"), message_id=body.get("id")
                )
                return json.dumps({"reply": reply}, separators=(",", ":"))
        except RunnerError as refusal:
            raise ClientRefusal(refusal.code, refusal_details(refusal)) from None
        raise ClientRefusal("not_found")

    # -- The link agent code uses (ctx.send, ctx.ask_host) --------------------

    def _warn_once(self, key: str, reason: str) -> None:
        if (key, reason) not in self._warned:
            self._warned.add((key, reason))
            log.warning("message %r dropped: %s", key, reason)

    def to_client(self, key: str, payload: Mapping[str, Any] | None) -> None:
        check_key(key)
        session = self.session
        reachable = session.client_reachable() if session is not None else "no_app"
        if session is None or reachable != "ok":
            reason = (
                "the call is a phone call (no data channel)"
                if reachable == "phone"
                else "no app is in the room"
            )
            self._warn_once(key, reason)
            self.undelivered_to_client[key] = self.undelivered_to_client.get(key, 0) + 1
            return
        body = dict(payload or {})

        async def send() -> None:
            await session.send_to_client(key, body)
            await self._records.event("curb.toClient", {"key": key, "payload": keep_json(body)[0]})

        self._queue_send(send)

    def to_host(self, key: str, payload: Mapping[str, Any] | None) -> None:
        check_key(key)
        if not self.host_connected:
            self._warn_once(key, "no host is connected")
            return
        self._host_count += 1
        record = {
            "type": "host",
            "id": f"h-{self._host_count}",
            "name": key,
            **_kept(payload),
            "expectsReply": False,
        }

        async def send() -> None:
            await self._records.write("host", record)

        self._queue_send(send)

    async def ask_host(self, key: str, payload: Mapping[str, Any] | None, timeout_s: float) -> Any:
        check_key(key)
        if not self.host_connected:
            raise HostUnavailableError("no host is connected to this call")
        self._ask_count += 1
        ask_id = f"a-{self._ask_count}"
        send, receive = trio.open_memory_channel[Any](1)
        self._asks[ask_id] = send
        try:
            await self._records.write(
                "host", {"type": "host", "id": ask_id, "name": key, **_kept(payload), "expectsReply": True}
            )
            with trio.move_on_after(timeout_s):
                try:
                    return await receive.receive()
                except trio.EndOfChannel:
                    raise HostUnavailableError("the call ended while the agent waited for the host") from None
            raise HostTimeoutError(f"the host did not answer {key!r} within {timeout_s:g} s")
        finally:
            self._asks.pop(ask_id, None)

    def dtmf(self, digits: str) -> None:
        if not isinstance(digits, str) or not digits or any(d not in DTMF_DIGITS for d in digits.upper()):
            raise ValueError(f"DTMF takes one or more of {DTMF_DIGITS}, got {digits!r}")
        keys = digits.upper()

        async def send() -> None:
            session = self.session
            try:
                if session is None:
                    raise TransportError("the call is not connected")
                await session.send_dtmf(keys)
            except TransportError as exc:
                if ("\x00dtmf", str(exc)) not in self._warned:
                    self._warned.add(("\x00dtmf", str(exc)))
                    log.warning("call %s: phone keys dropped: %s", self._session_id, exc)
                return
            await self._records.event("curb.dtmf", {"from": "agent", "digits": keys})

        self._queue_send(send)

    def _queue_send(self, send: Callable[[], Awaitable[None]]) -> None:
        self._unsent += 1
        if self._sent.is_set():
            self._sent = trio.Event()
        self._outbox_send.send_nowait(send)

    async def wait_sent(self) -> None:
        """Wait until every message agent code queued so far has been sent (and journaled)."""
        await self._sent.wait()

    async def serve_outbox(self) -> None:
        # One task sends what agent code queued, so messages leave in the order they were sent.
        async for send in self._outbox:
            try:
                await send()
            except Exception as exc:  # noqa: BLE001 - a message that cannot be sent is logged; the outbox goes on
                log.warning("a message could not be sent: %s", exc)
            finally:
                self._unsent -= 1
                if self._unsent == 0:
                    self._sent.set()

    def release_asks(self) -> None:
        """The call ends: every ``ask_host`` still waiting fails at once."""
        for waiter in list(self._asks.values()):
            waiter.close()

    def summary(self) -> dict[str, Any]:
        """The call's ``curb.messages`` payload: what it could not deliver."""
        return {
            "undeliveredToClient": dict(self.undelivered_to_client),
            "refusedQueuedHostMessages": self.refused_queued_host_messages,
        }


def _kept(payload: Mapping[str, Any] | None) -> dict[str, Any]:
    kept, truncated = keep_json(dict(payload or {}))
    return {"payload": kept, "truncated": True} if truncated else {"payload": kept}


def refusal_details(refusal: RunnerError) -> dict[str, Any]:
    details: dict[str, Any] = {}
    if isinstance(refusal, NotAdjustable):
        details["path"] = refusal.path
    issues = getattr(refusal, "issues", None)
    if issues:
        details["issues"] = [{"path": i.path, "message": i.message} for i in issues]
    return details
