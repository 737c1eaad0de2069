"""The one converter between the frames, the REST bodies and JSON, and the codec over it.

Strict in what it reads (a string is a string, a field the verb does not take is refused), and it
writes every field. Times are written as the API writes them (:func:`rfc3339`).
"""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, TypeVar, cast

import attrs
import cattrs

from ..wire import origin_of, parse_json
from ._limits import MAX_RECORDING_ID_CHARS, FrameInvalid, FrameRejected, LimitError
from ._verbs import VERBS, UserAudioStart, Verb

T = TypeVar("T")

# -- The converter -------------------------------------------------------------------------

_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "a boolean"}


def _strict(expected: type) -> Any:
    def structure(value: Any, _: Any) -> Any:
        # bool is an int in Python, never on the wire.
        if type(value) is not expected and not (expected is float and type(value) is int):
            raise TypeError(f"must be {_NAMES[expected]}")
        return value

    return structure


def _make_converter() -> cattrs.Converter:
    converter = cattrs.Converter(detailed_validation=True)
    for kind in (str, int, float, bool):
        converter.register_structure_hook(kind, _strict(kind))

    def structure_optional(value: Any, target: Any) -> Any:
        if value is None:
            return None
        (inner,) = [a for a in typing.get_args(target) if a is not type(None)]
        return converter.structure(value, inner)

    converter.register_structure_hook_func(
        lambda t: (
            origin_of(t) in (typing.Union, types.UnionType)
            and type(None) in typing.get_args(t)
            and len(typing.get_args(t)) == 2
        ),
        structure_optional,
    )

    def structure_list(value: Any, target: Any) -> list[Any]:
        if not isinstance(value, list):
            raise TypeError("must be an array")
        (inner,) = typing.get_args(target)
        items = []
        for index, item in enumerate(value):
            try:
                items.append(converter.structure(item, inner))
            except Exception as exc:  # noqa: BLE001 - cattrs raises many kinds; each becomes the item's TypeError
                raise TypeError(f"item {index} {exc}") from None
        return items

    converter.register_structure_hook_func(lambda t: origin_of(t) is list, structure_list)

    def structure_object(value: Any, _: Any) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise TypeError("must be an object")
        return value

    converter.register_structure_hook_func(
        lambda t: t in (dict[str, Any], Mapping[str, Any]), structure_object
    )
    return converter


converter = _make_converter()


def _first_problem(exc: BaseException, path: list[str]) -> tuple[list[str], BaseException]:
    """The first leaf error of a cattrs exception group, with the field path it names."""
    if isinstance(exc, BaseExceptionGroup):
        sub = exc.exceptions[0]
        for note in getattr(sub, "__notes__", ()):
            name = getattr(note, "name", None)
            if name is not None:
                return _first_problem(sub, [*path, name])
        return _first_problem(sub, path)
    return path, exc


def decode_verb(text: str) -> Verb:
    """A client's text frame as its verb.

    Raises:
        FrameRejected: Not JSON, no or an unknown type, a field the verb does not take, a
            missing field or one of the wrong type (the socket closes with 4009).
        FrameInvalid: A field outside its limits (answered with ``validation_failed``).
    """
    try:
        value = parse_json(text)
    except ValueError:
        raise FrameRejected("the frame is not JSON") from None
    return verb_of(value)


def verb_of(value: Any) -> Verb:
    """A client's frame, parsed already, as its verb (the second half of :func:`decode_verb`).

    Raises:
        FrameRejected: As :func:`decode_verb`.
        FrameInvalid: As :func:`decode_verb`.
    """
    if not isinstance(value, dict):
        raise FrameRejected("a frame is a JSON object")
    kind = value.get("type")
    if not isinstance(kind, str):
        raise FrameRejected("the frame has no type")
    cls = VERBS.get(kind)
    if cls is None:
        raise FrameRejected(f"unknown verb {kind[:64]!r}")
    allowed = {a.name for a in attrs.fields(cls)}
    extra = [k for k in value if k != "type" and k not in allowed]
    if extra:
        raise FrameRejected(f"{kind} takes no field {extra[0][:64]!r}")
    # null is the same as leaving an optional field out.
    fields = {k: v for k, v in value.items() if k != "type" and v is not None}
    try:
        return converter.structure(fields, cls)  # type: ignore[no-any-return]  # cls is one of the frame classes; cattrs returns Any for a variable class
    except Exception as exc:  # noqa: BLE001 - cattrs raises many kinds (and groups); _first_problem reads them
        path, problem = _first_problem(exc, [])
        field = ".".join(path) or "(frame)"
        if isinstance(problem, LimitError):
            raise FrameInvalid(
                kind,
                problem.field,
                str(problem).removeprefix(problem.field + " "),
                recording_id=_recording_id(fields) if cls is UserAudioStart else None,
            ) from None
        if isinstance(problem, KeyError):
            raise FrameRejected(f"{kind} needs {problem.args[0]!r}") from None
        raise FrameRejected(f"{kind}.{field} {problem}") from None


def _recording_id(fields: dict[str, Any]) -> str | None:
    """The frame's recording_id, when it is a good one (a bad one is not echoed)."""
    value = fields.get("recording_id")
    if isinstance(value, str) and 1 <= len(value) <= MAX_RECORDING_ID_CHARS:
        return value
    return None


def encode_frame(frame: Any, seq: int, *, kind: str | None = None) -> str:
    """A runner frame as its JSON text: ``type`` and ``seq`` first, then every field.

    ``kind`` is the frame's type for an object that does not name it (a turn's event written
    as it is); a frame of this package names its own.
    """
    body = {"type": kind or frame.TYPE, "seq": seq, **converter.unstructure(frame)}
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False, default=str)


def decode_body(cls: type[T], value: Any) -> T:
    """A REST body as ``cls``; raises FrameRejected or FrameInvalid naming the field."""
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise FrameRejected("the body must be a JSON object")
    allowed = {a.name for a in attrs.fields(cast("type[attrs.AttrsInstance]", cls))}
    extra = [k for k in value if k not in allowed]
    if extra:
        raise FrameRejected(f"unknown field {extra[0][:64]!r}")
    fields = {k: v for k, v in value.items() if v is not None}
    try:
        return converter.structure(fields, cls)
    except Exception as exc:  # noqa: BLE001 - cattrs raises many kinds (and groups); _first_problem reads them
        path, problem = _first_problem(exc, [])
        if isinstance(problem, LimitError):
            raise FrameInvalid(
                "body", problem.field, str(problem).removeprefix(problem.field + " ")
            ) from None
        raise FrameRejected(f"{'.'.join(path) or '(body)'} {problem}") from None


def encode(value: Any) -> Any:
    """A REST body as JSON-ready values, every field written."""
    return converter.unstructure(value)


def rfc3339(ms: int) -> str:
    """Milliseconds since the epoch as the API writes times: ``2026-11-29T20:28:11Z``."""
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
