"""``runner.testing``: its checks pass on what happened and fail, saying why, on what did not."""

from __future__ import annotations

import pytest

import runner.testing as testing
from runner.agent import Agent, Context
from runner.testing import ScriptedModel, call, open_agent_test


def shop() -> Agent:
    agent = Agent("shop", instructions="We sell bicycles.", greeting="Hello!")

    @agent.tool
    def stock(ctx: Context, model: str, count: int = 1) -> str:
        """How many bicycles of a model are in stock."""
        ctx.send.to_host("stock.asked", {"model": model})
        return f"{count} {model} in stock"

    return agent


async def test_the_checks_pass_on_what_the_turn_did() -> None:
    model = ScriptedModel([call("stock", model="roadster", count=2)], "We have two roadsters.")
    async with open_agent_test(shop(), model=model) as test:
        assert test.greeting is not None and test.greeting.text == "Hello!"
        turn = await test.say("Any roadsters?")
        record = turn.called("stock", model="roadster")
        assert (record.arguments, record.result) == ({"model": "roadster", "count": 2}, "2 roadster in stock")
        assert turn.said("two", "ROADSTERS") is turn
        assert await test.to_host() == [("stock.asked", {"model": "roadster"})]
        # The model read the tool's result in its second call.
        (tool_message,) = [m for m in model.requests[1][0] if m.role == "tool"]
        assert "2 roadster in stock" in tool_message.content


async def test_a_check_that_does_not_hold_fails_saying_why() -> None:
    model = ScriptedModel([call("stock", model="roadster")], "Yes.", "Nothing else.")
    async with open_agent_test(shop(), model=model) as test:
        turn = await test.say("Any roadsters?")
        with pytest.raises(AssertionError, match=r"the reply does not say 'no'"):
            turn.said("no")
        with pytest.raises(
            AssertionError, match=r"no call of stock\(\{'model': 'tandem'\}\); the calls were: stock"
        ):
            turn.called("stock", model="tandem")
        with pytest.raises(AssertionError, match=r"the turn called \['stock'\]"):
            turn.called_nothing()
        with pytest.raises(AssertionError, match="no failed call of stock"):
            turn.refused("stock")
        (await test.say("Thanks")).called_nothing().said("nothing else")


async def test_bad_arguments_from_a_scripted_model_are_a_refused_call() -> None:
    model = ScriptedModel([call("stock", model="roadster", count="many")], "Sorry.")
    async with open_agent_test(shop(), model=model) as test:
        refused = (await test.say("Any roadsters?")).refused("stock")
        assert refused.error is not None and refused.error.startswith("invalid arguments: count: ")
        assert await test.to_host() == []


async def test_a_failed_check_in_the_block_is_raised_as_itself() -> None:
    with pytest.raises(AssertionError, match="the reply does not say"):
        async with open_agent_test(shop()) as test:
            (await test.say("hello")).said("something it never says")


def test_the_public_names_are_exported_once() -> None:
    assert sorted(testing.__all__) == ["AgentTest", "ScriptedModel", "TurnCheck", "call", "open_agent_test"]
