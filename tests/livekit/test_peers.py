"""The bench's peers still run: one spoken turn with each of ``python -m bench.peers``' agents.

bench/peers.py compares the runner with livekit-agents and Pipecat through thin plugins of its
own (bench/peer_plugins/), in venvs built on first use (bench/peers_venv.py; .ci/run builds them
before the tests). A new release of a peer, or a change to the runner's models, can break a
plugin without any other test noticing; this one places one call per agent through the bench's
own code, in the test's LiveKit namespace: the caller says its sentence once, the agent must
answer it, and what the agent heard (the runner's journal; a peer's recognizer plugin) must be
the caller's words, which is where the bench reads its word error rate.
"""

from __future__ import annotations

from contextlib import AsyncExitStack

import pytest
import trio
from lk_harness import LiveKitEnv

from bench import peers, peers_venv
from bench.livekit import sentence_file

pytestmark = [pytest.mark.livekit, pytest.mark.slow]


@pytest.mark.parametrize("agent", peers.AGENTS)
async def test_one_turn_with_each_agent(livekit: LiveKitEnv, agent: str) -> None:
    if agent in peers_venv.PEERS:
        # Built by .ci/run (python -m bench.peers_venv); here only checked, or built if missing.
        await trio.to_thread.run_sync(peers_venv.ensure, agent)
    sentence = await sentence_file(livekit.workdir, lead_s=peers.LEAD_S)
    side = peers.SIDES[agent](livekit, livekit.workdir, None)
    async with AsyncExitStack() as stack:
        await side.start(stack)
        # A second call only if the first failed: on a machine shared with other suites, a
        # reply can miss its 30 s (one_call prints why the first one failed).
        for _ in range(2):
            turns = peers.Turns()
            await peers.one_call(side, sentence, 1, turns)
            await side.settle()
            if not turns.failures and turns.latencies:
                break
    assert turns.failures == []
    assert len(turns.latencies) == 1, "the agent answered the turn"
    [(room, said)] = turns.calls
    heard = " ".join(side.heard(room)).lower()
    assert said == 1
    assert "my name is" in heard, f"{agent} heard {heard!r}"
