"""``runner.testing``: its checks pass on what happened and fail, saying why, on what did not."""

from __future__ import annotations

import wave
from pathlib import Path

import pytest

import runner.testing as testing
from runner.agent import STT, Agent, Context
from runner.providers.hibari import HibariTTS
from runner.testing import ScriptedModel, call, open_agent_test
from runner.voice.audio import resample_s16le

from . import agents


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


def forecaster() -> Agent:
    agent = Agent("forecast", instructions="We open at noon.", stt=STT(provider="whisper"))

    @agent.tool
    def weather(ctx: Context, city: str) -> str:
        """The weather forecast for a city."""
        return f"Sunny in {city}."

    return agent


async def test_a_spoken_turn_is_heard_through_the_calls_own_hearing(tmp_path: Path) -> None:
    async with open_agent_test(forecaster()) as test:
        # Text rendered by the embedded voice, heard by the agent's recognizer.
        spoken = await test.speak("What is the weather in Lisbon?")
        spoken.heard("weather", "lisbon").called("weather", city="Lisbon")
        spoken.said("Sunny in Lisbon")
        assert spoken.result.heard_seconds is not None and 1.0 < spoken.result.heard_seconds < 4.0
        # A recording: a WAV file as an author has one (stereo, 44.1 kHz), fed as a microphone's frames.
        pcm = b"".join([piece async for piece in HibariTTS().synthesize("When do you open?")])
        mono = resample_s16le(pcm, 24_000, 44_100)
        stereo = b"".join(mono[i : i + 2] * 2 for i in range(0, len(mono), 2))
        recording = tmp_path / "open.wav"
        with wave.open(str(recording), "wb") as w:
            w.setnchannels(2)
            w.setsampwidth(2)
            w.setframerate(44_100)
            w.writeframes(stereo)
        heard = await test.say_audio(recording)
        heard.heard("when do you open").called_nothing().said("We open at noon.")
        # The typed turn and the spoken one are told apart.
        typed = await test.say("When do you open?")
        assert typed.transcript is None
        with pytest.raises(AssertionError, match="the turn was typed, not spoken"):
            typed.heard("open")
        with pytest.raises(AssertionError, match="the agent did not hear 'closed': it heard"):
            heard.heard("closed")


async def test_audio_with_no_speech_is_no_turn_and_an_agent_without_ears_is_refused() -> None:
    async with open_agent_test(forecaster()) as test:
        with pytest.raises(AssertionError, match="the audio gave no turn"):
            await test.say_audio(bytes(16_000 * 2), sample_rate_hz=16_000)
        # The call goes on.
        (await test.say("When do you open?")).said("noon")
    async with open_agent_test(shop()) as test:
        with pytest.raises(ValueError, match="agent 'shop' has no ears"):
            await test.speak("Any roadsters?")


def test_the_public_names_are_exported_once() -> None:
    assert sorted(testing.__all__) == ["AgentTest", "ScriptedModel", "TurnCheck", "call", "open_agent_test"]


async def test_keys_pressed_reach_the_agents_handlers_and_what_they_say_is_the_turn() -> None:
    async with open_agent_test(agents.keypad) as test:
        assert await test.press("12") == []
        (turn,) = await test.press("34#")
        turn.said("That PIN is right.")
        (wrong,) = await test.press("9#")
        wrong.said("1 keys is not your PIN.")
        records = await test.records()
    keys = [r["payload"]["digit"] for r in records if r.get("name") == "curb.dtmf"]
    assert keys == list("1234#9#")
