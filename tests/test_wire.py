"""The converter agrees with the schema: every fixture decodes, or is refused, the same way."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import attrs
import pytest

from runner import wire
from runner.wire import WireError, decode

from .test_protocol_schema import DEFS, HELPER_DEFS, INVALID, VALID, _type_of, _validator

TYPES: dict[str, object] = {
    "Health": wire.Health,
    "ErrorBody": wire.ErrorBody,
    "Issue": wire.Issue,
    "ErrorCode": wire.ErrorCode,
    "JournalRecord": wire.JournalRecord,
    "Heartbeat": wire.Heartbeat,
    "LifecycleReady": wire.LifecycleReady,
    "LifecycleDraining": wire.LifecycleDraining,
    "LifecycleEnded": wire.LifecycleEnded,
    "LifecycleRecovered": wire.LifecycleRecovered,
    "Lifecycle": wire.Lifecycle,
    "StartCallRequest": wire.StartCallRequest,
    "ResumedCall": wire.ResumedCall,
    "HistoryTurn": wire.HistoryTurn,
    "LiveCall": wire.LiveCall,
    "StartCallResponse": wire.StartCallResponse,
    "StopCallResponse": wire.StopCallResponse,
    "RunnerStatus": wire.RunnerStatus,
    "HostMessage": wire.HostMessage,
    "HostMessageAccepted": wire.HostMessageAccepted,
    "HostRecordBody": wire.HostRecordBody,
    "ConversationEventBody": wire.ConversationEventBody,
    "CallStartedEvent": wire.CallStartedEvent,
    "CallEndedEvent": wire.CallEndedEvent,
    "CallMessagesEvent": wire.CallMessagesEvent,
    "SessionUpdate": wire.SessionUpdate,
    "EffectiveSettings": wire.EffectiveSettings,
    "SessionSettingsResponse": wire.SessionSettingsResponse,
}
# Shapes the decoder has no class for: a stream line is told apart by "envelope".
UNDECODED = {"NonEmptyString", "StringMap", "StreamLine"}


def test_every_schema_type_has_a_decoder() -> None:
    assert set(DEFS) - UNDECODED == set(TYPES)


def _fixture_id(path: Path) -> str:
    return path.name


@pytest.mark.parametrize("path", [p for p in VALID if _type_of(p) in TYPES], ids=_fixture_id)
def test_valid_fixtures_decode(path: Path) -> None:
    value = json.loads(path.read_text(encoding="utf-8"))
    decoded = wire.decode(TYPES[_type_of(path)], value)
    assert decoded is not None


@pytest.mark.parametrize("path", [p for p in INVALID if _type_of(p) in TYPES], ids=_fixture_id)
def test_invalid_fixtures_are_refused(path: Path) -> None:
    value = json.loads(path.read_text(encoding="utf-8"))
    assert not _validator(_type_of(path)).is_valid(value)
    with pytest.raises(wire.WireError) as refused:
        wire.decode(TYPES[_type_of(path)], value)
    assert refused.value.issues


@pytest.mark.parametrize(
    "path", [p for p in VALID if _type_of(p) in TYPES and _type_of(p) not in HELPER_DEFS], ids=_fixture_id
)
def test_encoding_round_trips_and_stays_valid(path: Path) -> None:
    cls = TYPES[_type_of(path)]
    decoded = wire.decode(cls, json.loads(path.read_text(encoding="utf-8")))
    encoded = wire.encode(decoded)
    assert _validator(_type_of(path)).is_valid(encoded)
    assert wire.decode(cls, encoded) == decoded


@pytest.mark.parametrize("text", ["NaN", '{"x":Infinity}', "[-Infinity]", "{nope", ""])
def test_parse_json_refuses_what_json_does_not_have(text: str) -> None:
    with pytest.raises(ValueError):
        wire.parse_json(text)


def test_parse_json_reads_json() -> None:
    assert wire.parse_json(b'{"x":[1,2.5e3,null,"\\u00e9"]}') == {"x": [1, 2500.0, None, "é"]}


def test_a_wrong_structure_is_told_what_was_expected_in_the_protocols_words() -> None:
    # Every field of every wire type, given every kind of JSON value: each issue is one of
    # the runner's own sentences, never Python's or cattrs' ("'list' object has no attribute").
    values: list[Any] = [[], "x", 1, 1.5, True, {}, None, ["a"], {"a": 1}, -1, [[1]], {"a": {"b": []}}]
    said: set[str] = set()
    for name in dir(wire):
        cls = getattr(wire, name)
        if not (isinstance(cls, type) and attrs.has(cls)):
            continue
        for body in [*values, *({wire.wire_name(f.name): v} for f in attrs.fields(cls) for v in values)]:
            try:
                decode(cls, body)
            except WireError as refused:
                said |= {issue.message for issue in refused.issues}
    ours = re.compile(
        r"expected (a string|an integer|a number|a boolean|an object|an array)( or (a string|an integer|a number|an object))*"
        r"|is required|must not be null|must be at least \d+|is not one of the allowed values"
        r"|does not have the expected type|must not be empty|.+ is not a valid .+"
    )
    assert said and all(ours.fullmatch(message) for message in said), sorted(said)
