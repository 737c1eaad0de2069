"""JSON as the protocol takes it: parsed strictly, written compactly."""

from __future__ import annotations

import json
import math
from typing import Any

from ._converter import encode

MAX_JSON_DEPTH = 128
"""Objects and arrays nested deeper than this are refused (docs/host-protocol.md)."""


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"{text[:32]} is too large for a number")
    return value


# One decoder: json.loads with any option builds a new one per call, which costs as much as
# parsing a small record (a host's follower parses every stream line).
_DECODER = json.JSONDecoder(parse_constant=_not_json, parse_float=_finite)


def _check_text(text: str) -> None:
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("a string holds a lone surrogate: not Unicode text") from None


def _check_value(value: Any, *, depth: bool, text: bool) -> None:
    """Refuse containers nested deeper than MAX_JSON_DEPTH, and (``text``) lone surrogates."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            if depth and level > MAX_JSON_DEPTH:
                raise ValueError(f"nested deeper than {MAX_JSON_DEPTH} levels")
            for key, child in item.items():
                if text:
                    _check_text(key)
                stack.append((child, level + 1))
        elif isinstance(item, list):
            if depth and level > MAX_JSON_DEPTH:
                raise ValueError(f"nested deeper than {MAX_JSON_DEPTH} levels")
            stack.extend((child, level + 1) for child in item)
        elif text and isinstance(item, str):
            _check_text(item)


def parse_json(text: str | bytes) -> Any:
    """Parse JSON as RFC 8259 defines it, as this runner can keep it.

    Refused, as no record could keep them and no host could read them back: ``NaN``,
    ``Infinity`` and ``-Infinity`` (which Python's ``json`` reads), a number too large for
    a double (``1e999``), a lone surrogate escaped in a string (``"\\ud800"``: strings are
    Unicode scalar values), and nesting deeper than :data:`MAX_JSON_DEPTH`.

    Raises:
        ValueError: ``text`` is not such JSON.
    """
    raw = not isinstance(text, str)
    if not isinstance(text, str):
        # What json.loads does with bytes (surrogates encoded in the bytes come through).
        text = text.decode(json.detect_encoding(text), "surrogatepass")
    try:
        value = _DECODER.decode(text)
    except RecursionError:
        raise ValueError(f"nested deeper than {MAX_JSON_DEPTH} levels") from None
    deep = text.count("[") + text.count("{") > MAX_JSON_DEPTH
    escaped = "\\u" in text or (raw and not text.isascii())
    if deep or escaped:
        _check_value(value, depth=deep, text=escaped)
    return value


_ENCODER = json.JSONEncoder(separators=(",", ":"))


def json_bytes(value: Any) -> bytes:
    """A wire type (or plain JSON value) as compact JSON, UTF-8."""
    return _ENCODER.encode(encode(value)).encode()
