"""Generated client frames against the ino.v2 agent socket of a real runner (issue 14)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from ._runner import fuzzed_runner
from ._socket import FRAMES, RUNNER_AGENT, RUNNER_ARGS, AgentSocket, check_frame, check_healthy, frames

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def agent_socket(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentSocket]:
    with fuzzed_runner(tmp_path_factory, RUNNER_AGENT, *RUNNER_ARGS) as runner:
        target = AgentSocket(runner.addresses)
        trio.run(target.mint)
        yield target


@pytest.mark.parametrize("verb", FRAMES)
@settings(settings.get_profile("fuzz-ci"))
@given(data=st.data())
async def test_every_frame_is_answered_with_a_documented_code(
    agent_socket: AgentSocket, verb: str, data: st.DataObject
) -> None:
    await check_frame(agent_socket, data.draw(frames(verb), label="frame"))


async def test_the_socket_is_healthy_afterwards(agent_socket: AgentSocket) -> None:
    await check_healthy(agent_socket)
