"""The follower's hot path decodes exactly as the protocol's converter does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runner.host._follow import _parse_lines, _record
from runner.wire import JournalRecord, WireError, decode

FIXTURES = Path(__file__).resolve().parents[2] / "runner" / "protocol-fixtures"
VALID = sorted((FIXTURES / "valid").glob("JournalRecord.*.json"))
INVALID = sorted((FIXTURES / "invalid").glob("JournalRecord.*.json"))

# Values of the right JSON kind but the wrong Python type, which only a strict reader refuses.
STRICT = [
    {"envelope": True, "producer": "p", "seq": 1, "class": "c", "at": 0, "body": {}},
    {"envelope": 1.0, "producer": "p", "seq": 1, "class": "c", "at": 0, "body": {}},
    {"envelope": 1, "producer": "p", "seq": 1, "class": "c", "at": -1, "body": {}},
    {"envelope": 1, "producer": 7, "seq": 1, "class": "c", "at": 0, "body": {}},
    {"envelope": 1, "producer": "p", "seq": 1, "class": "c", "at": 0, "body": "text"},
]


def test_there_are_fixtures_of_both_kinds() -> None:
    assert len(VALID) >= 3 and len(INVALID) >= 5


@pytest.mark.parametrize("path", VALID, ids=lambda p: p.name)
def test_a_valid_line_becomes_the_record_decode_makes(path: Path) -> None:
    value = json.loads(path.read_text())
    got = _record(value)
    assert type(got) is JournalRecord
    assert got == decode(JournalRecord, value)


@pytest.mark.parametrize("value", [json.loads(p.read_text()) for p in INVALID] + STRICT)
def test_an_invalid_line_is_refused_as_decode_refuses_it(value: dict[str, object]) -> None:
    with pytest.raises(WireError) as fast:
        _record(value)
    with pytest.raises(WireError) as slow:
        decode(JournalRecord, value)
    assert fast.value.issues == slow.value.issues


def test_a_block_of_lines_parses_whole_or_line_by_line() -> None:
    lines = [b'{"ping":1}', b'{"envelope":1,"text":"a\\nb"}', b'{"ping":2}']
    assert _parse_lines(b"\n".join(lines)) == [{"ping": 1}, {"envelope": 1, "text": "a\nb"}, {"ping": 2}]
    # A blank line makes the one-array parse fail; each line is then parsed on its own.
    assert _parse_lines(b'{"ping":1}\n\n{"ping":2}\r') == [{"ping": 1}, {"ping": 2}]
    with pytest.raises(ValueError):
        _parse_lines(b'{"ping":1}\n{"envelope":NaN}')
