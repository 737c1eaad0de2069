"""LiveKit rooms: the runner's main transport.

A call whose ``realtimeUrl`` is ``ws://`` or ``wss://`` joins that LiveKit room with its
``realtimeToken`` (minted by the host with kind ``agent``; this module needs no API
secret). The caller's app talks to the agent with plain LiveKit:

* RPC ``curb.message`` (``{key, id, payload}`` -> ``{reply}``) and ``curb.update``
  (SessionUpdate -> EffectiveSettings); a refusal is an ``RpcError`` (code 1500) whose
  message is the code and whose data, when there is any, is ``{"issues": ...}`` or
  ``{"path": ...}`` as JSON. A request over 15 KiB is refused ``payload_too_large``.
* Text stream topic ``curb.message``: the agent's ``{key, payload}`` to the app.
* Text stream topic ``lk.chat`` (LiveKit's chat convention): a typed turn.
* Audio both ways: the caller's microphone track in, the agent's voice track out.
* A phone caller that still rings (``sip.callStatus: ringing``; LiveKit's SIP service answers
  once the agent subscribed to its audio) hears the opening line only once it is answered:
  ``ringing()`` gives the greeting an event to wait for.
* A phone caller still on the line when the call ends on the agent's side (the host stopped
  it, the runner drains) is hung up: removed from the room with the server API, so LiveKit's
  SIP service ends its call (a SIP BYE). That takes the runner's API key (``LIVEKIT_API_*``)
  or a call token that grants ``roomAdmin``; without either the host ends the phone's leg.
* Phone keys both ways (LiveKit's SIP DTMF packets, which its SIP service turns into RFC 4733
  events and back): the caller's keys in, ``ctx.send.dtmf`` out.

The ``livekit`` SDK is asyncio and this is the only package of the runner that imports
asyncio. Each session runs one asyncio event loop in a thread of its own, started when the
call joins and stopped (and its thread joined) when it leaves: a call never leaves a thread
behind, and one call's stalled room or slow callback never delays another call's audio.
A plain loop in a thread rather than trio-asyncio: the SDK builds futures and queues on
whatever loop is current and its native library wakes that loop with
``call_soon_threadsafe``, so it gets exactly the world it was written for, and Trio keeps a
single scheduler. Every call from Trio into the loop is bounded by a timeout; everything the
loop learns reaches Trio through ``TrioToken.run_sync_soon``.

``_session.py`` is the session as Trio sees it (and the transport that opens it); ``_room.py``
the room as the session's loop sees it (``_roster.py``: who is who); ``_voice.py`` the agent's
voice track, ``_hearing.py`` the caller's audio, ``_requests.py`` the app's RPCs,
``_server_api.py`` the server API (tokens, hanging up a phone), ``_loop.py`` the loop's thread.
Methods named ``_a_*``/``a_*`` run on the session's loop, ``_t_*`` in the Trio thread.

Who is who in the room (``ParticipantJoined.kind``), in this order:

1. The participant attribute ``curb.role``: ``caller``, ``app`` or ``transfer_target``
   (a host dialing a transfer target sets it, e.g. ``participant_attributes`` of
   ``CreateSIPParticipant``). ``caller`` on a SIP participant is ``sip``.
2. A participant of kind AGENT is ``agent``.
3. A SIP participant is ``sip`` (a phone caller) if no caller is in the room yet, else
   ``transfer_target`` (the host dialed someone into a call already in progress).
4. A STANDARD participant is ``caller`` if no caller is in the room yet, else ``app``.

Ingress, egress and other kinds are not part of the conversation and are not reported.
The agent hears only the caller's (``caller`` or ``sip``) audio.
"""

from ._hearing import AUDIO_IN_FRAME_MS as AUDIO_IN_FRAME_MS
from ._hearing import AUDIO_IN_RATE_HZ as AUDIO_IN_RATE_HZ
from ._loop import CALL_TIMEOUT_S as CALL_TIMEOUT_S
from ._loop import THREAD_EXIT_TIMEOUT_S as THREAD_EXIT_TIMEOUT_S
from ._requests import MAX_REQUEST_BYTES as MAX_REQUEST_BYTES
from ._requests import REFUSAL_RPC_CODE as REFUSAL_RPC_CODE
from ._requests import REQUEST_WAIT_S as REQUEST_WAIT_S
from ._requests import REQUESTS_CANCEL_TIMEOUT_S as REQUESTS_CANCEL_TIMEOUT_S
from ._requests import RPC_METHODS as RPC_METHODS
from ._room import CHAT_TOPIC as CHAT_TOPIC
from ._room import HANG_UP_TIMEOUT_S as HANG_UP_TIMEOUT_S
from ._room import JOIN_TIMEOUT_S as JOIN_TIMEOUT_S
from ._room import LEAVE_TIMEOUT_S as LEAVE_TIMEOUT_S
from ._room import MESSAGE_TOPIC as MESSAGE_TOPIC
from ._room import RECONNECT_LIMIT_S as RECONNECT_LIMIT_S
from ._roster import ROLE_ATTRIBUTE as ROLE_ATTRIBUTE
from ._roster import SIP_STATUS_ATTRIBUTE as SIP_STATUS_ATTRIBUTE
from ._roster import Kind as Kind
from ._server_api import admin_token as admin_token
from ._server_api import worker_token as worker_token
from ._session import MAX_AUDIO_BACKLOG_FRAMES as MAX_AUDIO_BACKLOG_FRAMES
from ._session import SCHEMES as SCHEMES
from ._session import LiveKitSession as LiveKitSession
from ._session import LiveKitTransport as LiveKitTransport
from ._voice import AUDIO_OUT_FRAME_MS as AUDIO_OUT_FRAME_MS
from ._voice import AUDIO_OUT_QUEUE_MS as AUDIO_OUT_QUEUE_MS
from ._voice import AUDIO_OUT_RATE_HZ as AUDIO_OUT_RATE_HZ
from ._voice import RESAMPLER_FLUSH_IDLE_S as RESAMPLER_FLUSH_IDLE_S

__all__ = [
    "AUDIO_IN_FRAME_MS",
    "AUDIO_IN_RATE_HZ",
    "AUDIO_OUT_FRAME_MS",
    "AUDIO_OUT_QUEUE_MS",
    "AUDIO_OUT_RATE_HZ",
    "CALL_TIMEOUT_S",
    "CHAT_TOPIC",
    "HANG_UP_TIMEOUT_S",
    "JOIN_TIMEOUT_S",
    "LEAVE_TIMEOUT_S",
    "MAX_AUDIO_BACKLOG_FRAMES",
    "MAX_REQUEST_BYTES",
    "MESSAGE_TOPIC",
    "RECONNECT_LIMIT_S",
    "REFUSAL_RPC_CODE",
    "REQUESTS_CANCEL_TIMEOUT_S",
    "REQUEST_WAIT_S",
    "RESAMPLER_FLUSH_IDLE_S",
    "ROLE_ATTRIBUTE",
    "RPC_METHODS",
    "SCHEMES",
    "SIP_STATUS_ATTRIBUTE",
    "THREAD_EXIT_TIMEOUT_S",
    "Kind",
    "LiveKitSession",
    "LiveKitTransport",
    "admin_token",
    "worker_token",
]
