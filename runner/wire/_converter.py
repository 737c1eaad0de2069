"""The one cattrs converter between the protocol's types and JSON values.

Structuring is strict: a string is a string, an integer is never a bool or a float, and
unknown fields are ignored, as the protocol asks. A body that does not decode raises a
:class:`WireError` listing every problem, with paths in wire names.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import attrs
import cattrs
from cattrs.cols import list_structure_factory, mapping_structure_factory
from cattrs.errors import AttributeValidationNote, IterableValidationNote
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn, override

from ._types import (
    FieldError,
    Heartbeat,
    Issue,
    JSONObject,
    Lifecycle,
    LifecycleDraining,
    LifecycleEnded,
    LifecycleReady,
    LifecycleRecovered,
)

T = TypeVar("T")

_RENAMES = {"cls": "class", "base_url": "baseURL"}
_TAGS = frozenset({"event", "type", "name"})
_NAMES = {str: "a string", int: "an integer", float: "a number", type(None): "null"}
_LIFECYCLE: dict[str, type] = {
    "ready": LifecycleReady,
    "draining": LifecycleDraining,
    "ended": LifecycleEnded,
    "recovered": LifecycleRecovered,
}


def origin_of(annotation: Any) -> Any:
    """``typing.get_origin``, typed for any annotation (its overloads narrow to ``ParamSpec``)."""
    return typing.get_origin(annotation)


def wire_name(attribute: str) -> str:
    """The wire's name for an attribute: camelCase, with the protocol's exceptions."""
    if attribute in _RENAMES:
        return _RENAMES[attribute]
    head, *rest = attribute.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def _strict(expected: type, name: str) -> Any:
    def structure(value: Any, _: Any) -> Any:
        # bool is an int in Python, never on the wire.
        if type(value) is not expected and not (expected is float and type(value) is int):
            raise TypeError(f"expected {name}")
        return value

    return structure


def _make_converter() -> cattrs.Converter:
    converter = cattrs.Converter(omit_if_default=True, detailed_validation=True)
    converter.register_structure_hook(str, _strict(str, "a string"))
    converter.register_structure_hook(int, _strict(int, "an integer"))
    converter.register_structure_hook(bool, _strict(bool, "a boolean"))
    converter.register_structure_hook(float, _strict(float, "a number"))

    def structure_object(value: Any, _: Any) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise TypeError("expected an object")
        return value

    converter.register_structure_hook_func(
        lambda t: t in (dict[str, Any], Mapping[str, Any]), structure_object
    )

    def renames(cls: type) -> dict[str, Any]:
        return {
            a.name: override(rename=wire_name(a.name))
            for a in attrs.fields(cls)
            if wire_name(a.name) != a.name
        }

    def structure_factory(cls: type) -> Any:
        inner: Callable[..., Any] = make_dict_structure_fn(
            cls, converter, _cattrs_detailed_validation=True, **renames(cls)
        )
        _attribute_of = {wire_name(a.name): a.name for a in attrs.fields(cls)}
        wire_names = set(_attribute_of)

        nullable = {wire_name(a.name) for a in attrs.fields(cls) if a.metadata.get("nullable")}

        def structure(value: Any, target: type) -> Any:
            if not isinstance(value, dict):
                raise TypeError("expected an object")
            # An optional field may be left out; null is a value only where the protocol says so.
            nulls = [k for k, v in value.items() if v is None and k in wire_names and k not in nullable]
            if nulls:
                raise FieldError(_attribute_of[nulls[0]], "must not be null")
            return inner(value, target)

        return structure

    def unstructure_factory(cls: type) -> Any:
        # A tag (a record's event or type) is written even though it is its default.
        overrides = renames(cls)
        for a in attrs.fields(cls):
            if a.name in _TAGS:
                overrides[a.name] = override(omit_if_default=False)
        return make_dict_unstructure_fn(cls, converter, _cattrs_omit_if_default=True, **overrides)

    def structure_scalar_union(value: Any, target: Any) -> Any:
        args = typing.get_args(target)
        allowed = tuple(t for t in args if t is not type(None))
        if value is None and type(None) in args:
            return None
        if type(value) in allowed or (float in allowed and type(value) is int):
            return value
        raise TypeError("expected " + " or ".join(_NAMES.get(t, t.__name__) for t in allowed))

    converter.register_structure_hook_func(
        lambda t: (
            origin_of(t) in (types.UnionType, typing.Union)
            and all(a in (str, int, float, type(None)) for a in typing.get_args(t))
        ),
        structure_scalar_union,
    )

    def list_factory(target: Any) -> Any:
        inner = list_structure_factory(target, converter)

        def structure(value: Any, _: Any) -> list[Any]:
            # cattrs would happily iterate a string into a list of characters.
            if not isinstance(value, list):
                raise TypeError("expected an array")
            return inner(value, target)  # type: ignore[no-any-return]  # cattrs' structure hooks return Any

        return structure

    converter.register_structure_hook_factory(lambda t: origin_of(t) is list, list_factory)

    def dict_factory(target: Any) -> Any:
        inner = mapping_structure_factory(target, converter)

        def structure(value: Any, _: Any) -> dict[Any, Any]:
            # cattrs would call .items() on anything and report Python's own AttributeError.
            if not isinstance(value, dict):
                raise TypeError("expected an object")
            return inner(value, target)  # type: ignore[no-any-return]  # cattrs' structure hooks return Any

        return structure

    converter.register_structure_hook_factory(
        lambda t: origin_of(t) in (dict, Mapping) and t not in (dict[str, Any], Mapping[str, Any]),
        dict_factory,
    )

    def structure_heartbeat(value: Any, _: Any) -> Heartbeat:
        if isinstance(value, dict) and "envelope" in value:
            raise ValueError("a line with an envelope is a record, not a heartbeat")
        return structure_factory(Heartbeat)(value, Heartbeat)  # type: ignore[no-any-return]  # cattrs' structure hooks return Any

    converter.register_structure_hook(Heartbeat, structure_heartbeat)

    def structure_object_or_text(value: Any, _: Any) -> Any:
        if isinstance(value, (dict, str)):
            return value
        raise TypeError("expected an object or a string")

    converter.register_structure_hook_func(lambda t: t == (JSONObject | str), structure_object_or_text)

    def structure_lifecycle(value: Any, _: Any) -> Lifecycle:
        if not isinstance(value, dict) or value.get("event") not in _LIFECYCLE:
            raise ValueError("event must be one of " + ", ".join(_LIFECYCLE))
        return converter.structure(value, _LIFECYCLE[value["event"]])

    converter.register_structure_hook_func(lambda t: t == Lifecycle, structure_lifecycle)
    converter.register_structure_hook_factory(attrs.has, structure_factory)
    converter.register_unstructure_hook_factory(attrs.has, unstructure_factory)
    return converter


converter = _make_converter()


class WireError(Exception):
    """A body did not decode: ``issues`` says where and why."""

    def __init__(self, issues: list[Issue]) -> None:
        super().__init__("; ".join(f"{_dotted(i.path)}: {i.message}" for i in issues))
        self.issues = issues


def _dotted(path: list[str | int]) -> str:
    return ".".join(str(p) for p in path) or "(body)"


def _issues(exc: BaseException, path: list[str | int]) -> list[Issue]:
    if isinstance(exc, BaseExceptionGroup):
        found: list[Issue] = []
        for sub in exc.exceptions:
            sub_path = list(path)
            for note in getattr(sub, "__notes__", ()):
                if isinstance(note, AttributeValidationNote):
                    sub_path.append(wire_name(note.name))
                elif isinstance(note, IterableValidationNote):
                    sub_path.append(note.index)
            found.extend(_issues(sub, sub_path))
        return found
    if isinstance(exc, KeyError):
        return [Issue(path=path, message="is required")]
    if isinstance(exc, FieldError):
        return [Issue(path=[*path, wire_name(exc.attribute)], message=str(exc))]
    message = str(exc) or type(exc).__name__
    if (isinstance(exc, ValueError) and "not in" in message.lower()) or "literal" in message.lower():
        message = "is not one of the allowed values"
    elif not isinstance(exc, (TypeError, ValueError)) or type(exc).__module__.startswith("cattrs"):
        # Python's or cattrs' own words ("'list' object has no attribute 'items'") say nothing
        # to a caller: say that the value is of a type the protocol does not take there.
        message = "does not have the expected type"
    return [Issue(path=path, message=message)]


def decode(cls: type[T], value: Any) -> T:
    """Structure a JSON value as ``cls``.

    Raises:
        WireError: With one issue per problem, paths in wire names.
    """
    try:
        return converter.structure(value, cls)
    except Exception as exc:
        # cattrs reports every problem at once as an exception group; keep them all.
        raise WireError(_issues(exc, [])) from exc


def encode(value: Any) -> Any:
    """Unstructure a wire type (or a list of them) to JSON-ready values."""
    return converter.unstructure(value)
