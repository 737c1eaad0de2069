"""Every frame of the agent WebSocket (subprotocol ``ino.v2``), its REST bodies, and the one
converter between them and JSON.

This wire is not the host protocol's (``runner.wire``), and its rules are the opposite ones,
so it has its own converter: names are snake_case as written (no renaming), a frame the
client sends may hold only the fields its verb takes (the host protocol ignores unknown
fields), and every field of a frame the runner sends is written, ``null`` where it does not
apply (the host protocol omits absent optionals). ``runner/ino.schema.json`` states the
same frames as JSON Schema; a test keeps the two in step. Pure: no Trio, no Quart.
"""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, ClassVar, Literal, TypeVar, cast

import attrs
import cattrs

from .wire import origin_of, parse_json

T = TypeVar("T")

PROTOCOL = "ino.v2"
CODEC = "pcm_s16le"
RATES_HZ = (8000, 16000, 22050, 24000, 44100)
MAX_TEXT_CHARS = 32_000
AGENT_STREAM_PATH = "/v1/agent/stream"
# One recording's cap; past it the socket closes 4011 with this reason.
MAX_RECORDING_BYTES = 10_000_000
RECORDING_TOO_LONG = "the recording passed 10 MB: send long audio to POST /v1/transcriptions"
MAX_RECORDING_ID_CHARS = 64
MAX_APP_TOOLS = 50
MAX_TOOL_ERROR_CHARS = 2000

# -- Validation failures ---------------------------------------------------------------------


class LimitError(ValueError):
    """A field is of the right type but outside the protocol's limits (``validation_failed``)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field} {message}")
        self.field = field


class FrameRejected(Exception):
    """A frame that cannot be understood: the socket closes with 4009 and this reason."""


class FrameInvalid(Exception):
    """A verb that was understood but breaks a limit: answered with ``validation_failed``."""

    def __init__(self, verb: str, field: str, message: str, *, recording_id: str | None = None) -> None:
        super().__init__(f"{verb}.{field} {message}")
        self.verb = verb
        self.field = field
        # The recording a refused user_audio.start named (an error about it carries it).
        self.recording_id = recording_id


def _length(low: int, high: int) -> Any:
    def check(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if value is not None and not low <= len(value) <= high:
            raise LimitError(attribute.name, f"must be {low} to {high} characters")

    return check


def _rate(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and value not in RATES_HZ:
        raise LimitError(attribute.name, "must be one of " + ", ".join(map(str, RATES_HZ)))


def _at_most(high: int) -> Any:
    def check(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if value is not None and len(value) > high:
            raise LimitError(attribute.name, f"may name at most {high}")

    return check


# -- What the client sends: the nine verbs -----------------------------------------------------


@attrs.frozen(kw_only=True)
class Auth:
    TYPE: ClassVar[str] = "auth"
    key: str
    session_id: str
    tools: list[str] | None = attrs.field(default=None, validator=_at_most(MAX_APP_TOOLS))


@attrs.frozen(kw_only=True)
class UserMessage:
    TYPE: ClassVar[str] = "user_message"
    text: str = attrs.field(validator=_length(1, MAX_TEXT_CHARS))
    speech: bool | None = None
    thoughts: bool | None = None


@attrs.frozen(kw_only=True)
class UserAudioStart:
    TYPE: ClassVar[str] = "user_audio.start"
    rate: int | None = attrs.field(default=None, validator=_rate)
    language: str | None = attrs.field(default=None, validator=_length(2, 8))
    model: str | None = attrs.field(default=None, validator=_length(1, 128))
    recording_id: str | None = attrs.field(default=None, validator=_length(1, MAX_RECORDING_ID_CHARS))
    barge_in: bool | None = None
    speech: bool | None = None
    thoughts: bool | None = None


@attrs.frozen(kw_only=True)
class UserAudioEnd:
    TYPE: ClassVar[str] = "user_audio.end"
    transcribe_only: bool | None = None
    discard: bool | None = None


@attrs.frozen(kw_only=True)
class Cancel:
    TYPE: ClassVar[str] = "cancel"


@attrs.frozen(kw_only=True)
class Mute:
    TYPE: ClassVar[str] = "mute"


@attrs.frozen(kw_only=True)
class Ping:
    TYPE: ClassVar[str] = "ping"


@attrs.frozen(kw_only=True)
class ToolConfirmed:
    TYPE: ClassVar[str] = "tool.confirmed"
    call_id: str
    yes: bool
    speech: bool | None = None
    thoughts: bool | None = None


@attrs.frozen(kw_only=True)
class ToolResult:
    """The app's answer to a ``tool.call``: ``error`` when sent is the answer, else ``result``."""

    TYPE: ClassVar[str] = "tool.result"
    call_id: str
    result: Any = None
    error: str | None = attrs.field(default=None, validator=_length(1, MAX_TOOL_ERROR_CHARS))


Verb = Auth | UserMessage | UserAudioStart | UserAudioEnd | Cancel | Mute | Ping | ToolConfirmed | ToolResult
VERBS: dict[str, type[Any]] = {
    cls.TYPE: cls
    for cls in (
        Auth,
        UserMessage,
        UserAudioStart,
        UserAudioEnd,
        Cancel,
        Mute,
        Ping,
        ToolConfirmed,
        ToolResult,
    )
}

# -- What the runner sends -----------------------------------------------------------------


@attrs.frozen(kw_only=True)
class AudioFormat:
    codec: str = CODEC
    sample_rate: int
    channels: int = 1


@attrs.frozen(kw_only=True)
class RelationNoteBody:
    note: str
    recorded_at: str


@attrs.frozen(kw_only=True)
class RelationBody:
    """The standing relationship of the agent with a person (``ready.relation``, ``GET /v1/agent/relations``)."""

    agent_id: str
    end_user_id: str
    conversations: int
    first_at: str
    last_at: str
    notes: list[RelationNoteBody]


@attrs.frozen(kw_only=True)
class Ready:
    TYPE: ClassVar[str] = "ready"
    protocol: str = PROTOCOL
    session_id: str
    agent_id: str
    end_user_id: str
    speaks: bool
    audio: AudioFormat
    hearing: AudioFormat
    emotion: bool
    relation: RelationBody | None
    greeting: bool
    idle_seconds: int
    edge_version: str


@attrs.frozen(kw_only=True)
class TurnStart:
    TYPE: ClassVar[str] = "turn.start"
    turn: str
    session_id: str


@attrs.frozen(kw_only=True)
class HeardPartial:
    TYPE: ClassVar[str] = "heard.partial"
    text: str


@attrs.frozen(kw_only=True)
class BargeIn:
    TYPE: ClassVar[str] = "barge_in"
    text: str
    recording_id: str | None
    turn: str | None


@attrs.frozen(kw_only=True)
class Heard:
    TYPE: ClassVar[str] = "heard"
    turn: str
    text: str
    audio_seconds: float


@attrs.frozen(kw_only=True)
class Transcript:
    TYPE: ClassVar[str] = "transcript"
    text: str
    audio_seconds: float
    request_id: str
    recording_id: str | None


@attrs.frozen(kw_only=True)
class KnowledgeEntry:
    entry_id: str
    title: str
    score: float


@attrs.frozen(kw_only=True)
class Knowledge:
    TYPE: ClassVar[str] = "knowledge"
    turn: str
    via: Literal["first", "tool"]
    outcome: Literal["found", "none", "failed"]
    entries: list[KnowledgeEntry]


@attrs.frozen(kw_only=True)
class Mood:
    TYPE: ClassVar[str] = "mood"
    turn: str
    mood: str
    intensity: float | None


@attrs.frozen(kw_only=True)
class ThoughtDelta:
    TYPE: ClassVar[str] = "thought.delta"
    turn: str
    text: str


@attrs.frozen(kw_only=True)
class TextDelta:
    TYPE: ClassVar[str] = "text.delta"
    turn: str
    text: str


@attrs.frozen(kw_only=True)
class TextChunk:
    TYPE: ClassVar[str] = "text.chunk"
    turn: str
    chunk: int
    text: str


ToolKind = Literal["platform", "webhook", "app"]


@attrs.frozen(kw_only=True)
class ToolStart:
    TYPE: ClassVar[str] = "tool.start"
    turn: str
    name: str
    kind: ToolKind
    call_id: str | None


@attrs.frozen(kw_only=True)
class ToolEnd:
    TYPE: ClassVar[str] = "tool.end"
    turn: str
    name: str
    kind: ToolKind
    call_id: str | None
    ok: bool
    ms: int


@attrs.frozen(kw_only=True)
class ToolCallFrame:
    TYPE: ClassVar[str] = "tool.call"
    turn: str
    call_id: str
    name: str
    arguments: dict[str, Any]
    action_only: bool
    timeout_ms: int


@attrs.frozen(kw_only=True)
class ToolConfirm:
    TYPE: ClassVar[str] = "tool.confirm"
    turn: str
    call_id: str
    name: str
    arguments: dict[str, Any]


@attrs.frozen(kw_only=True)
class AudioStart:
    TYPE: ClassVar[str] = "audio.start"
    turn: str
    chunk: int
    codec: str = CODEC
    sample_rate: int
    channels: int = 1


@attrs.frozen(kw_only=True)
class AudioEnd:
    TYPE: ClassVar[str] = "audio.end"
    turn: str
    chunk: int
    bytes: int
    audio_seconds: float


@attrs.frozen(kw_only=True)
class Muted:
    TYPE: ClassVar[str] = "muted"
    turn: str


@attrs.frozen(kw_only=True)
class UsageFrame:
    TYPE: ClassVar[str] = "usage"
    turn: str
    model: str
    input_tokens: int
    output_tokens: int
    thought_tokens: int
    cached_tokens: int
    generation_seconds: float


@attrs.frozen(kw_only=True)
class ToolCallRecord:
    """One call of the app's or the agent's tools, as ``turn.done`` lists it."""

    call_id: str | None
    name: str
    kind: ToolKind
    arguments: dict[str, Any]
    result: Any
    ok: bool
    error: str | None
    ms: int
    round: int


@attrs.frozen(kw_only=True)
class Source:
    url: str
    retrieved: bool


@attrs.frozen(kw_only=True)
class TurnTimings:
    model_first_text_ms: int | None
    first_audio_sent_ms: int | None
    total_ms: int


@attrs.frozen(kw_only=True)
class TurnDone:
    TYPE: ClassVar[str] = "turn.done"
    turn: str
    session_id: str
    message: str
    model: str | None
    input_tokens: int | None
    output_tokens: int | None
    mood: str | None
    mood_intensity: float | None
    truncated: bool
    chunks_spoken: int
    heard: str | None
    heard_seconds: float | None
    tool_calls: list[ToolCallRecord]
    sources: list[Source]
    timings: TurnTimings


@attrs.frozen(kw_only=True)
class Interrupted:
    TYPE: ClassVar[str] = "interrupted"
    turn: str
    message: str
    mood: str | None
    mood_intensity: float | None
    reason: str


@attrs.frozen(kw_only=True)
class Relation:
    """The relationship moved on this turn: its new fields, just after ``turn.done``."""

    TYPE: ClassVar[str] = "relation"
    turn: str
    agent_id: str
    end_user_id: str
    conversations: int
    first_at: str
    last_at: str
    notes: list[RelationNoteBody]


@attrs.frozen(kw_only=True)
class Compacted:
    TYPE: ClassVar[str] = "compacted"
    session_id: str
    after_seq: int
    trigger: Literal["automatic", "manual"]


ErrorCode = Literal[
    "conflict",
    "not_found",
    "invalid_request",
    "validation_failed",
    "rate_limited",
    "unavailable",
    "provider_failed",
    "insufficient_credits",
    "internal",
]
Stage = Literal["speech", "transcription", "model"]


@attrs.frozen(kw_only=True)
class Error:
    TYPE: ClassVar[str] = "error"
    code: ErrorCode
    message: str
    turn: str | None = None
    stage: Stage | None = None
    chunk: int | None = None
    request_id: str | None = None
    recording_id: str | None = None


Event = (
    Ready
    | TurnStart
    | HeardPartial
    | BargeIn
    | Heard
    | Transcript
    | Knowledge
    | Mood
    | ThoughtDelta
    | TextDelta
    | TextChunk
    | ToolStart
    | ToolEnd
    | ToolCallFrame
    | ToolConfirm
    | AudioStart
    | AudioEnd
    | Muted
    | UsageFrame
    | TurnDone
    | Interrupted
    | Compacted
    | Error
)
EVENTS: dict[str, type[Any]] = {cls.TYPE: cls for cls in typing.get_args(Event)}
# ``relation`` (:class:`Relation`) is sent but kept out of ``EVENTS``: its schema requires only
# ``turn`` (the page names the rest "the relationship's new fields"); ``pong`` has no seq.
PONG = '{"type":"pong"}'

# -- REST bodies of the public listener ------------------------------------------------------


@attrs.frozen(kw_only=True)
class EphemeralKeyRequest:
    end_user_id: str | None = attrs.field(default=None, validator=_length(1, 128))
    ttl_seconds: int | None = None
    credit_limit: float | None = None


@attrs.frozen(kw_only=True)
class EphemeralKey:
    token: str
    end_user_id: str
    scope: Literal["agent"] = "agent"
    expires_at: str


@attrs.frozen(kw_only=True)
class AgentSessionRequest:
    """``POST /v1/agent/sessions`` takes no fields today; an empty object or no body."""


@attrs.frozen(kw_only=True)
class AgentSession:
    session_id: str
    agent_id: str
    end_user_id: str
    created_at: str


@attrs.frozen(kw_only=True)
class TranscriptMessage:
    position: int
    role: str
    text: str
    turn: str | None
    created_at: str


@attrs.frozen(kw_only=True)
class AgentSessionMessages:
    session_id: str
    messages: list[TranscriptMessage]


@attrs.frozen(kw_only=True)
class Revoked:
    token_id: str
    revoked: bool


@attrs.frozen(kw_only=True)
class Relations:
    relations: list[RelationBody]


@attrs.frozen(kw_only=True)
class CompactionDone:
    """``POST /v1/agent/sessions/{id}/compact``: ``after_seq`` is ``None`` when nothing was folded in."""

    session_id: str
    compacted: bool
    after_seq: int | None


@attrs.frozen(kw_only=True)
class Deleted:
    session_id: str
    deleted: bool


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


def encode_frame(frame: Any, seq: int) -> str:
    """A runner frame as its JSON text: ``type`` and ``seq`` first, then every field."""
    body = {"type": frame.TYPE, "seq": seq, **converter.unstructure(frame)}
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
