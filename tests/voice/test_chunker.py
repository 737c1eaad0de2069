"""Cutting a streamed reply into sentence-sized pieces for speech."""

from __future__ import annotations

import pytest

from runner.voice.chunker import SentenceChunker


def pieces_of(text: str, *, step: int | None = None, **options: int) -> list[str]:
    """Feed ``text`` in deltas of ``step`` characters (whole at once without), then flush."""
    chunker = SentenceChunker(**options)
    out: list[str] = []
    size = step or len(text) or 1
    for start in range(0, len(text), size):
        out.extend(chunker.feed(text[start : start + size]))
    out.extend(chunker.flush())
    return out


def test_sentences_come_out_as_soon_as_they_end() -> None:
    chunker = SentenceChunker()
    assert chunker.feed("Hello there, how") == []
    assert chunker.feed(" are you today? I am") == ["Hello there, how are you today?"]
    # A full stop needs the whitespace after it: the model may still be writing "3.5".
    assert chunker.feed(" fine, thanks.") == []
    assert chunker.feed(" Goodbye for now!\n") == ["I am fine, thanks.", "Goodbye for now!"]
    assert chunker.flush() == []


@pytest.mark.parametrize("step", [None, 1, 2, 5, 17])
def test_any_delta_size_gives_the_same_pieces(step: int | None) -> None:
    text = "Breakfast is served from seven. Checkout is at noon! Is the spa open? Yes… until nine. Thanks"
    assert pieces_of(text, step=step) == [
        "Breakfast is served from seven.",
        "Checkout is at noon!",
        "Is the spa open?",
        "Yes… until nine.",
        "Thanks",
    ]


@pytest.mark.parametrize(
    "text",
    [
        "Dr. Smith will see you at noon today. ",
        "Mr. and Mrs. Jones are in room twelve. ",
        "Walk down St. James road to the pier. ",
        "Bring something warm, e.g. a coat or a scarf. ",
        "It is a short walk, i.e. five minutes at most. ",
        "Our rooms in the U.S. are all non-smoking. ",
        "The fee is 3.5 euros per night for each guest. ",
        # Beyond a hand-written list: pysbd knows these.
        "Prof. Brown will see you now in the hall. ",
        "Your room is No. 5 on the second floor. ",
        "We open on Jan. 5 at the usual hour. ",
        "Call Capt. Smith at the front desk today. ",
    ],
)
def test_abbreviations_and_decimals_do_not_end_a_sentence(text: str) -> None:
    # min_chars=1, so only the abbreviation rules keep these sentences whole.
    assert pieces_of(text + "Next one here.", step=3, min_chars=1) == [text.strip(), "Next one here."]
    assert pieces_of(text + "Next one here.") == [text.strip(), "Next one here."]


def test_quotes_and_brackets_stay_with_their_sentence() -> None:
    assert pieces_of('She said "the pool is closed." Then she left. (It opens at nine.) Done now.') == [
        'She said "the pool is closed."',
        "Then she left.",
        "(It opens at nine.)",
        "Done now.",
    ]


def test_very_short_sentences_are_joined_to_the_next() -> None:
    # Under min_chars a piece would be a choppy burst of speech: it waits for more text.
    assert pieces_of("Hi. Ok. Sure thing, here you go. Yes.", step=4) == [
        "Hi. Ok. Sure thing, here you go.",
        "Yes.",
    ]
    assert pieces_of("Hi. Ok. Sure thing, here you go. Yes.", min_chars=1) == [
        "Hi.",
        "Ok.",
        "Sure thing, here you go.",
        "Yes.",
    ]


def test_a_long_sentence_is_cut_at_its_last_soft_break() -> None:
    clause = "the garden room serves breakfast from seven until eleven"
    text = ", ".join([clause] * 6) + "."  # about 350 characters with no full stop until the end
    pieces = pieces_of(text, step=7)
    assert len(pieces) >= 2
    assert all(len(p) <= 220 for p in pieces)
    assert all(p.endswith(",") for p in pieces[:-1])
    assert pieces[-1].endswith(".")
    assert " ".join(pieces) == text
    # Cut at the *last* soft break that fits: the first piece holds as many clauses as fit.
    assert pieces[0] == ", ".join([clause] * 3) + ","


def test_a_long_sentence_with_semicolons_and_dashes() -> None:
    text = ("the pool is heated to twenty eight degrees all year round; " * 5).strip()
    pieces = pieces_of(text, step=11, max_chars=120)
    assert all(len(p) <= 120 for p in pieces)
    assert all(p.endswith(";") for p in pieces[:-1])
    assert " ".join(pieces) == text


def test_a_long_run_without_soft_breaks_is_cut_at_a_space() -> None:
    words = " ".join(f"word{i}" for i in range(80))  # ~500 characters, no punctuation at all
    pieces = pieces_of(words, step=9)
    assert len(pieces) >= 3
    assert all(len(p) <= 220 for p in pieces)
    assert " ".join(pieces) == words  # never cut inside a word


def test_a_run_without_any_space_is_cut_at_max_chars() -> None:
    blob = "x" * 500
    pieces = pieces_of(blob, max_chars=100)
    assert "".join(pieces) == blob
    assert all(len(p) <= 100 for p in pieces)


def test_flush_gives_back_the_unfinished_rest_once() -> None:
    chunker = SentenceChunker()
    assert chunker.feed("One full sentence here. And an unfinished") == ["One full sentence here."]
    assert chunker.flush() == ["And an unfinished"]
    assert chunker.flush() == []
    assert chunker.feed("   ") == []
    assert chunker.flush() == []
    # After a flush the chunker starts clean.
    assert chunker.feed("A brand new sentence. ") == ["A brand new sentence."]


def test_a_long_run_then_a_sentence_end() -> None:
    # Only the buffer's start goes to pysbd (its cost grows with the text): a long run is
    # cut at max_chars until the sentence's end is within reach, then ends there.
    text = "y" * 5_000 + " and that is all. Done now."
    pieces = pieces_of(text, step=50)
    assert pieces[-2].endswith("y and that is all.") and pieces[-1] == "Done now."
    assert all(len(p) == 220 for p in pieces[:-3])
    assert "".join(pieces).replace(" ", "") == text.replace(" ", "")
