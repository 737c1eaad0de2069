"""The pure rules behind the socket's memory: moods, summaries, and the frames that carry them."""

from __future__ import annotations

import json

import pytest

from runner import ino_wire as w
from runner.platform import mood_of, summarise
from runner.providers import ChatMessage

from .ino_checker import schema_errors

RELATION = w.RelationBody(
    agent_id="a",
    end_user_id="eu",
    conversations=2,
    first_at="2026-11-29T20:28:11Z",
    last_at="2026-11-29T21:28:11Z",
    notes=[w.RelationNoteBody(note="likes quiet rooms", recorded_at="2026-11-29T20:30:00Z")],
)


@pytest.mark.parametrize(
    ("reply", "mood"),
    [
        ("The spa is open from nine.", ("calm", 0.2)),
        ("Welcome! Enjoy a lovely stay.", ("cheerful", 0.8)),
        ("Sorry, I cannot book that.", ("apologetic", 0.6)),
        ("Checkout is at noon, and late checkout costs twenty euros.", ("concerned", 0.6)),
        ("Sorry! Welcome, welcome, welcome, glad, happy, lovely.", ("cheerful", 1.0)),
    ],
)
def test_a_reply_has_the_mood_of_the_words_it_uses_most(reply: str, mood: tuple[str, float]) -> None:
    assert mood_of(reply) == mood


def test_a_summary_keeps_what_each_side_said_after_the_one_before() -> None:
    first = summarise(
        None,
        [ChatMessage(role="user", content="My room is 512"), ChatMessage(role="assistant", content="Noted.")],
    )
    assert (
        first == "Summary of the conversation so far.\nThe person said: My room is 512.\nYou answered: Noted."
    )
    tool_call = ChatMessage(role="tool", content='{"ok": true}', tool_call_id="c")
    assert (
        summarise(first, [tool_call, ChatMessage(role="user", content="Thanks!")])
        == first + "\nThe person said: Thanks!"
    )


def test_relation_frames_and_bodies_are_valid_against_the_schema() -> None:
    relation = json.loads(
        w.encode_frame(
            w.Relation(
                turn="turn_1",
                **{
                    a: getattr(RELATION, a)
                    for a in ("agent_id", "end_user_id", "conversations", "first_at", "last_at", "notes")
                },
            ),
            5,
        )
    )
    assert schema_errors(relation) == []
    assert relation["notes"] == [{"note": "likes quiet rooms", "recorded_at": "2026-11-29T20:30:00Z"}]
    ready = w.Ready(
        session_id="s",
        agent_id="a",
        end_user_id="eu",
        speaks=False,
        audio=w.AudioFormat(sample_rate=24000),
        hearing=w.AudioFormat(sample_rate=16000),
        emotion=True,
        relation=RELATION,
        greeting=False,
        idle_seconds=300,
        edge_version="0.1.0",
    )
    encoded = json.loads(w.encode_frame(ready, 1))
    assert schema_errors(encoded) == []
    assert encoded["relation"]["conversations"] == 2
    broken = {**relation, "conversations": "two"}
    assert schema_errors(broken) != []
