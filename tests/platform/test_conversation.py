"""A conversation of the agent platform in process: a real store on disk, the local model and
espeak-ng, and a participant that records what it is told (the place of a socket)."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import trio

from journal import open_agent_store
from runner.agent import LLM, TTS, Agent, AgentRuntime, choose_experiments
from runner.calls import CallContext
from runner.platform import Conversation, ConversationEvent, Platform, TurnClosed, TurnRequest
from runner.transports.websocket import InoCall
from runner.voice.events import AudioData, AudioEnd

AGENT = Agent(
    "platform-test",
    instructions="Breakfast is served from seven to eleven in the garden room.",
    llm=LLM(provider="local", model="local"),
    tts=TTS(provider="espeak", voice="en-us+f2"),
)


@attrs.define(eq=False)
class RecordingParticipant:
    """Keeps every event, in order; ``on_event`` runs as each one is delivered."""

    end_user_id: str = "eu_test"
    token_id: str = "tok_test"
    app_tools: tuple[str, ...] = ()
    events: list[ConversationEvent] = attrs.Factory(list)
    on_event: Callable[[ConversationEvent], None] = lambda event: None
    closed: trio.Event = attrs.Factory(trio.Event)

    def deliver(self, event: ConversationEvent) -> None:
        self.events.append(event)
        self.on_event(event)
        if isinstance(event, TurnClosed):
            self.closed.set()

    def turn_over(self) -> None:
        pass


@asynccontextmanager
async def open_conversation(tmp_path: Path) -> AsyncIterator[tuple[Conversation, AgentRuntime, str]]:
    call = CallContext(
        session_id="conv-1",
        direction="inbound",
        client={},
        experiments=choose_experiments(AGENT, "conv-1", {}, None),
    )
    runtime = AgentRuntime(AGENT, call, None, host_connected=False)
    async with open_agent_store(tmp_path / "store.db") as store, trio.open_nursery() as nursery:
        platform = Platform(store, AGENT)
        # The person and their conversation, as the ephemeral-key routes make them.
        minted = await platform.mint_key(end_user_id="eu_test", ttl_seconds=600, credit_limit=None)
        row = await platform.create_conversation(minted.row)
        await nursery.start(platform.serve)
        with platform.open_conversation(row.conversation_id) as conversation:
            # The call's session is the agent WebSocket's: the agent's voice reaches the person through it.
            session = InoCall(conversation, lambda: False)
            nursery.start_soon(runtime.run, session, session.events)
            yield conversation, runtime, minted.row.token_id
        nursery.cancel_scope.cancel()


async def test_a_cut_audio_window_ends_counting_only_the_audio_handed_over(tmp_path: Path) -> None:
    # The person cancels the moment the first piece of audio reaches them (as a socket's
    # cancel can land while the engine hands the next piece to the call's session): the
    # window's end counts what the participant was given, and what the turn is charged for.
    async with open_conversation(tmp_path) as (conversation, runtime, token_id):
        person = RecordingParticipant(token_id=token_id)

        def cancel_on_first_audio(event: ConversationEvent) -> None:
            state = conversation.owned_turn(person)
            if isinstance(event, AudioData) and state is not None:
                conversation.cancel_turn(state, "cancel")

        person.on_event = cancel_on_first_audio
        with trio.fail_after(20):
            await conversation.join(person, runtime)
            assert (
                conversation.request_turn(person, TurnRequest(text="When is breakfast served?")) == "started"
            )
            await person.closed.wait()
            usage = await conversation.platform.store.usage_of(conversation.conversation_id)
    audio = [e for e in person.events if isinstance(e, AudioData)]
    ends = [e for e in person.events if isinstance(e, AudioEnd)]
    [closed] = [e for e in person.events if isinstance(e, TurnClosed)]
    assert closed.result.interrupted and closed.reason == "cancel"
    assert len(audio) == 1 and len(ends) == 1
    assert ends[0].bytes == len(audio[0].pcm) > 0
    assert math.isclose(ends[0].audio_seconds, len(audio[0].pcm) / 2 / 22_050)
    # Charged for the speech the person got, no more.
    [speech] = [row for row in usage if row.kind == "speech"]
    assert speech.seconds == round(ends[0].audio_seconds, 3)
