"""Generated requests against every route of a real runner's management API (issue 14)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from ._http import (
    ROUTES,
    RUNNER_AGENT,
    RUNNER_ARGS,
    Management,
    check_healthy,
    check_request,
    prepare,
    requests,
)
from ._runner import fuzzed_runner

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def management(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Management]:
    with fuzzed_runner(tmp_path_factory, RUNNER_AGENT, *RUNNER_ARGS) as runner:
        target = Management(runner.addresses.management)
        trio.run(prepare, target)
        yield target


@pytest.mark.parametrize("route", sorted(ROUTES))
@settings(settings.get_profile("fuzz-ci"))
@given(data=st.data())
async def test_every_route_answers_a_documented_code(
    management: Management, route: str, data: st.DataObject
) -> None:
    await check_request(management, data.draw(requests(route), label="request"))


async def test_the_runner_is_healthy_afterwards(management: Management) -> None:
    await check_healthy(management, 0)
