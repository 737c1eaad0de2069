"""Every type of the host protocol, and the one converter between them and JSON.

Attributes are snake_case; the wire is camelCase, renamed here and nowhere else.
Structuring is strict: a string is a string, an integer is never a bool or a float,
and unknown fields are ignored, as the protocol asks. Pure: no Trio, no Quart.
"""

from __future__ import annotations

import json
import math
import re
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, Literal, TypeVar

import attrs
import cattrs
from cattrs.cols import list_structure_factory
from cattrs.errors import AttributeValidationNote, IterableValidationNote
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn, override

from journal import Record

T = TypeVar("T")

PROTOCOL_VERSION = 1
PROTOCOL_VERSIONS = (1,)

State = Literal["starting", "connected", "ending", "ended"]
JSONObject = dict[str, Any]
Direction = Literal["inbound", "outbound"]


class FieldError(ValueError):
    """A validator refused one field's value."""

    def __init__(self, attribute: str, message: str) -> None:
        super().__init__(message)
        self.attribute = attribute


def _non_empty(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and value == "":
        raise FieldError(attribute.name, "must be a non-empty string")


# The session-id alphabet (docs/host-protocol.md): it is a URL path segment and a journal
# producer, so no "/" or "%" and nothing that needs escaping, and not the runner's own producer.
SESSION_ID_MAX = 128
_SESSION_ID = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._:@+=~-]{{0,{SESSION_ID_MAX - 1}}}")
RESERVED_PRODUCERS = frozenset({"runner"})


def _session_id(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not _SESSION_ID.fullmatch(value):
        raise FieldError(
            attribute.name,
            f"must be 1 to {SESSION_ID_MAX} characters of A-Z a-z 0-9 . _ : @ + = ~ -,"
            " starting with a letter or digit",
        )
    if value in RESERVED_PRODUCERS:
        raise FieldError(attribute.name, f"{value!r} is reserved for the runner's own records")


def _positive(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and value < 1:
        raise FieldError(attribute.name, "must be a positive integer")


def _at_least(low: int) -> Any:
    def check(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if value is not None and value < low:
            raise FieldError(attribute.name, f"must be at least {low}")

    return check


def _equals(expected: Any) -> Any:
    def check(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if value != expected or type(value) is not type(expected):
            raise FieldError(attribute.name, f"must be {expected!r}")

    return check


def _length(low: int, high: int) -> Any:
    def check(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if value is not None and not low <= len(value) <= high:
            raise FieldError(attribute.name, f"must be {low} to {high} characters")

    return check


# -- Health and errors ---------------------------------------------------------------------


ErrorCode = Literal[
    "unauthorized",
    "unknown_version",
    "not_found",
    "invalid_request",
    "session_not_found",
    "runner_at_capacity",
    "generation_mismatch",
    "runner_draining",
    "start_failed",
    "runner_takes_no_calls",
    "cursor_too_old",
    "no_journal",
    "internal",
    "no_handler",
    "invalid_payload",
    "handler_failed",
    "not_adjustable",
    "invalid_settings",
]


@attrs.frozen(kw_only=True)
class Health:
    ok: bool = attrs.field(validator=_equals(True))
    protocol_version: int = attrs.field(validator=_equals(1))
    versions: list[int] = attrs.field(validator=_length(1, 1 << 16))


@attrs.frozen(kw_only=True)
class Issue:
    """One problem with a request body: where (keys and indexes) and what."""

    path: list[str | int]
    message: str


@attrs.frozen(kw_only=True)
class ErrorBody:
    """Every non-2xx answer. Classify by ``error``; ``detail`` is prose."""

    error: ErrorCode
    detail: str | None = None
    versions: list[int] | None = None
    requested: int | None = attrs.field(default=None, validator=_at_least(0))
    oldest_retained: int | None = attrs.field(default=None, validator=_at_least(1))
    path: str | None = None
    issues: list[Issue] | None = None


@attrs.frozen(kw_only=True)
class Heartbeat:
    """An idle stream's keep-alive line: no envelope, never a cursor."""

    ping: int = attrs.field(validator=_at_least(0))


# -- Records -------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class JournalRecord:
    """One stream line: a committed record (the journal's :class:`~journal.Record`, on the wire)."""

    envelope: int = attrs.field(validator=_at_least(1))
    producer: str = attrs.field(validator=_non_empty)
    seq: int = attrs.field(validator=_at_least(1))
    cls: str = attrs.field(validator=_non_empty)
    at: int = attrs.field(validator=_at_least(0))
    body: JSONObject

    @classmethod
    def from_record(cls, record: Record) -> JournalRecord:
        return cls(
            envelope=record.envelope,
            producer=record.producer,
            seq=record.seq,
            cls=record.cls,
            at=record.at,
            body=dict(record.body),
        )


@attrs.frozen(kw_only=True)
class LifecycleReady:
    event: Literal["ready"] = "ready"
    address: str = attrs.field(validator=_non_empty)
    max_sessions: int = attrs.field(validator=_at_least(1))
    warmup_ms: int = attrs.field(validator=_at_least(0))


DrainReason = Literal["SIGTERM", "SIGINT", "drain_request", "call_ended"]


@attrs.frozen(kw_only=True)
class LifecycleDraining:
    event: Literal["draining"] = "draining"
    reason: DrainReason
    active_sessions: int = attrs.field(validator=_at_least(0))


@attrs.frozen(kw_only=True)
class LifecycleEnded:
    event: Literal["ended"] = "ended"
    reason: str = attrs.field(validator=_non_empty)


@attrs.frozen(kw_only=True)
class LifecycleRecovered:
    """Written at start when a crash left calls whose record never ended."""

    event: Literal["recovered"] = "recovered"
    closed_sessions: list[str] = attrs.field(validator=attrs.validators.deep_iterable(_non_empty))


Lifecycle = LifecycleReady | LifecycleDraining | LifecycleEnded | LifecycleRecovered

# -- Calls ---------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class StartCallRequest:
    """``POST /v1/sessions``. Strings non-empty; unknown fields ignored."""

    session_id: str = attrs.field(validator=_session_id)
    realtime_url: str = attrs.field(validator=_non_empty)
    realtime_token: str = attrs.field(validator=_non_empty)
    deployment_id: str | None = attrs.field(default=None, validator=_non_empty)
    configuration_version: int | None = attrs.field(default=None, validator=_positive)
    client_context: dict[str, str] | None = None
    direction: Direction = "inbound"
    experiments: dict[str, str] | None = None


@attrs.frozen(kw_only=True)
class LiveCall:
    session_id: str = attrs.field(validator=_non_empty)
    state: State
    started_at_ms: int = attrs.field(validator=_at_least(0))


@attrs.frozen(kw_only=True)
class StartCallResponse:
    """The 202 answer to a start: ``accepted`` is false for an idempotent repeat."""

    session_id: str = attrs.field(validator=_non_empty)
    accepted: bool
    call: LiveCall


@attrs.frozen(kw_only=True)
class StopCallResponse:
    """The 200 answer to a stop: ``stopped`` is false when the runner held no such call."""

    session_id: str = attrs.field(validator=_non_empty)
    stopped: bool


@attrs.frozen(kw_only=True)
class RunnerStatus:
    protocol_version: int = attrs.field(validator=_equals(1))
    deployment_id: str | None = attrs.field(default=None, validator=_non_empty)
    configuration_version: int | None = attrs.field(default=None, validator=_positive)
    max_sessions: int = attrs.field(validator=_at_least(1))
    active_sessions: int = attrs.field(validator=_at_least(0))
    draining: bool
    sessions: list[LiveCall]


# -- Messages --------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class HostMessage:
    """``POST /v1/sessions/{id}/messages``: a keyed message from the host to the agent."""

    id: str = attrs.field(validator=_length(1, 128))
    name: str = attrs.field(validator=_length(1, 256))
    payload: JSONObject
    in_reply_to: str | None = attrs.field(default=None, validator=_length(1, 128))


@attrs.frozen(kw_only=True)
class HostMessageAccepted:
    """The 202 answer: ``delivered`` is false when that id was already delivered."""

    id: str = attrs.field(validator=_length(1, 128))
    delivered: bool


def _truncated_payload(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if isinstance(instance.payload, str) and instance.truncated is not True:
        raise FieldError("truncated", "must be true when the payload is kept as text")


@attrs.frozen(kw_only=True)
class HostRecordBody:
    """The body of a ``host`` record: the agent's message to the host."""

    type: Literal["host"] = "host"
    seq: int = attrs.field(validator=_at_least(1))
    at: int = attrs.field(validator=_at_least(0))
    id: str
    name: str = attrs.field(validator=_length(1, 256))
    payload: JSONObject | str
    expects_reply: bool
    truncated: bool | None = attrs.field(default=None, validator=_truncated_payload)


@attrs.frozen(kw_only=True)
class ConversationEventBody:
    """The body of a ``conversation`` record that is an event."""

    type: Literal["event"] = "event"
    seq: int = attrs.field(validator=_at_least(1))
    at: int = attrs.field(validator=_at_least(0))
    name: str = attrs.field(validator=_non_empty)
    payload: JSONObject


@attrs.frozen(kw_only=True)
class CallStarted:
    client_context: dict[str, str]
    direction: Direction
    experiments: dict[str, str]
    deployment_id: str | None = attrs.field(default=None, validator=_non_empty)
    configuration_version: int | None = attrs.field(default=None, validator=_positive)
    transport: str = attrs.field(validator=_non_empty)


@attrs.frozen(kw_only=True)
class CallEnded:
    reason: str = attrs.field(validator=_non_empty)


@attrs.frozen(kw_only=True)
class CallMessages:
    """Counts of what a call could not deliver, written before it ends."""

    undelivered_to_client: dict[str, int] = attrs.field(
        validator=attrs.validators.deep_mapping(attrs.validators.instance_of(str), _at_least(0))
    )
    refused_queued_host_messages: int = attrs.field(validator=_at_least(0))


@attrs.frozen(kw_only=True)
class CallStartedEvent:
    type: Literal["event"] = "event"
    seq: int = attrs.field(validator=_at_least(1))
    at: int = attrs.field(validator=_at_least(0))
    name: Literal["curb.started"] = "curb.started"
    payload: CallStarted


@attrs.frozen(kw_only=True)
class CallEndedEvent:
    type: Literal["event"] = "event"
    seq: int = attrs.field(validator=_at_least(1))
    at: int = attrs.field(validator=_at_least(0))
    name: Literal["curb.ended"] = "curb.ended"
    payload: CallEnded


@attrs.frozen(kw_only=True)
class CallMessagesEvent:
    type: Literal["event"] = "event"
    seq: int = attrs.field(validator=_at_least(1))
    at: int = attrs.field(validator=_at_least(0))
    name: Literal["curb.messages"] = "curb.messages"
    payload: CallMessages


# -- Live session settings -------------------------------------------------------------------

LLMProvider = Literal["kugelaudio", "anthropic", "openai", "openai-compatible"]
Voice = str | int | float


@attrs.frozen(kw_only=True)
class TTSUpdate:
    voice: Voice | None = None
    model: str | None = None


@attrs.frozen(kw_only=True)
class STTUpdate:
    language: str | None = None


@attrs.frozen(kw_only=True)
class LLMChoice:
    provider: LLMProvider
    model: str
    base_url: str | None = None


@attrs.frozen(kw_only=True)
class SessionUpdate:
    """A live settings change, the same from the host (PATCH) and the client (curb.update)."""

    tts: TTSUpdate | None = None
    stt: STTUpdate | None = None
    llm: LLMChoice | None = None


_NULLABLE = {"nullable": True}


@attrs.frozen(kw_only=True)
class EffectiveTTS:
    provider: str
    voice: Voice | None = attrs.field(default=None, metadata=_NULLABLE)
    model: str | None = attrs.field(default=None, metadata=_NULLABLE)
    options: JSONObject | None = None


@attrs.frozen(kw_only=True)
class EffectiveSTT:
    provider: str
    language: str | None = attrs.field(default=None, metadata=_NULLABLE)


@attrs.frozen(kw_only=True)
class EffectiveLLM:
    provider: str
    model: str
    base_url: str | None = None


@attrs.frozen(kw_only=True)
class EffectiveSettings:
    """The settings a call runs with. Never a credential."""

    tts: EffectiveTTS
    stt: EffectiveSTT
    llm: EffectiveLLM


@attrs.frozen(kw_only=True)
class SessionSettingsResponse:
    session_id: str = attrs.field(validator=_non_empty)
    settings: EffectiveSettings


# -- The converter -------------------------------------------------------------------------

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
    return [Issue(path=path, message=message)]


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


_ENCODER = json.JSONEncoder(separators=(",", ":"))


def json_bytes(value: Any) -> bytes:
    """A wire type (or plain JSON value) as compact JSON, UTF-8."""
    return _ENCODER.encode(encode(value)).encode()
