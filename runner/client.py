"""Talk to a call's agent from a Python app: the counterpart of the seed's ``curb/client``.

It wraps the plain LiveKit wire format (RPC ``curb.message`` / ``curb.update``, text stream
topic ``curb.message``) around the ``rtc.Room`` your app already owns::

    from livekit import rtc
    from runner.client import AgentRefusedError, connect_agent

    agent = connect_agent(room)                        # one per room
    off = agent.on("show-form", lambda payload, meta: open_form(payload))
    await agent.send("claim-submitted", {"claimId": "C-17"})
    quote = await agent.ask("quote", {"plan": "basic"}, timeout=5)
    try:
        settings = await agent.update({"tts": {"voice": 17}})
    except AgentRefusedError as error:
        if error.code != "not_adjustable":
            raise
    agent.close()

This module runs in the app's process, inside the app's asyncio loop, like the ``livekit``
SDK itself; it is not part of the runner's own (Trio) process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from livekit import rtc

__all__ = ["AgentClient", "AgentRefusedError", "AgentUnavailableError", "connect_agent"]

log = logging.getLogger("runner.client")

TOPIC = "curb.message"
MAX_PAYLOAD_BYTES = 15 * 1024  # LiveKit's RPC payload cap
DEFAULT_TIMEOUT_S = 10.0
_REFUSAL_RPC_CODE = 1500
_CODE = re.compile(r"^[a-z][a-z_]*$")

Handler = Callable[[Any, Mapping[str, str]], Any]


class AgentRefusedError(Exception):
    """The agent refused a request: ``code`` is the wire code (``no_handler``,
    ``invalid_payload``, ``handler_failed``, ``not_adjustable``, ``invalid_settings``,
    ``payload_too_large``, ...), with ``issues`` or ``path`` when the agent sent them."""

    def __init__(
        self, code: str, issues: list[dict[str, Any]] | None = None, path: str | None = None
    ) -> None:
        super().__init__(code)
        self.code = code
        self.issues = issues
        self.path = path


class AgentUnavailableError(Exception):
    """No agent joined the room within the request's timeout."""


class AgentClient:
    """The app's side of one room's agent. Make it with :func:`connect_agent`."""

    def __init__(self, room: rtc.Room, agent_identity: str | None = None) -> None:
        self._room = room
        self._agent_identity = agent_identity
        self._handlers: dict[str, list[Handler]] = {}
        self._warned: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self._joined = asyncio.Event()
        room.register_text_stream_handler(TOPIC, self._on_text)
        room.on("participant_connected", self._on_participant)

    # -- Requests ---------------------------------------------------------------------------

    async def send(self, key: str, payload: Any = None, *, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        """Send ``key`` to the agent; return once its handlers took it.

        Raises:
            AgentRefusedError: The agent refused it (or it is over 15 KiB: ``payload_too_large``).
            AgentUnavailableError: No agent joined within ``timeout`` seconds.
            livekit.rtc.RpcError: A transport failure (a timeout, a disconnect).
        """
        await self.ask(key, payload, timeout=timeout)

    async def ask(self, key: str, payload: Any = None, *, timeout: float = DEFAULT_TIMEOUT_S) -> Any:
        """Send ``key`` to the agent and return its handler's reply (see :meth:`send`)."""
        if not isinstance(key, str) or not key or len(key) > 256:
            raise ValueError("a message key is a non-empty string of at most 256 characters")
        body = {"key": key, "id": str(uuid.uuid4()), "payload": payload}
        answer = await self._request("curb.message", body, timeout)
        return answer.get("reply") if isinstance(answer, dict) else None

    async def update(
        self, settings: Mapping[str, Any], *, timeout: float = DEFAULT_TIMEOUT_S
    ) -> dict[str, Any]:
        """Change the call's live settings (a SessionUpdate); return the effective settings.

        Raises:
            AgentRefusedError: ``not_adjustable`` (with ``path``) or ``invalid_settings``
                (with ``issues``); nothing changed.
        """
        answer = await self._request("curb.update", dict(settings), timeout)
        if not isinstance(answer, dict):
            raise AgentRefusedError("invalid_response")
        return answer

    async def _request(self, method: str, body: Any, timeout: float) -> Any:
        self._check_open()
        payload = json.dumps(body, separators=(",", ":"), ensure_ascii=False)
        if len(payload.encode()) > MAX_PAYLOAD_BYTES:
            raise AgentRefusedError("payload_too_large")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        identity = await self._wait_agent(timeout)
        remaining = max(0.001, deadline - loop.time())
        try:
            response = await self._room.local_participant.perform_rpc(
                destination_identity=identity, method=method, payload=payload, response_timeout=remaining
            )
        except rtc.RpcError as error:
            if error.code == _REFUSAL_RPC_CODE and _CODE.match(error.message or ""):
                raise _refusal(error) from None
            raise
        return json.loads(response) if response else None

    # -- The agent --------------------------------------------------------------------------

    def agent_identity(self) -> str | None:
        """The agent's identity once it is in the room: the one named, else the first AGENT."""
        participants = self._room.remote_participants
        if self._agent_identity is not None:
            return self._agent_identity if self._agent_identity in participants else None
        for participant in participants.values():
            if participant.kind == rtc.ParticipantKind.PARTICIPANT_KIND_AGENT:
                return participant.identity
        return None

    async def _wait_agent(self, timeout: float) -> str:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while (identity := self.agent_identity()) is None:
            self._joined.clear()
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise AgentUnavailableError(f"no agent joined the room within {timeout:g} s")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._joined.wait(), remaining)
        return identity

    def _on_participant(self, participant: rtc.RemoteParticipant) -> None:
        self._joined.set()

    # -- Messages from the agent ------------------------------------------------------------

    def on(self, key: str, handler: Handler) -> Callable[[], None]:
        """Call ``handler(payload, {"id": stream_id})`` for each ``key`` the agent sends.

        Returns:
            A function that removes the handler.
        """
        self._check_open()
        self._handlers.setdefault(key, []).append(handler)

        def unsubscribe() -> None:
            handlers = self._handlers.get(key, [])
            if handler in handlers:
                handlers.remove(handler)

        return unsubscribe

    def _from_agent(self, sender: str) -> bool:
        if self._agent_identity is not None:
            return sender == self._agent_identity
        participant = self._room.remote_participants.get(sender)
        return participant is not None and participant.kind == rtc.ParticipantKind.PARTICIPANT_KIND_AGENT

    def _on_text(self, reader: rtc.TextStreamReader, sender: str) -> None:
        if self._closed or not self._from_agent(sender):
            return
        task = asyncio.ensure_future(self._read(reader))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _read(self, reader: rtc.TextStreamReader) -> None:
        try:
            message = json.loads(await reader.read_all())
            key, payload = message["key"], message.get("payload")
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("a malformed curb.message from the agent was dropped: %s", exc)
            return
        handlers = list(self._handlers.get(key, ()))
        if not handlers:
            if key not in self._warned:
                self._warned.add(key)
                log.warning("no handler for the agent's message %r; dropped", key)
            return
        meta = {"id": reader.info.stream_id}
        for handler in handlers:
            try:
                result = handler(payload, meta)
                if asyncio.iscoroutine(result):
                    await result
            except Exception:
                log.exception("the handler of the agent's message %r failed", key)

    # -- Lifetime ---------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this agent client is closed")

    def close(self) -> None:
        """Stop listening to the agent; the room's ``curb.message`` topic is free again."""
        if self._closed:
            return
        self._closed = True
        self._handlers.clear()
        self._room.unregister_text_stream_handler(TOPIC)
        self._room.off("participant_connected", self._on_participant)
        for task in self._tasks:
            task.cancel()


def _refusal(error: rtc.RpcError) -> AgentRefusedError:
    issues = path = None
    if error.data:
        try:
            data = json.loads(error.data)
        except ValueError:
            data = None
        if isinstance(data, dict):
            issues = data.get("issues") if isinstance(data.get("issues"), list) else None
            path = data.get("path") if isinstance(data.get("path"), str) else None
    return AgentRefusedError(error.message, issues, path)


def connect_agent(room: rtc.Room, agent_identity: str | None = None) -> AgentClient:
    """The agent of ``room``: ``agent_identity``, else the first participant of kind AGENT.

    One client per room (LiveKit takes one handler per text-stream topic); ``close()`` it
    when the app is done with the room.

    Raises:
        ValueError: The room already has a ``curb.message`` text-stream handler.
    """
    return AgentClient(room, agent_identity)
