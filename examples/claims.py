"""A claims line: messages with the app, a supervisor on the host, and transfers.

Run it with ``runner serve examples.claims``. It shows keyed messages with schemas from
both sides, ``ask_host`` with its two failures, and the transfer tool.
"""

from __future__ import annotations

import attrs

from runner.agent import (
    LLM,
    TTS,
    Agent,
    Context,
    HostTimeoutError,
    HostUnavailableError,
    transfer_call_tool,
)


@attrs.frozen
class Claim:
    claim_id: str
    amount: float = 0.0


agent = Agent(
    "claims",
    instructions=(
        "You take insurance claims for Northwind Mutual. "
        "A claim is settled within ten working days once its photos arrive."
    ),
    llm=LLM(provider="local", model="local"),
    tts=TTS(provider="espeak", voice="en-us"),
    greeting="Northwind Mutual claims, how can I help?",
    adjustable={"client": ["tts.voice"], "host": ["tts.voice", "llm"]},
    state=lambda: {"claims": [], "notices": []},
)
agent.tools.append(
    transfer_call_tool(targets={"billing": "sip:billing@northwind", "fraud": "sip:fraud@northwind"})
)


@agent.on_message("claim-submitted", sender="client", schema=Claim)
def claim_submitted(ctx: Context, claim: Claim) -> dict[str, str]:
    ctx.state["claims"].append(claim.claim_id)
    ctx.send.to_client("show-status", {"status": "received", "claimId": claim.claim_id})
    return {"received": claim.claim_id}


@agent.on_message("ops.notice", sender="host")
def ops_notice(ctx: Context, payload: dict[str, object]) -> None:
    ctx.state["notices"].append(payload)


@agent.tool(when=lambda ctx: bool(ctx.state["claims"]))
async def ask_supervisor(ctx: Context, topic: str) -> str:
    """Ask a supervisor to approve a refund for the caller's claim."""
    ctx.send.to_client("show-status", {"status": "waiting-for-supervisor"})
    try:
        answer = await ctx.ask_host("human.requested", {"topic": topic}, timeout=10)
    except HostTimeoutError:
        return "The supervisor did not answer in time."
    except HostUnavailableError:
        return "No supervisor is connected to this call."
    return "Approved." if answer.get("disposition") == "allowed" else "Declined."
