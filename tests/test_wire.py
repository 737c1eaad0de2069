"""The converter agrees with the schema: every fixture decodes, or is refused, the same way."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runner import wire

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
