"""Assigning a call to a variant of each experiment, as Curb does locally (dev, tests)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from ._authoring import Agent


def assign_variant(
    session_id: str,
    experiment: str,
    weights: Mapping[str, int],
    client_context: Mapping[str, str] | None = None,
    from_client: str | None = None,
) -> str:
    """The variant of ``experiment`` for this call.

    A ``from_client`` key in the client context whose value names a variant picks it.
    Otherwise the first 8 bytes of SHA-256(``<sessionId>:<experiment>``), read as a
    big-endian unsigned integer, modulo the sum of the weights, are walked down the
    variants sorted by name: the first whose weight is larger than what is left wins.
    """
    if from_client is not None and client_context:
        chosen = client_context.get(from_client)
        if chosen is not None and chosen in weights:
            return chosen
    total = sum(weights.values())
    if total <= 0:
        raise ValueError(f"experiment {experiment!r} has no positive weight")
    digest = hashlib.sha256(f"{session_id}:{experiment}".encode()).digest()
    left = int.from_bytes(digest[:8], "big") % total
    for name in sorted(weights):
        weight = weights[name]
        if weight > left:
            return name
        left -= weight
    raise AssertionError("unreachable: the weights sum to more than what is left")


def choose_experiments(
    agent: Agent, session_id: str, client: Mapping[str, str], sent: Mapping[str, str] | None
) -> dict[str, str]:
    """The call's variants: each one the host sent, as sent; the others by the seed's rule."""
    chosen = {
        name: assign_variant(session_id, name, weights, client, agent.from_client.get(name))
        for name, weights in agent.experiments.items()
        if name not in (sent or {})
    }
    return {**chosen, **dict(sent or {})}
