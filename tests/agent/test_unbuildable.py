"""A model the runner cannot build fails its turn with a code, never the call."""

from __future__ import annotations

from runner.agent import LLM, Agent

from .test_runtime import open_call


async def test_an_unbuildable_model_fails_the_turn_and_the_call_goes_on() -> None:
    agent = Agent("broken", instructions="You answer.", llm=LLM(provider="no-such-provider", model="m"))
    async with open_call(agent, None) as call:
        call.caller.say("hello")
        first = await call.next_result()
        call.caller.say("hello again")
        second = await call.next_result()
    for result in (first, second):
        assert result.interrupted and result.error_code == "unavailable"
        assert "no-such-provider" in (result.reason or "")
