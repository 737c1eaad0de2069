"""The host protocol's JSON Schema and its fixtures agree.

``runner/protocol.schema.json`` is one JSON Schema 2020-12 document with every type under
``$defs``. ``runner/protocol-fixtures/{valid,invalid}/<Type>.<case>.json`` are examples a
host implementation must accept (valid) or refuse (invalid) as ``<Type>``. Each invalid
fixture is wrong for exactly one reason, the one its case name gives.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

RUNNER = Path(__file__).parents[1] / "runner"
SCHEMA_PATH = RUNNER / "protocol.schema.json"
FIXTURES = RUNNER / "protocol-fixtures"
VALID = sorted((FIXTURES / "valid").glob("*.json"))
INVALID = sorted((FIXTURES / "invalid").glob("*.json"))

SCHEMA: dict[str, Any] = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
DEFS: dict[str, Any] = SCHEMA["$defs"]

# $defs that are building blocks of other types rather than a route's or a record's
# whole value, so they need no fixtures of their own (some have them anyway).
HELPER_DEFS = frozenset(
    {
        "NonEmptyString",
        "StringMap",
        "ErrorCode",
        "Issue",
        "StreamLine",
        "Lifecycle",
        "ConversationEventBody",
    }
)

# Keywords a root may carry without constraining a value validated through it, so that
# {"$ref": "#/$defs/<Type>"} placed at the root checks exactly <Type>.
ROOT_KEYWORDS = frozenset({"$schema", "$id", "$comment", "title", "description", "$defs"})

FIXTURE_NAME = re.compile(r"^(?P<type>[A-Z][A-Za-z0-9]*)\.(?P<case>[a-z0-9]+(?:-[a-z0-9]+)*)\.json$")


def _type_of(path: Path) -> str:
    match = FIXTURE_NAME.match(path.name)
    assert match, f"{path.name} is not named <Type>.<kebab-case>.json"
    return match["type"]


def _validator(type_name: str) -> Draft202012Validator:
    """A validator for {"$ref": "#/$defs/<type_name>"} resolved inside the document."""
    root = {**SCHEMA, "$ref": f"#/$defs/{type_name}"}
    return Draft202012Validator(root, format_checker=None)


def _load(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def _ids(paths: list[Path]) -> list[str]:
    return [path.name for path in paths]


def test_schema_is_a_valid_2020_12_schema() -> None:
    assert SCHEMA["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    Draft202012Validator.check_schema(SCHEMA)


def test_root_only_holds_defs() -> None:
    assert set(SCHEMA) <= ROOT_KEYWORDS


def test_schema_never_forbids_unknown_properties() -> None:
    def walk(node: Any, where: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("additionalProperties", "unevaluatedProperties"):
                    assert value is not False, f"{where}/{key} forbids unknown properties"
                walk(value, f"{where}/{key}")
        elif isinstance(node, list):
            for index, value in enumerate(node):
                walk(value, f"{where}/{index}")

    walk(SCHEMA, "#")


def test_there_are_fixtures() -> None:
    assert VALID and INVALID


@pytest.mark.parametrize("path", VALID + INVALID, ids=_ids(VALID + INVALID))
def test_fixture_names_a_defined_type(path: Path) -> None:
    assert _type_of(path) in DEFS


def test_helper_exemptions_are_defined() -> None:
    assert set(DEFS) >= HELPER_DEFS


@pytest.mark.parametrize("type_name", sorted(set(DEFS) - HELPER_DEFS))
def test_every_type_has_valid_and_invalid_fixtures(type_name: str) -> None:
    assert any(_type_of(path) == type_name for path in VALID), f"no valid {type_name} fixture"
    assert any(_type_of(path) == type_name for path in INVALID), f"no invalid {type_name} fixture"


@pytest.mark.parametrize("path", VALID, ids=_ids(VALID))
def test_valid_fixture_is_accepted(path: Path) -> None:
    errors = list(_validator(_type_of(path)).iter_errors(_load(path)))
    assert not errors, [f"{list(e.absolute_path)}: {e.message}" for e in errors]


@pytest.mark.parametrize("path", INVALID, ids=_ids(INVALID))
def test_invalid_fixture_is_refused_for_one_reason(path: Path) -> None:
    errors = list(_validator(_type_of(path)).iter_errors(_load(path)))
    assert errors, f"{path.name} validates as {_type_of(path)}"
    # One top-level error: the fixture is wrong in one way only, the way its name says.
    assert len(errors) == 1, [f"{list(e.absolute_path)}: {e.message}" for e in errors]
