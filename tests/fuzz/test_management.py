"""Generated requests against every route of a real runner's management API (issue 14)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ..runner_process import TOKEN
from ..websocket.ino_client import BackgroundRunner
from ._http import LIVE, ROUTES, Management, check_healthy, check_request, requests

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def management(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Management]:
    runner = BackgroundRunner(
        tmp_path_factory.mktemp("fuzz") / "journal.db",
        "--max-sessions",
        "64",
        "--drain-grace-ms",
        "100",
        agent="tests.agents:messenger",
    )
    try:
        address = runner.addresses.management
        started = httpx.post(
            f"http://{address}/v1/sessions",
            headers={"Authorization": f"Bearer {TOKEN}"},
            json={"sessionId": LIVE, "realtimeUrl": "loopback:", "realtimeToken": "t"},
            timeout=20,
        )
        assert started.status_code == 202, started.text
        yield Management(address)
    finally:
        runner.stop()
    assert not any("Traceback" in line for line in runner.stderr), "\n".join(runner.stderr[-60:])


@pytest.mark.parametrize("route", sorted(ROUTES))
@settings(settings.get_profile("fuzz-ci"))
@given(data=st.data())
async def test_every_route_answers_a_documented_code(
    management: Management, route: str, data: st.DataObject
) -> None:
    await check_request(management, data.draw(requests(route), label="request"))


async def test_the_runner_is_healthy_afterwards(management: Management) -> None:
    await check_healthy(management, 0)
