"""The agent platform: conversations with an agent, beyond one call's turns.

It owns conversations and their stored history, memory (summaries and compaction),
knowledge, relations, moods, usage and credits, and the ephemeral keys people reach it
with; it runs a conversation's turns through the call's
:class:`~runner.agent._runtime.AgentRuntime`. It knows no socket and no frame: what a
conversation reports goes to its :class:`Participant`\\s as :mod:`events <._events>`, and a
transport (the agent WebSocket, ``runner.transports.websocket``) turns them into its own
frames. It never imports a transport.

Where each part lives: ``_service`` (:class:`Platform`: keys, conversations, credits, the
turns' nursery), ``_conversation`` (:class:`Conversation`: one conversation's people and
turns), ``_events`` (what a conversation reports) and ``_rules`` (ids, moods, summaries,
what a turn costs).
"""

from ._conversation import Conversation as Conversation
from ._conversation import ConversationClosed as ConversationClosed
from ._conversation import Participant as Participant
from ._conversation import Recording as Recording
from ._conversation import StreamedWords as StreamedWords
from ._conversation import TurnRequest as TurnRequest
from ._conversation import transcribe as transcribe
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
