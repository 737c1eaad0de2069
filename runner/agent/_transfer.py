"""Transfers over host messages: the Python counterparts of ``useTransferCall`` and ``<TransferCallTool>``.

The agent asks its host with ``ask_host("curb.transfer", {target, reason})``; the ask is a
``host`` record with ``expectsReply`` on the events stream. The host answers with a
HostMessage whose ``inReplyTo`` is the record's id and whose payload is
``{"accepted": true}`` (it will dial the target into the room) or
``{"accepted": false, "reason": "..."}``. While the target is in the room the agent neither
listens nor speaks; when it leaves and the caller is still there the agent takes the call
back.
"""

from __future__ import annotations

from typing import Literal

import attrs

from ._authoring import Predicate, Tool, make_tool
from ._context import Context, HostTimeoutError, HostUnavailableError

TRANSFER_KEY = "curb.transfer"


@attrs.frozen(kw_only=True)
class TransferOutcome:
    """``transferred`` (the host dials the target), ``declined``, or ``failed`` with a code."""

    outcome: Literal["transferred", "declined", "failed"]
    code: str | None = None
    reason: str | None = None


async def transfer_call(
    ctx: Context, target: str, *, reason: str | None = None, timeout: float = 10.0
) -> TransferOutcome:
    """Ask the host to transfer this call to ``target``.

    No answer in time (and any runner with no host-to-agent path) gives ``failed`` with
    the code ``transfer_no_reply``; no host at all, ``failed`` with ``host_unavailable``.
    """
    payload = {"target": target, **({"reason": reason} if reason else {})}
    try:
        answer = await ctx.ask_host(TRANSFER_KEY, payload, timeout=timeout)
    except HostTimeoutError:
        return TransferOutcome(outcome="failed", code="transfer_no_reply")
    except HostUnavailableError:
        return TransferOutcome(outcome="failed", code="host_unavailable")
    if isinstance(answer, dict) and answer.get("accepted") is True:
        return TransferOutcome(outcome="transferred")
    declined = answer.get("reason") if isinstance(answer, dict) else None
    return TransferOutcome(outcome="declined", reason=declined if isinstance(declined, str) else None)


def transfer_call_tool(
    *,
    targets: dict[str, str],
    name: str = "transfer_call",
    description: str | None = None,
    when: Predicate | None = None,
    timeout: float = 10.0,
) -> Tool:
    """A tool the model calls to transfer the caller to one of ``targets`` (name -> who the host dials)."""
    names = ", ".join(sorted(targets))

    async def transfer(ctx: Context, department: str) -> str:
        if department not in targets:
            return f"There is no {department!r} to transfer to; choose one of: {names}."
        result = await transfer_call(ctx, targets[department], reason=department, timeout=timeout)
        if result.outcome == "transferred":
            return f"Transferring the caller to {department} now."
        if result.outcome == "declined":
            return (
                f"The transfer to {department} was declined{': ' + result.reason if result.reason else ''}."
            )
        return f"The transfer to {department} failed ({result.code})."

    tool = make_tool(
        transfer,
        name=name,
        description=description or f"Transfer the caller to a person: one of {names}.",
        when=when,
        filler="One moment, I will connect you.",
    )
    parameters = {
        "type": "object",
        "properties": {"department": {"enum": sorted(targets)}},
        "required": ["department"],
    }
    return attrs.evolve(tool, parameters=parameters)
