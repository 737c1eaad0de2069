"""Speech over the agent's voice, through the voice pipeline with the embedded recognizer (Whisper)
and end-of-turn model: a backchannel or a hum lets the voice go on from where it was held, an
interruption cuts it."""

from __future__ import annotations

import logging

import pytest
import trio

from runner.providers.whisper import WhisperSTT
from runner.transports.loopback import LoopbackSession
from runner.voice.audio import frames
from runner.voice.events import AudioData, AudioStart
from runner.voice.overlap import classify_overlap, worth_a_second_hearing
from runner.voice.pipeline import VoicePipeline
from runner.voice.turn_taking import TurnTaking
from tests.voice.test_pipeline import Owner
from tests.voice.turn_audio import hum, say, silence

VOICE_HZ = 16_000
# The agent's voice, in three pieces told apart by their level.
PIECES = [bytes([n, 0]) * (VOICE_HZ // 10) for n in (1, 2, 3)]


@pytest.mark.parametrize(
    ("words", "kind"),
    [
        ("Mm-hm.", "backchannel"),
        ("Mm-hm-hm.", "backchannel"),
        ("Mmmmm.", "backchannel"),
        ("Hmm, yeah.", "backchannel"),
        ("Yeah.", "backchannel"),
        ("Okay, okay.", "backchannel"),
        ("Right.", "backchannel"),
        ("Uh.", "none"),
        ("", "none"),
        ("Wait.", "interruption"),
        ("No, I said Tuesday.", "interruption"),
        ("Yeah, but what about Tuesday?", "interruption"),
    ],
)
def test_words_over_the_agents_voice_are_told_apart(words: str, kind: str) -> None:
    assert classify_overlap(words) == kind


@pytest.mark.parametrize(
    ("words", "again"),
    [
        ("It's hot.", True),  # hibari's "Uh-huh." to Whisper tiny.en, heard with no hint
        ("and mimic him.", True),  # espeak's "Mm-hm."
        ("No, I said Tuesday.", True),
        ("Yeah.", False),  # a backchannel already
        ("", False),
        ("Yeah, but what about Tuesday?", False),  # too long to be one
    ],
)
def test_only_short_words_that_cut_in_are_heard_again_with_the_hint(words: str, again: bool) -> None:
    assert worth_a_second_hearing(words) is again


async def overlap(caller: tuple[bytes, int], *, after: bool) -> tuple[Owner, list[bytes | None]]:
    """The agent speaks its first piece, the caller says ``caller`` over it, then (``after``)
    the agent's next pieces are played; returns the owner and what the caller's side received
    (``None`` marks a clear)."""
    pcm, rate = caller
    stt = WhisperSTT()
    session = LoopbackSession("app")
    owner = Owner(stt, speaking=True)
    pipeline = VoicePipeline(session, owner, stt=stt, turn=TurnTaking())
    async with trio.open_nursery() as nursery:
        await nursery.start(pipeline.serve)
        await pipeline.play(AudioStart(turn="t1", chunk=0, sample_rate_hz=VOICE_HZ))
        await pipeline.play(AudioData(turn="t1", chunk=0, pcm=PIECES[0]))
        for frame in frames(silence(300, rate) + pcm + silence(2500, rate), rate, 20):
            await pipeline.hear(frame, rate)
        if after:
            with trio.fail_after(30):
                # Held until the words are judged, then from where it was.
                for n, piece in enumerate(PIECES[1:], 1):
                    await pipeline.play(AudioData(turn="t1", chunk=n, pcm=piece))
        with trio.fail_after(30):
            await pipeline.wait_heard()
        nursery.cancel_scope.cancel()
    received: list[bytes | None] = []
    while True:
        try:
            received.append(session.audio_out.receive_nowait())
        except (trio.WouldBlock, trio.EndOfChannel):
            return owner, received


@pytest.mark.parametrize("words", ["Yeah.", "Okay."])
async def test_a_backchannel_over_the_agents_voice_does_not_stop_it(
    words: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="runner.voice")
    owner, received = await overlap(await say(words), after=True)

    assert owner.starts == 0 and owner.turns == []  # never cut off, and no turn of its own
    assert received == PIECES  # every piece, in order, nothing dropped
    assert any("backchannel over the agent's voice" in r.getMessage() for r in caplog.records)


async def test_a_backchannel_misheard_at_first_is_heard_again_and_does_not_stop_the_agent(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Whisper tiny.en hears hibari's "Uh-huh." as "It's hot."; heard again with the
    # backchannel hint, it is what it is.
    caplog.set_level(logging.INFO, logger="runner.voice")
    owner, received = await overlap(await say("Uh-huh."), after=True)

    assert owner.starts == 0 and owner.turns == []
    assert received == PIECES
    assert any("heard again with a hint" in r.getMessage() for r in caplog.records)


async def test_a_sound_with_no_words_over_the_agents_voice_resumes_it_where_it_was(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="runner.voice")
    owner, received = await overlap((hum(0.5, 24_000), 24_000), after=True)

    assert owner.starts == 0 and owner.turns == []
    assert received == PIECES
    assert any("none over the agent's voice" in r.getMessage() for r in caplog.records)


async def test_an_interruption_over_the_agents_voice_cuts_it_and_is_the_next_turn() -> None:
    owner, received = await overlap(await say("Wait, no, I said Tuesday."), after=False)

    assert owner.starts == 1  # the agent's turn was cut
    assert received == [PIECES[0], None]  # and what of its voice was queued, dropped
    (turn,) = owner.turns
    assert "tuesday" in turn.lower()


async def test_a_caller_who_talks_on_over_the_agent_cuts_it_before_they_stop() -> None:
    pcm, rate = await say("Wait, stop, I would rather hear about the gym and the pool.")
    stt = WhisperSTT()
    session = LoopbackSession("app")
    owner = Owner(stt, speaking=True)
    pipeline = VoicePipeline(session, owner, stt=stt, turn=TurnTaking())
    async with trio.open_nursery() as nursery:
        await nursery.start(pipeline.serve)
        await pipeline.play(AudioStart(turn="t1", chunk=0, sample_rate_hz=VOICE_HZ))
        await pipeline.play(AudioData(turn="t1", chunk=0, pcm=PIECES[0]))
        # Still talking: no quiet after the words, so their end is never heard.
        for frame in frames(silence(300, rate) + pcm, rate, 20):
            await pipeline.hear(frame, rate)
        nursery.cancel_scope.cancel()

    assert owner.starts == 1 and owner.turns == []
    assert session.audio_out.receive_nowait() == PIECES[0]
    assert session.audio_out.receive_nowait() is None
