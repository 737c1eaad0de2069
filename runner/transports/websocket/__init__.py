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
seq numbering and the close codes. :class:`InoCall` runs the conversation's turns through
the call's :class:`~runner.agent._runtime.AgentRuntime` and turns what they report into
frames for the socket that asked. :class:`AgentSocketService` ties both to the runner, the
store of tokens and conversations, and the public REST routes.

Where each part lives: ``_call`` (the transport, :class:`InoCall` and its turns),
``_connection`` (:class:`Connection`), ``_service`` (:class:`AgentSocketService`) and
``_common`` (limits, close reasons, moods, usage rows, setup).
"""

from ._call import InoCall, WebSocketTransport
from ._common import AgentSocketSetup, SocketIO, agent_id_of, mood_of, summarise
from ._connection import Connection
from ._service import AgentSocketService

__all__ = [
    "AgentSocketService",
    "AgentSocketSetup",
    "Connection",
    "InoCall",
    "SocketIO",
    "WebSocketTransport",
    "agent_id_of",
    "mood_of",
    "summarise",
]
