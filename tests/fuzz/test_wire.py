"""Generated attacks on the HTTP and WebSocket layer of a real runner (issue 27)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ._runner import fuzzed_runner
from ._socket import RUNNER_AGENT, RUNNER_ARGS
from ._wire import ATTACKS, Wire, attacks, check_attack, check_healthy

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wire(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Wire]:
    with fuzzed_runner(tmp_path_factory, RUNNER_AGENT, *RUNNER_ARGS) as runner:
        yield Wire(runner.addresses)


@pytest.mark.parametrize("attack", ATTACKS)
@settings(settings.get_profile("fuzz-ci"))
@given(data=st.data())
async def test_every_attack_is_refused_or_answered_and_the_runner_holds(
    wire: Wire, attack: str, data: st.DataObject
) -> None:
    await check_attack(wire, data.draw(attacks(attack), label="attack"))


async def test_the_runner_is_healthy_after_the_attacks(wire: Wire) -> None:
    await check_healthy(wire)
