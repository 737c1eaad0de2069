"""The agent platform: conversations with an agent, beyond one call's turns.

It owns conversations and their stored history, memory (summaries and compaction),
knowledge, relations, moods, usage and credits, and the ephemeral keys people reach it
with; it runs a conversation's turns through the call's
:class:`~runner.agent.AgentRuntime`. It knows no socket and no frame: what a
conversation reports goes to its :class:`Participant`\\s as :mod:`events <._events>`, and a
transport (the agent WebSocket, ``runner.transports.websocket``) turns them into its own
frames. It never imports a transport.

Where each part lives: ``_service`` (:class:`Platform`: keys, conversations, credits, the
turns' nursery), ``_conversation`` (:class:`Conversation`: one conversation's people and
turns), ``_events`` (what a conversation reports) and ``_rules`` (ids, moods, summaries,
what a turn costs).
"""

from ._conversation import Conversation as Conversation
from ._events import Charged as Charged
from ._events import Compacted as Compacted
from ._events import ConversationEvent as ConversationEvent
from ._events import Joined as Joined
from ._events import KnowledgeSearched as KnowledgeSearched
from ._events import NoVoice as NoVoice
from ._events import Refused as Refused
from ._events import TurnClosed as TurnClosed
from ._events import TurnFailed as TurnFailed
from ._rules import HEARING_RATE_HZ as HEARING_RATE_HZ
from ._rules import agent_id_of as agent_id_of
from ._rules import mood_of as mood_of
from ._rules import summarise as summarise
from ._service import MintedKey as MintedKey
from ._service import Platform as Platform
from ._service import TokenProblem as TokenProblem
from ._service import TurnRateExceeded as TurnRateExceeded
from ._service import TurnRunning as TurnRunning
from ._service import token_problem as token_problem
from ._service import token_spent as token_spent
from ._tools import APP_TOOL_RESULT_MAX_BYTES as APP_TOOL_RESULT_MAX_BYTES
from ._turn import ConversationClosed as ConversationClosed
from ._turn import Participant as Participant
from ._turn import TurnRequest as TurnRequest

__all__ = [
    "APP_TOOL_RESULT_MAX_BYTES",
    "HEARING_RATE_HZ",
    "Charged",
    "Compacted",
    "Conversation",
    "ConversationClosed",
    "ConversationEvent",
    "Joined",
    "KnowledgeSearched",
    "MintedKey",
    "NoVoice",
    "Participant",
    "Platform",
    "Refused",
    "TokenProblem",
    "TurnClosed",
    "TurnFailed",
    "TurnRateExceeded",
    "TurnRequest",
    "TurnRunning",
    "agent_id_of",
    "mood_of",
    "summarise",
    "token_problem",
    "token_spent",
]
