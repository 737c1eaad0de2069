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
"""

from ._authoring import Agent as Agent
from ._authoring import AppTool as AppTool
from ._authoring import MessageHandler as MessageHandler
from ._authoring import Offer as Offer
from ._authoring import Skill as Skill
from ._authoring import Tool as Tool
from ._context import Context as Context
from ._context import HostTimeoutError as HostTimeoutError
from ._context import HostUnavailableError as HostUnavailableError
from ._experiments import assign_variant as assign_variant
from ._loader import load_agent as load_agent
from ._settings import LLM as LLM
from ._settings import STT as STT
from ._settings import TTS as TTS
from ._settings import AuthoringError as AuthoringError
from ._transfer import TransferOutcome as TransferOutcome
from ._transfer import transfer_call as transfer_call
from ._transfer import transfer_call_tool as transfer_call_tool
