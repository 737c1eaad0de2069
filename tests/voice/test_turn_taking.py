import numpy as np
import pytest

from runner.agent import STT, Agent
from runner.providers.whisper import WhisperSTT
from runner.testing import open_agent_test
from runner.voice.audio import frames
from runner.voice.listener import Heard, Listener, SpeechEnded, SpeechPaused
from runner.voice.turn_taking import EndOfTurn, TurnTaking, sounds_unfinished
from tests.voice.turn_audio import cut_after, say, silence

FRAME_MS = 20


@pytest.mark.parametrize(
    ("text", "unfinished"),
    [
        ("I would like to book a table for", True),
        ("I would like to book a table for.", True),
        ("My number is 0 7 9", True),
        ("So I was thinking, um", True),
        ("Well,", True),
        ("What time do you open tomorrow?", False),
        ("Where are you from?", False),
        ("A table for four people.", False),
        ("", False),
    ],
)
def test_words_that_stop_mid_sentence_sound_unfinished(text: str, unfinished: bool) -> None:
    assert sounds_unfinished(text) is unfinished


def test_a_pause_judged_finished_ends_the_turn_after_the_short_silence_and_not_before() -> None:
    ending = EndOfTurn(TurnTaking(min_silence_ms=200, max_silence_ms=2000))
    pause = ending.paused(1000.0)
    assert not ending.due(1500.0)  # no verdict yet: the detector's cap decides
    ending.judged(pause, 0.93)
    assert not ending.due(1150.0)
    assert ending.due(1200.0)


def test_a_pause_judged_unfinished_or_stopping_on_for_holds_and_a_stale_verdict_is_dropped() -> None:
    ending = EndOfTurn(TurnTaking())
    pause = ending.paused(0.0)
    ending.judged(pause, 0.2)
    assert not ending.due(1500.0)

    pause = ending.paused(2000.0)
    ending.judged(pause, 0.9)
    ending.heard(pause, "I'd like a table for")
    assert not ending.due(2500.0)

    old = ending.paused(3000.0)
    ending.resumed()
    ending.judged(old, 0.99)
    assert not ending.due(4000.0)


def test_a_pause_whose_words_are_being_decoded_ends_once_they_are_known() -> None:
    ending = EndOfTurn(TurnTaking())
    pause = ending.paused(0.0)
    ending.expect_words(pause)
    ending.judged(pause, 0.95)
    assert not ending.due(500.0)  # the reply needs the words anyway: the turn waits for them
    ending.heard(pause, "What time do you open tomorrow?")
    assert ending.due(500.0)


async def listen(
    listener: Listener, pcm: bytes, rate: int, *, words: bool = False
) -> list[tuple[float, Heard]]:
    """Feed ``pcm`` in 20 ms frames, letting the model judge each pause before the next frame
    (as a live call's frames wait on nothing but the clock); with ``words``, the words up to
    each pause are decoded and weigh in too, as the pipeline has them. Return what was heard
    and the stream time (ms) of the frame that brought it."""
    heard: list[tuple[float, Heard]] = []
    for i, frame in enumerate(frames(pcm, rate, FRAME_MS)):
        at = (i + 1) * FRAME_MS
        for event in listener.feed(frame, rate):
            heard.append((at, event))
            if isinstance(event, SpeechPaused):
                heard += [(at, judged) for judged in await listener.judge(event, words_coming=words)]
                if words:
                    said = await listener.transcribe(SpeechEnded(pcm=event.pcm, sample_rate_hz=rate))
                    heard += [(at, end) for end in listener.heard_at(event, said.text)]
    return heard


def ended(heard: list[tuple[float, Heard]]) -> list[tuple[float, SpeechEnded]]:
    return [(at, e) for at, e in heard if isinstance(e, SpeechEnded)]


def voice_ends_ms(pcm: bytes, rate: int) -> float:
    """Where the voice in ``pcm`` stops (the last sample louder than -40 dBFS), in ms."""
    loud = np.flatnonzero(np.abs(np.frombuffer(pcm, "<i2")) > 328)
    return float(loud[-1] + 1) * 1000 / rate


async def test_a_finished_sentence_ends_the_turn_well_before_the_fixed_silence() -> None:
    pcm, rate = await say("What time do you open tomorrow?")
    lead = silence(300, rate)
    spoken_ms = voice_ends_ms(lead + pcm, rate)
    audio = lead + pcm + silence(1500, rate)

    adaptive = ended(await listen(Listener(WhisperSTT(), turn=TurnTaking()), audio, rate))
    fixed = ended(await listen(Listener(WhisperSTT(), turn=TurnTaking(detection="silence")), audio, rate))

    assert len(adaptive) == 1 and len(fixed) == 1
    (early, _), (late, _) = adaptive[0], fixed[0]
    # Stream time, not wall time: the turn ends within the quiet the audio holds.
    assert late - spoken_ms >= 500
    assert early - spoken_ms < 400
    assert early < late


async def test_a_caller_who_pauses_mid_sentence_is_waited_for() -> None:
    whole, rate = await say("I would like to book a table for four people.")
    cut = cut_after(whole, rate, 7)  # "... a table for" | "four people."
    hesitant = silence(300, rate) + whole[:cut] + silence(1000, rate) + whole[cut:] + silence(2500, rate)

    # The model and the words at the pause ("... a table for") both say the caller goes on; the
    # words hold the turn even where the model's verdict on the fragment comes out otherwise
    # (its rating climbs from 0.04 at 100 ms of quiet to 0.57 at 200 and runs near the
    # threshold on some CPUs' int8 kernels).
    adaptive = ended(await listen(Listener(WhisperSTT(), turn=TurnTaking()), hesitant, rate, words=True))
    fixed = ended(
        await listen(Listener(WhisperSTT(), turn=TurnTaking(detection="silence")), hesitant, rate, words=True)
    )

    assert len(fixed) == 2  # the fixed 500 ms cut in at "for"
    assert len(adaptive) == 1
    ((_, turn),) = adaptive
    assert len(turn.pcm) >= len(whole)


async def test_an_agent_waits_out_a_callers_hesitation_by_default() -> None:
    agent = Agent("tables", instructions="Tables are booked.", stt=STT(provider="whisper"))
    whole, rate = await say("I would like to book a table for four people.")
    cut = cut_after(whole, rate, 7)
    async with open_agent_test(agent) as test:
        # One turn, heard whole: the pause after "for" (1 s) did not end it.
        turn = await test.say_audio(whole[:cut] + silence(1000, rate) + whole[cut:], sample_rate_hz=rate)
        turn.heard("table for four people")
