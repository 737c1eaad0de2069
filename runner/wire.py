"""Every type of the host protocol, and the one converter between them and JSON.

Attributes are snake_case; the wire is camelCase, renamed here and nowhere else.
Structuring is strict: a string is a string, an integer is never a bool or a float,
and unknown fields are ignored, as the protocol asks. Pure: no Trio, no Quart.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal, TypeVar

import attrs
import cattrs
from cattrs.errors import AttributeValidationNote, IterableValidationNote
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn, override

from journal import Record

T = TypeVar("T")

PROTOCOL_VERSION = 1
PROTOCOL_VERSIONS = (1,)

State = Literal["starting", "connected", "ending", "ended"]
Direction = Literal["inbound", "outbound"]


class FieldError(ValueError):
    """A validator refused one field's value."""

    def __init__(self, attribute: str, message: str) -> None:
        super().__init__(message)
        self.attribute = attribute


def _non_empty(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and value == "":
        raise FieldError(attribute.name, "must be a non-empty string")


def _positive(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and value < 1:
        raise FieldError(attribute.name, "must be a positive integer")


def _length(low: int, high: int) -> Any:
    def check(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if value is not None and not low <= len(value) <= high:
            raise FieldError(attribute.name, f"must be {low} to {high} characters")

    return check


# -- Health and errors ---------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Health:
    ok: bool
    protocol_version: int
    versions: list[int]


@attrs.frozen(kw_only=True)
class Issue:
    """One problem with a request body: where (keys and indexes) and what."""

    path: list[str | int]
    message: str


@attrs.frozen(kw_only=True)
class ErrorBody:
    """Every non-2xx answer. Classify by ``error``; ``detail`` is prose."""

    error: str
    detail: str | None = None
    versions: list[int] | None = None
    requested: int | None = None
    oldest_retained: int | None = None
    path: str | None = None
    issues: list[Issue] | None = None


# -- Records -------------------------------------------------------------------------------

JournalRecord = Record


@attrs.frozen(kw_only=True)
class LifecycleReady:
    event: Literal["ready"] = attrs.field(default="ready", init=False)
    address: str
    max_sessions: int
    warmup_ms: int


@attrs.frozen(kw_only=True)
class LifecycleDraining:
    event: Literal["draining"] = attrs.field(default="draining", init=False)
    reason: Literal["SIGTERM", "SIGINT", "drain_request", "call_ended"]
    active_sessions: int


@attrs.frozen(kw_only=True)
class LifecycleEnded:
    event: Literal["ended"] = attrs.field(default="ended", init=False)
    reason: str


@attrs.frozen(kw_only=True)
class LifecycleRecovered:
    """Written at start when a crash left calls whose record never ended."""

    event: Literal["recovered"] = attrs.field(default="recovered", init=False)
    closed_sessions: list[str]


Lifecycle = LifecycleReady | LifecycleDraining | LifecycleEnded | LifecycleRecovered

# -- Calls ---------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class StartCallRequest:
    """``POST /v1/sessions``. Strings non-empty; unknown fields ignored."""

    session_id: str = attrs.field(validator=_non_empty)
    realtime_url: str = attrs.field(validator=_non_empty)
    realtime_token: str = attrs.field(validator=_non_empty)
    deployment_id: str | None = attrs.field(default=None, validator=_non_empty)
    configuration_version: int | None = attrs.field(default=None, validator=_positive)
    client_context: dict[str, str] | None = None
    direction: Direction = "inbound"
    experiments: dict[str, str] | None = None


@attrs.frozen(kw_only=True)
class LiveCall:
    session_id: str
    state: State
    started_at_ms: int


@attrs.frozen(kw_only=True)
class StartCallResponse:
    """The 202 answer to a start: ``accepted`` is false for an idempotent repeat."""

    session_id: str
    accepted: bool
    call: LiveCall


@attrs.frozen(kw_only=True)
class StopCallResponse:
    """The 200 answer to a stop: ``stopped`` is false when the runner held no such call."""

    session_id: str
    stopped: bool


@attrs.frozen(kw_only=True)
class RunnerStatus:
    protocol_version: int
    deployment_id: str | None = None
    configuration_version: int | None = None
    max_sessions: int
    active_sessions: int
    draining: bool
    sessions: list[LiveCall]


# -- The converter -------------------------------------------------------------------------

_RENAMES = {"cls": "class", "base_url": "baseURL"}


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
        inner = make_dict_structure_fn(
            cls, converter, _cattrs_detailed_validation=True, **renames(cls)
        )

        def structure(value: Any, target: type) -> Any:
            if not isinstance(value, dict):
                raise TypeError("expected an object")
            return inner(value, target)

        return structure

    def unstructure_factory(cls: type) -> Any:
        # Fields with init=False (an event's tag) are always written.
        keep = {a.name: override(omit_if_default=False) for a in attrs.fields(cls) if not a.init}
        overrides = renames(cls)
        for name, extra in keep.items():
            overrides[name] = override(rename=overrides.get(name, override()).rename, omit_if_default=False)
        return make_dict_unstructure_fn(
            cls,
            converter,
            _cattrs_omit_if_default=True,
            _cattrs_include_init_false=True,
            **overrides,
        )

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
    if isinstance(exc, ValueError) and "not in" in message.lower() or "literal" in message.lower():
        message = "is not one of the allowed values"
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


def record_line(record: Record) -> dict[str, Any]:
    """A record as a stream line object."""
    return {
        "envelope": record.envelope,
        "producer": record.producer,
        "seq": record.seq,
        "class": record.cls,
        "at": record.at,
        "body": dict(record.body),
    }
