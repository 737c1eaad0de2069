"""The ino.v2 wire types, their converter, and ``runner/ino.schema.json`` agree."""

from __future__ import annotations

import json
import types
import typing
from typing import Any

import attrs
import jsonschema
import pytest

from runner import ino_wire as w
from runner.transports.websocket import EVENT_FRAMES

from .ino_checker import SCHEMA, schema_errors

EVENT_DEFS = {
    name.removeprefix("event."): d for name, d in SCHEMA["$defs"].items() if name.startswith("event.")
}
VERB_DEFS = {name.removeprefix("verb."): d for name, d in SCHEMA["$defs"].items() if name.startswith("verb.")}
# Described by the schema but not (yet) sent by this runner: ``relation`` belongs to issue 9
# (its fields are the relationship's), ``pong`` is a constant string with no seq.
SCHEMA_ONLY = {"relation", "pong"}
# Every frame the runner sends with a seq: the socket's own, and the turn events written as they are.
EVENTS = w.EVENTS | {kind: cls for cls, kind in EVENT_FRAMES.items()}


def test_every_event_type_has_a_schema_with_exactly_its_fields() -> None:
    assert len(EVENTS) == len(w.EVENTS) + len(EVENT_FRAMES)
    assert set(EVENTS) | SCHEMA_ONLY == set(EVENT_DEFS)
    for kind, cls in EVENTS.items():
        fields = {"type", "seq", *(a.name for a in attrs.fields(cls))}
        definition = EVENT_DEFS[kind]
        assert set(definition["properties"]) == fields, kind
        assert set(definition["required"]) == fields, kind  # every field, null where it does not apply


def test_every_verb_has_a_schema_with_exactly_its_fields() -> None:
    assert set(w.VERBS) == set(VERB_DEFS)
    for kind, cls in w.VERBS.items():
        definition = VERB_DEFS[kind]
        assert set(definition["properties"]) == {"type", *(a.name for a in attrs.fields(cls))}, kind
        required = {a.name for a in attrs.fields(cls) if a.default is attrs.NOTHING}
        assert set(definition["required"]) == {"type", *required}, kind
        assert definition["additionalProperties"] is False


def _sample(annotation: Any) -> Any:
    """A value of ``annotation`` for every field, the first choice of each union or literal."""
    if attrs.has(annotation):
        hints = typing.get_type_hints(annotation)
        return annotation(
            **{a.name: _sample(hints[a.name]) for a in attrs.fields(annotation) if a.default is attrs.NOTHING}
        )
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Literal:
        return args[0]
    if origin in (typing.Union, types.UnionType):
        return None if type(None) in args else _sample(args[0])
    if origin is list:
        return [_sample(args[0])]
    return {str: "x", int: 16000, float: 0.5, bool: True}.get(annotation, {})


@pytest.mark.parametrize("kind", sorted(EVENTS))
def test_an_encoded_event_is_valid_against_its_schema(kind: str) -> None:
    frame = _sample(EVENTS[kind])
    encoded = json.loads(w.encode_frame(frame, 7, kind=kind))
    assert list(encoded)[:2] == ["type", "seq"] and encoded["seq"] == 7
    assert schema_errors(encoded) == []


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"type":"user_message","text":"hi","speech":null}', w.UserMessage(text="hi")),
        ('{"type":"user_audio.end","transcribe_only":true}', w.UserAudioEnd(transcribe_only=True)),
        (
            '{"type":"tool.result","call_id":"c","result":[1,{"a":null}]}',
            w.ToolResult(call_id="c", result=[1, {"a": None}]),
        ),
        ('{"type":"ping"}', w.Ping()),
    ],
)
def test_a_verb_decodes(text: str, expected: Any) -> None:
    assert w.decode_verb(text) == expected
    assert schema_errors(json.loads(text), "verb") == []


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("[]", "a frame is a JSON object"),
        ('{"text":"hi"}', "the frame has no type"),
        ('{"type":"user_message"}', "user_message needs 'text'"),
        ('{"type":"user_message","text":true}', "user_message.text must be a string"),
        ('{"type":"user_audio.start","rate":"16000"}', "user_audio.start.rate must be an integer"),
        ('{"type":"tool.confirmed","call_id":"c","yes":1}', "tool.confirmed.yes must be a boolean"),
        ('{"type":"auth","key":"k","session_id":"s","tools":["a",2]}', "auth.tools item 1 must be a string"),
        ('{"type":"mute","seq":1}', "mute takes no field 'seq'"),
        ('{"type":"user_message","text":"hi","metadata":{"x":NaN}}', "the frame is not JSON"),
    ],
)
def test_a_frame_that_cannot_be_understood_is_rejected_naming_why(text: str, reason: str) -> None:
    with pytest.raises(w.FrameRejected, match=reason.replace(".", r"\.")):
        w.decode_verb(text)
    assert schema_errors(json.loads(text), "verb") != []


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ('{"type":"user_message","text":""}', "text"),
        ('{"type":"user_audio.start","rate":12000}', "rate"),
        ('{"type":"user_audio.start","language":"toolonglang"}', "language"),
        ('{"type":"tool.result","call_id":"c","error":""}', "error"),
        ('{"type":"auth","key":"k","session_id":"s","tools":' + json.dumps(["t"] * 51) + "}", "tools"),
    ],
)
def test_a_value_outside_its_limits_is_invalid_not_rejected(text: str, field: str) -> None:
    with pytest.raises(w.FrameInvalid) as caught:
        w.decode_verb(text)
    assert caught.value.field == field
    assert schema_errors(json.loads(text), "verb") != []


def test_times_are_written_as_rfc_3339_utc() -> None:
    assert w.rfc3339(0) == "1970-01-01T00:00:00Z"
    assert w.rfc3339(1_764_448_091_999) == "2025-11-29T20:28:11Z"


REST = {
    "rest.EphemeralKeyRequest": w.EphemeralKeyRequest,
    "rest.EphemeralKey": w.EphemeralKey,
    "rest.Revoked": w.Revoked,
    "rest.AgentSessionRequest": w.AgentSessionRequest,
    "rest.AgentSession": w.AgentSession,
    "rest.TranscriptMessage": w.TranscriptMessage,
    "rest.AgentSessionMessages": w.AgentSessionMessages,
    "rest.CompactionDone": w.CompactionDone,
    "rest.Deleted": w.Deleted,
    "rest.Relations": w.Relations,
}


@pytest.mark.parametrize("name", sorted(REST))
def test_every_rest_body_has_a_schema_with_exactly_its_fields_and_encodes_to_it(name: str) -> None:
    assert {k for k in SCHEMA["$defs"] if k.startswith("rest.")} == set(REST)
    definition = SCHEMA["$defs"][name]
    assert set(definition["properties"]) == {a.name for a in attrs.fields(REST[name])}
    # Every string of the sample is a time, which any of these strings may be.
    sample = json.loads(json.dumps(w.encode(_sample(REST[name]))).replace('"x"', '"2026-11-30T12:00:00Z"'))
    validator = jsonschema.Draft202012Validator(
        {"$defs": SCHEMA["$defs"], "$ref": f"#/$defs/{name}"}, format_checker=jsonschema.FormatChecker()
    )
    assert [e.message for e in validator.iter_errors(sample)] == []
