"""Generated requests against the public REST routes of a real runner (keys and conversations)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from ._public import ROUTES, Public, check_healthy, check_request, prepare, requests
from ._runner import fuzzed_runner
from ._socket import RUNNER_AGENT, RUNNER_ARGS

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def public(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Public]:
    with fuzzed_runner(tmp_path_factory, RUNNER_AGENT, *RUNNER_ARGS) as runner:
        target = Public(runner.addresses, runner.journal)
        trio.run(prepare, target)
        yield target


@pytest.mark.parametrize("route", sorted(ROUTES))
@settings(settings.get_profile("fuzz-ci"))
@given(data=st.data())
async def test_every_public_route_answers_a_documented_code(
    public: Public, route: str, data: st.DataObject
) -> None:
    await check_request(public, data.draw(requests(route), label="request"))


async def test_the_public_listener_is_healthy_afterwards(public: Public) -> None:
    await check_healthy(public)
