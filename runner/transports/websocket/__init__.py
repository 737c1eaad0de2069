"""The agent WebSocket (subprotocol ``ino.v2``): one socket per connection, one call per conversation.

A socket authenticates with an ephemeral token, then joins the conversation its URL names.
That conversation is a call of the runner: the first socket starts it through
:meth:`Runner.start_call` with an ``ino://<conversation id>`` URL, which
:class:`WebSocketTransport` joins by handing out the conversation's :class:`InoCall` (the
call's transport session); more sockets on the same conversation attach to the same call,
and the call ends when its last socket closes. So a socket counts against the runner's
capacity, shows in ``GET /v1/runner``, has its turns journaled under the conversation id,
takes host messages and live settings, and is drained like any call.

:class:`Connection` is the protocol driver of one socket: auth, the nine verbs, recordings,
seq numbering and the close codes. The conversation itself (its turns, stored history,
memory, knowledge, relations, moods and credits) is the platform's
(:mod:`runner.platform`); what it reports becomes frames in ``_frames``, the one place the
two meet. :class:`AgentSocketService` ties the sockets to the runner and the platform, and
maps the public REST routes onto the platform.

Where each part lives: ``_call`` (the transport and :class:`InoCall`, the session a
conversation's sockets share), ``_connection`` (:class:`Connection`), ``_frames`` (events
to frames: :data:`EVENT_FRAMES` names the turn events written as they are), ``_service`` (:class:`AgentSocketService`) and ``_common`` (limits, close
reasons, setup).
"""

from ._call import InoCall, WebSocketTransport
from ._common import AgentSocketSetup, SocketIO
from ._connection import Connection
from ._frames import EVENT_FRAMES
from ._service import AgentSocketService

__all__ = [
    "EVENT_FRAMES",
    "AgentSocketService",
    "AgentSocketSetup",
    "Connection",
    "InoCall",
    "SocketIO",
    "WebSocketTransport",
]
