"""What the generated-input suite sends: bodies and frames from the runner's JSON Schemas, valid
and mutated, as the bytes a hostile client would put on the wire.

Values come from ``hypothesis-jsonschema``. Objects with properties are put together here
(``st.fixed_dictionaries``) from a strategy per property: hypothesis-jsonschema 0.23's own
object strategy calls a Hypothesis internal (``many.more``) that current Hypothesis removed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import quote

import attrs
from hypothesis import strategies as st
from hypothesis_jsonschema import from_schema

RUNNER = Path(__file__).resolve().parents[2] / "runner"
PROTOCOL = json.loads((RUNNER / "protocol.schema.json").read_text(encoding="utf-8"))
INO = json.loads((RUNNER / "ino.schema.json").read_text(encoding="utf-8"))


def _resolve(node: Any, defs: dict[str, Any]) -> Any:
    """``node`` with every ``#/$defs/...`` reference replaced by its definition."""
    if isinstance(node, dict):
        if "$ref" in node:
            target = defs[node["$ref"].removeprefix("#/$defs/")]
            rest = {k: v for k, v in node.items() if k != "$ref"}
            return _resolve({**target, **rest}, defs)
        return {k: _resolve(v, defs) for k, v in node.items()}
    if isinstance(node, list):
        return [_resolve(v, defs) for v in node]
    return node


def _values(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    items = schema.get("items")
    if schema.get("type") == "array" and isinstance(items, dict) and items.get("type") == "object":
        # An array of objects (a resume's history): its objects put together here too.
        low = schema.get("minItems", 0)
        return st.lists(_values(items), min_size=low, max_size=min(schema.get("maxItems", low + 5), low + 5))
    if schema.get("type") != "object":
        return from_schema(schema)
    required = set(schema.get("required", ()))
    props = schema.get("properties", {})
    fixed = st.fixed_dictionaries(
        {k: _values(v) for k, v in props.items() if k in required},
        optional={k: _values(v) for k, v in props.items() if k not in required},
    )
    more = schema.get("additionalProperties", {})
    if more is False:
        return fixed
    extra = st.dictionaries(
        st.text(max_size=12).filter(lambda k: k not in props), _values(more) if more else JSON, max_size=3
    )
    return st.tuples(fixed, extra).map(lambda both: {**both[1], **both[0]})


def valid(
    doc: dict[str, Any], definition: str, /, **override: st.SearchStrategy[Any]
) -> st.SearchStrategy[Any]:
    """Values of ``$defs[definition]`` of ``doc``; ``override`` replaces some properties' strategies."""
    schema = _resolve(doc["$defs"][definition], doc["$defs"])
    if override:
        schema = {**schema, "properties": {**schema["properties"]}}
        for key in override:
            schema["properties"][key] = {}
    strategy = _values(schema)
    if not override:
        return strategy
    return st.tuples(strategy, st.fixed_dictionaries(override)).map(
        lambda both: {**both[0], **{k: v for k, v in both[1].items() if k in both[0]}}
    )


JSON = from_schema({})

# -- Mutations: what a hostile or broken client sends -------------------------------------------

_MARK = "\x00fuzz-raw\x00"
"""A string put in a value's place, then swapped for raw text once the value is JSON."""

HUGE_NUMBERS = (
    "1e999",
    "-1e999",
    "1e308",
    "-0",
    "1E+2",
    "0.1e-400",
    "9" * 400,
    "-" + "9" * 400,
    "NaN",
    "Infinity",
)
SURROGATES = (r'"\ud800"', r'"a\udfffb"', r'"\udc00\ud800"', r'"\ud83d\ude00"', '"\ud7ff"')
WRONG_TYPES: tuple[Any, ...] = (
    None,
    True,
    False,
    0,
    -1,
    1.5,
    "",
    "x",
    [],
    {},
    [None],
    {"a": 1},
    2**63,
    -(2**63),
)


@attrs.frozen
class Body:
    """A request body or a text frame: its bytes and how they were made."""

    kind: str
    data: bytes

    def __repr__(self) -> str:
        shown = self.data if len(self.data) <= 300 else self.data[:300] + b"..."
        return f"Body({self.kind}, {len(self.data)} bytes: {shown!r})"


def _deep(levels: int, opener: str) -> str:
    closer = "]" if opener == "[" else "}"
    if opener == "{":
        return '{"a":' * levels + "1" + "}" * levels
    return opener * levels + closer * levels


def _raw_into(value: dict[str, Any], key: str, raw: str) -> bytes:
    text = json.dumps({**value, key: _MARK})
    return text.replace(json.dumps(_MARK), raw, 1).encode("utf-8", "surrogatepass")


@st.composite
def mutated(draw: st.DrawFn, values: st.SearchStrategy[dict[str, Any]]) -> Body:
    """One value of ``values``, broken one way: a type, a field, a number, a depth, a string, the JSON."""
    value = draw(values)
    keys = sorted(value)
    kind = draw(
        st.sampled_from(
            [
                "wrong type",
                "missing field",
                "extra field",
                "huge number",
                "deep nesting",
                "lone surrogate",
                "invalid UTF-8",
                "truncated",
                "not an object",
                "not JSON",
                "empty",
            ]
        )
    )
    text = json.dumps(value)
    if kind in ("wrong type", "huge number", "deep nesting", "lone surrogate") and not keys:
        kind = "extra field"
    if kind == "wrong type":
        key = draw(st.sampled_from(keys))
        data = json.dumps({**value, key: draw(st.sampled_from(WRONG_TYPES))}).encode()
    elif kind == "missing field":
        key = draw(st.sampled_from(keys)) if keys else "type"
        data = json.dumps({k: v for k, v in value.items() if k != key}).encode()
    elif kind == "extra field":
        extra = draw(st.dictionaries(st.text(min_size=1, max_size=12), JSON, min_size=1, max_size=3))
        data = json.dumps({**extra, **value, **extra}).encode()
    elif kind == "huge number":
        data = _raw_into(value, draw(st.sampled_from(keys)), draw(st.sampled_from(HUGE_NUMBERS)))
    elif kind == "deep nesting":
        levels = draw(st.sampled_from([127, 128, 129, 1000, 5000, 100_000]))
        data = _raw_into(value, draw(st.sampled_from(keys)), _deep(levels, draw(st.sampled_from("[{"))))
    elif kind == "lone surrogate":
        data = _raw_into(value, draw(st.sampled_from(keys)), draw(st.sampled_from(SURROGATES)))
    elif kind == "invalid UTF-8":
        at = draw(st.integers(0, len(text)))
        bad = draw(st.sampled_from([b"\xff", b"\xc0\x80", b"\xed\xa0\x80", b"\xe2\x82", b"\x80"]))
        data = text.encode()[:at] + bad + text.encode()[at:]
    elif kind == "truncated":
        data = text.encode()[: draw(st.integers(0, max(0, len(text) - 1)))]
    elif kind == "not an object":
        data = json.dumps(
            draw(st.one_of(st.lists(JSON, max_size=3), st.text(), st.integers(), st.none()))
        ).encode()
    elif kind == "not JSON":
        data = draw(st.binary(min_size=1, max_size=64))
    else:
        data = b""
    return Body(kind, data)


def bodies(values: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[Body]:
    """Valid values (as JSON, ASCII-escaped or not) and mutated ones, about half each."""
    as_json = st.tuples(values, st.booleans()).map(
        lambda v: Body("valid", json.dumps(v[0], ensure_ascii=v[1]).encode("utf-8", "surrogatepass"))
    )
    return st.one_of(as_json, mutated(values))


# -- Paths and ids ---------------------------------------------------------------------------

BAD_SEGMENTS = (
    "%ED%A0%80",  # a surrogate, UTF-8-encoded
    "%FF",
    "%00",
    "..",
    "a%2Fb",
    "%2E%2E%2F%2E%2E%2Fetc",
    "runner",
    "x" * 129,
    "x" * 5000,
    "caf%C3%A9",
    "%20",
    "a;b",
    "x%2F",  # "//" once decoded: Werkzeug once redirected it
)


def segments(*known: str) -> st.SearchStrategy[str]:
    """A session id in a path: one the runner holds, a plausible one, or a hostile one (quoted)."""
    return st.one_of(
        st.sampled_from(known) if known else st.nothing(),
        st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9._:@+=~-]{0,20}\Z"),
        st.text(min_size=1, max_size=40).map(lambda s: quote(s.encode("utf-8", "surrogatepass"), safe="")),
        st.sampled_from(BAD_SEGMENTS),
    )


def query_values() -> st.SearchStrategy[str]:
    """A query parameter's value, quoted: a number of any size or sign, or any text."""
    return st.one_of(
        st.integers(min_value=-(10**30), max_value=10**30).map(str),
        st.integers(min_value=0, max_value=60_000).map(str),
        st.floats(allow_nan=True, allow_infinity=True).map(repr),
        st.sampled_from((*HUGE_NUMBERS, "", "0x10", " 1", "1 ", "\x00", "\ud800")),
        st.text(max_size=20),
    ).map(lambda s: quote(s.encode("utf-8", "surrogatepass"), safe=""))
