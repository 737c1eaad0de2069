"""Writing agents: the Python counterpart of the seed's ``<Agent>``, ``<Skill>``, ``<Tool>``,
``useMessage``, ``useSend``, ``useSession`` and ``useVariant``.

    from runner.agent import Agent, Context, LLM, TTS

    agent = Agent("concierge", instructions="You help guests of Hotel Lumen.",
                  tts=TTS(provider="espeak", voice="en"), greeting="Welcome to Hotel Lumen!")

    @agent.tool
    def room_service(ctx: Context, dish: str) -> str:
        \"\"\"Order a dish to the guest's room.\"\"\"
        ctx.send.to_client("order-placed", {"dish": dish})
        return f"{dish} is on its way"

The runner's side of an agent is here too: :class:`AgentRuntime` (an agent in one call) and what
the CLI, the console, the platform and the transports use to make and warm one.
"""

from ._authoring import Agent as Agent
from ._authoring import AppTool as AppTool
from ._authoring import MessageHandler as MessageHandler
from ._authoring import Offer as Offer
from ._authoring import Skill as Skill
from ._authoring import Tool as Tool
from ._build import WarmUpFailed as WarmUpFailed
from ._build import build_tts as build_tts
from ._build import warm_up as warm_up
from ._build import without_voice as without_voice
from ._context import Context as Context
from ._context import HostTimeoutError as HostTimeoutError
from ._context import HostUnavailableError as HostUnavailableError
from ._experiments import assign_variant as assign_variant
from ._experiments import choose_experiments as choose_experiments
from ._loader import DEFAULT_AGENT as DEFAULT_AGENT
from ._loader import load_agent as load_agent
from ._runtime import AgentRuntime as AgentRuntime
from ._runtime import TurnBusy as TurnBusy
from ._runtime import conversation_factory as conversation_factory
from ._settings import LLM as LLM
from ._settings import STT as STT
from ._settings import TTS as TTS
from ._settings import AuthoringError as AuthoringError
from ._tools import ConfirmationNotWaiting as ConfirmationNotWaiting
from ._tools import PendingConfirmation as PendingConfirmation
from ._tools import PlatformSupport as PlatformSupport
from ._tools import PlatformTool as PlatformTool
from ._transfer import TransferOutcome as TransferOutcome
from ._transfer import transfer_call as transfer_call
from ._transfer import transfer_call_tool as transfer_call_tool

__all__ = [
    "DEFAULT_AGENT",
    "LLM",
    "STT",
    "TTS",
    "Agent",
    "AgentRuntime",
    "AppTool",
    "AuthoringError",
    "ConfirmationNotWaiting",
    "Context",
    "HostTimeoutError",
    "HostUnavailableError",
    "MessageHandler",
    "Offer",
    "PendingConfirmation",
    "PlatformSupport",
    "PlatformTool",
    "Skill",
    "Tool",
    "TransferOutcome",
    "TurnBusy",
    "WarmUpFailed",
    "assign_variant",
    "build_tts",
    "choose_experiments",
    "conversation_factory",
    "load_agent",
    "transfer_call",
    "transfer_call_tool",
    "warm_up",
    "without_voice",
]
