"""The voice pipeline on its own: a caller's audio in, their turns to its owner, through a real
recognizer (the embedded pocketsphinx) and detector, out to a loopback session."""

from __future__ import annotations

from typing import Any

import attrs
import trio

from runner.providers import Recognizer, Transcript
from runner.providers.espeak import EspeakTTS
from runner.providers.pocketsphinx import PocketsphinxSTT
from runner.providers.whisper import WhisperStream, WhisperSTT
from runner.transports.loopback import LoopbackSession
from runner.voice.audio import frames
from runner.voice.events import ReplyDelta, TurnFinished, TurnResult, TurnStarted, TurnTimings
from runner.voice.listener import Utterance
from runner.voice.pipeline import VoicePipeline
from runner.voice.preempt import PrefetchedReply

RATE = 22_050
# The voice the wheel's pocketsphinx model hears best (tests/providers/test_offline_speech.py).
CLEAR_VOICE = "en-us+f2"


@attrs.define(eq=False)
class Owner:
    """What the agent runtime is to the pipeline: it keeps the turns it is handed."""

    stt: Recognizer
    speaking: bool = False
    turns: list[str] = attrs.Factory(list)
    starts: int = 0
    took: trio.Event = attrs.Factory(trio.Event)
    early: list[str] = attrs.Factory(list)

    def recognizer(self) -> Recognizer:
        return self.stt

    def on_start_of_speech(self) -> bool:
        self.starts += 1
        return self.speaking

    def prefetch(self, text: str) -> PrefetchedReply | None:
        self.early.append(text)
        return None

    def on_user_turn(
        self, heard: Utterance, *, span: Any, ended_at: float, prefetched: PrefetchedReply | None
    ) -> None:
        self.turns.append(heard.text)
        self.took.set()


@attrs.define(eq=False)
class AtEveryPause:
    """The simplest endpointer: every pause ends the turn."""

    asked: list[int] = attrs.Factory(list)

    async def turn_over(self, pcm: bytes, sample_rate_hz: int) -> bool:
        self.asked.append(len(pcm))
        await trio.lowlevel.checkpoint()
        return True


class BatchCounted(PocketsphinxSTT):
    """The embedded recognizer, counting the whole utterances it is asked to decode."""

    def __init__(self) -> None:
        super().__init__()
        self.batch = 0

    async def transcribe(self, pcm: bytes, sample_rate_hz: int, *, prompt: str = "") -> Transcript:
        self.batch += 1
        return await super().transcribe(pcm, sample_rate_hz, prompt=prompt)


class StreamsCounted(WhisperSTT):
    """The embedded default recognizer, counting the streams opened on it."""

    def __init__(self) -> None:
        super().__init__()
        self.streams = 0

    def open_stream(self, sample_rate_hz: int) -> WhisperStream:
        self.streams += 1
        return super().open_stream(sample_rate_hz)


async def spoken(text: str, quiet_s: float) -> bytes:
    pcm = b"".join([chunk async for chunk in EspeakTTS(CLEAR_VOICE).synthesize(text)])
    return bytes(2 * int(RATE * 0.3)) + pcm + bytes(2 * int(RATE * quiet_s))


async def hear_all(pipeline: VoicePipeline, pcm: bytes) -> None:
    for frame in frames(pcm, RATE, 20):
        await pipeline.hear(frame, RATE)


async def test_an_endpointer_ends_the_turn_at_a_pause_the_silence_would_not() -> None:
    stt = PocketsphinxSTT()
    # Half a second of quiet: a pause (100 ms), far short of the 3 s end-of-turn silence.
    audio = await spoken("hello there", 0.5)
    for endpointer in (None, AtEveryPause()):
        owner = Owner(stt)
        pipeline = VoicePipeline(
            LoopbackSession("app"), owner, stt=stt, silence_ms=3_000, endpointer=endpointer
        )
        async with trio.open_nursery() as nursery:
            await nursery.start(pipeline.serve)
            await hear_all(pipeline, audio)
            if endpointer is None:
                await pipeline.wait_heard()
                # The silence alone has not ended the turn: nothing reached the owner.
                assert owner.turns == []
            else:
                with trio.fail_after(30):
                    await owner.took.wait()
                assert endpointer.asked and endpointer.asked[0] > 0
                assert len(owner.turns) == 1 and owner.turns[0]
            assert owner.starts == 1
            nursery.cancel_scope.cancel()


async def test_a_recognizer_that_streams_hears_the_utterance_as_it_comes() -> None:
    stt = BatchCounted()
    owner = Owner(stt)
    pipeline = VoicePipeline(LoopbackSession("app"), owner, stt=stt, silence_ms=700)
    async with trio.open_nursery() as nursery:
        await nursery.start(pipeline.serve)
        await hear_all(pipeline, await spoken("hello there how are you today", 1.0))
        with trio.fail_after(30):
            await owner.took.wait()
        nursery.cancel_scope.cancel()
    # The stream's words so far reached the early reply at the pause, and its finish is the
    # turn: the utterance was not decoded again in batch, neither at the pause nor at the end.
    assert owner.early and owner.early[-1]
    assert len(owner.turns) == 1 and owner.turns[0]
    assert stt.batch == 0


async def test_whisper_decodes_at_the_listeners_pauses_not_through_its_stream() -> None:
    # Its stream would decode at the pauses of a second detector of its own (docs/architecture.md).
    stt = StreamsCounted()
    owner = Owner(stt)
    pipeline = VoicePipeline(LoopbackSession("app"), owner, stt=stt, silence_ms=700)
    async with trio.open_nursery() as nursery:
        await nursery.start(pipeline.serve)
        await hear_all(pipeline, await spoken("hello there", 1.0))
        with trio.fail_after(60):
            await owner.took.wait()
        nursery.cancel_scope.cancel()
    assert owner.early and len(owner.turns) == 1 and owner.turns[0]
    assert stt.streams == 0


async def test_a_barge_in_drops_the_agents_queued_voice() -> None:
    stt = PocketsphinxSTT()
    session = LoopbackSession("app")
    owner = Owner(stt, speaking=True)
    pipeline = VoicePipeline(session, owner, stt=stt)
    async with trio.open_nursery() as nursery:
        await nursery.start(pipeline.serve)
        await session.publish_audio(bytes(4_000), 16_000)
        await hear_all(pipeline, await spoken("stop please", 0.8))
        with trio.fail_after(30):
            await owner.took.wait()
        # (The words are the recognizer's to get right: tests/providers holds them.)
        assert owner.starts == 1 and len(owner.turns) == 1
        nursery.cancel_scope.cancel()
    # The agent's voice queued before the caller spoke was cleared (None marks a clear).
    played = []
    while True:
        try:
            played.append(session.audio_out.receive_nowait())
        except (trio.WouldBlock, trio.EndOfChannel):
            break
    assert None in played


async def test_words_the_agent_is_saying_are_its_echo_not_the_callers() -> None:
    pipeline = VoicePipeline(LoopbackSession("app"), Owner(PocketsphinxSTT()), stt=None)
    await pipeline.play(TurnStarted(turn="t1"))
    await pipeline.play(ReplyDelta(turn="t1", text="We open at noon, "))
    await pipeline.play(ReplyDelta(turn="t1", text="every day."))
    # The agent's own voice, heard back through the caller's microphone, is no barge-in.
    assert not pipeline.is_caller("open at noon every day")
    assert pipeline.is_caller("wait, on Sunday too?")
    # Its last turn's words still count while the next one starts; the turn before it no more.
    for turn, text in (("t1", "We open at noon, every day."), ("t2", "Yes.")):
        await pipeline.play(TurnFinished(result=finished(turn, text)))
        await pipeline.play(TurnStarted(turn=f"after-{turn}"))
    assert not pipeline.is_caller("yes")
    assert pipeline.is_caller("open at noon")


def finished(turn: str, text: str) -> TurnResult:
    return TurnResult(
        turn=turn,
        text=text,
        interrupted=False,
        reason=None,
        error_code=None,
        chunks_spoken=1,
        tool_calls=(),
        usage=(),
        timings=TurnTimings(model_first_text_ms=None, first_audio_sent_ms=None, total_ms=10),
    )
