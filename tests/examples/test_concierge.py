"""The built-in concierge, tested as its author would: with ``runner.testing``."""

from __future__ import annotations

import pytest

from examples.concierge import agent
from runner.errors import NoHandler
from runner.testing import ScriptedModel, call, open_agent_test


async def test_it_greets_and_tells_the_weather() -> None:
    async with open_agent_test(agent, session_id="guest-1") as test:
        assert test.greeting is not None
        test.greeting.said("Hotel Lumen").called_nothing()
        turn = await test.say("What is the weather in Lisbon?")
        turn.called("weather", city="Lisbon")
        turn.said("sunny", "24 degrees")


async def test_room_service_tells_the_app_and_the_host() -> None:
    async with open_agent_test(agent) as test:
        turn = await test.say("Room service: soup please")
        order = turn.called("room_service")
        dish = order.arguments["dish"]
        assert test.to_client == [("order-placed", {"dish": dish, "count": 1})]
        assert await test.to_host() == [("concierge.order", {"dish": dish})]
        assert test.runtime.ctx.state["orders"] == [dish]


async def test_a_verified_member_may_upgrade_and_no_one_else() -> None:
    model = ScriptedModel(
        [call("upgrade_room", room="12")],
        "Upgrades are for members.",
        [call("upgrade_room", room="12")],
        "Room 12 is now a suite.",
    )
    async with open_agent_test(agent, model=model) as test:
        # Not verified: the members' skill is not mounted, so its tool is not offered or run.
        turn = await test.say("Upgrade room 12")
        refused = turn.refused("upgrade_room")
        turn.said("for members")
        assert refused.error == "no tool 'upgrade_room' is offered now"
        assert "upgrade_room" not in [t.name for t in model.requests[0][1]]
        assert await test.message("verify", {"member": True}) == {"verified": True}
        turn = await test.say("Upgrade room 12 please")
        turn.called("upgrade_room", room="12")
        turn.said("suite")
        # What the model was offered on that turn's first call includes the upgrade.
        assert "upgrade_room" in [t.name for t in model.requests[-2][1]]


async def test_a_key_nobody_handles_is_refused() -> None:
    async with open_agent_test(agent) as test:
        with pytest.raises(NoHandler):
            await test.message("checkout", {})
