"""What a call needs from the thing that connects it to its caller.

A transport opens one session per call. The session reports what happens on the
caller's side as events, and takes what the agent says. LiveKit, the agent
WebSocket and the in-process loopback all plug in here.

This module sits below both the calls and the agent runtime, and above nothing of the
runner's: events flow one way, from the transports up to the call's conversation.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, Literal, Protocol

import attrs
import trio


@attrs.frozen(kw_only=True)
class CallTarget:
    """Where a call's caller is: the start request's ``realtimeUrl`` and ``realtimeToken``."""

    session_id: str
    url: str
    token: str


class TransportError(Exception):
    """The transport could not join, or lost its connection; the message says which."""


# -- Caller-side events --------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class ParticipantJoined:
    identity: str
    kind: Literal["caller", "app", "sip", "agent", "transfer_target"]


@attrs.frozen(kw_only=True)
class ParticipantLeft:
    identity: str
    kind: Literal["caller", "app", "sip", "agent", "transfer_target"]


@attrs.frozen(kw_only=True)
class AudioFrame:
    """16-bit signed little-endian mono PCM from the caller."""

    pcm: bytes
    sample_rate_hz: int


@attrs.frozen(kw_only=True)
class UserText:
    """A typed turn from the caller's app."""

    text: str


@attrs.frozen(kw_only=True)
class Disconnected:
    """The transport lost the room; ``reason`` says why."""

    reason: str


@attrs.frozen(kw_only=True)
class DtmfReceived:
    """A key the caller pressed on a phone (an RFC 4733 telephone event): ``0``-``9``, ``*``,
    ``#`` or ``A``-``D``. ``identity`` is the participant who pressed it."""

    identity: str
    digit: str


TransportEvent = ParticipantJoined | ParticipantLeft | AudioFrame | UserText | DtmfReceived | Disconnected

# The keys of a telephone keypad as RFC 4733 numbers them (event codes 0-15).
DTMF_DIGITS = "0123456789*#ABCD"

# A client request (RPC): method and raw payload in, the raw answer out. A refusal
# raises ClientRefusal, whose message is the code.
RequestHandler = Callable[[str, str, str], Awaitable[str]]


class ClientRefusal(Exception):
    """A refused client request: the transport sends ``code`` as the error message."""

    def __init__(self, code: str, data: dict[str, Any] | None = None) -> None:
        super().__init__(code)
        self.code = code
        self.data = data


class TransportSession(Protocol):
    """One call's connection to its caller: it turns frames into audio and events, and back.

    ``delimits_turns``: the caller's side says where each of its turns starts and ends (the
    agent WebSocket's ``user_audio.start``/``end``), so the call detects no turns of its own
    and opens with no greeting until the caller's side asks for one.
    """

    kind: str
    delimits_turns: bool

    @property
    def events(self) -> trio.MemoryReceiveChannel[TransportEvent]: ...

    def set_request_handler(self, handler: RequestHandler) -> None:
        """Route the caller's requests (``curb.message``, ``curb.update``) to ``handler``."""
        ...

    def client_reachable(self) -> Literal["ok", "no_app", "phone"]:
        """Whether a message to the client app would arrive, and if not, why."""
        ...

    async def send_to_client(self, key: str, payload: Any) -> None:
        """Send ``{key, payload}`` on the ``curb.message`` text stream."""
        ...

    async def publish_audio(self, pcm: bytes, sample_rate_hz: int) -> None:
        """Play agent speech to the caller (16-bit mono PCM)."""
        ...

    async def clear_audio(self) -> None:
        """Stop whatever agent speech is still queued (a barge-in)."""
        ...

    def ringing(self) -> trio.Event | None:
        """``None`` when the caller can hear the agent now; while a phone caller still rings
        (LiveKit's SIP service answers the phone once the agent listens to it), an event set
        once the phone is answered or gone. The opening line waits for it."""
        ...

    async def send_dtmf(self, digits: str) -> None:
        """Press ``digits`` (each one of :data:`DTMF_DIGITS`) on the call's phone line, in order.

        Raises:
            TransportError: The call has no phone line (no SIP participant), or the keys
                could not be sent.
        """
        ...


class Transport(Protocol):
    """Opens sessions for the URLs it handles."""

    name: str

    def handles(self, url: str) -> bool: ...

    def open_session(self, target: CallTarget) -> AbstractAsyncContextManager[TransportSession]:
        """Join the caller's room. Raises TransportError when it cannot."""
        ...
