"""Every type of the host protocol: attrs classes and the literals they take.

Attributes are snake_case; the converter (``_converter.py``) renames them to the wire's
camelCase. Validators hold the protocol's invariants. Pure: no Trio, no Quart.
"""

from __future__ import annotations

import re
from typing import Any, Literal

import attrs

from journal import Record

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


HealthState = Literal["starting", "ready", "draining"]
"""Before the ``ready`` record (a worker: until it first registered), after it, once draining."""
LiveKitState = Literal["connecting", "registered"]
"""A worker's socket to its LiveKit server: registered on it, or (re)connecting."""


@attrs.frozen(kw_only=True)
class Health:
    """``GET /health``: answered in every state, which ``state`` (and a worker's ``livekit``) says."""

    ok: bool = attrs.field(validator=_equals(True))
    protocol_version: int = attrs.field(validator=_equals(1))
    versions: list[int] = attrs.field(validator=_length(1, 1 << 16))
    state: HealthState | None = None
    livekit: LiveKitState | None = None


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


HISTORY_TURNS_MAX = 200
HISTORY_TEXT_MAX = 4096
HISTORY_BYTES_MAX = 64 * 1024


@attrs.frozen(kw_only=True)
class HistoryTurn:
    """One turn of a conversation that travels with a resumed call."""

    role: Literal["user", "assistant"]
    text: str = attrs.field(validator=_length(0, HISTORY_TEXT_MAX))


def _history_bounds(instance: Any, attribute: attrs.Attribute[Any], value: list[HistoryTurn]) -> None:
    if len(value) > HISTORY_TURNS_MAX:
        raise FieldError(attribute.name, f"must hold at most {HISTORY_TURNS_MAX} turns")
    if sum(len(turn.text.encode()) for turn in value) > HISTORY_BYTES_MAX:
        raise FieldError(attribute.name, f"must hold at most {HISTORY_BYTES_MAX} bytes of text")


@attrs.frozen(kw_only=True)
class ResumedCall:
    """The ``resume`` extension of a start: the call continues one another runner held.

    Not part of host protocol 1.0 (docs/failover.md): a runner that does not know it
    ignores it, as the protocol asks of unknown fields, and starts the call afresh.

    Attributes:
        history: The conversation so far, oldest first, as the host followed it.
        reason: Why it moved (``runner_lost``: its runner stopped answering).
    """

    history: list[HistoryTurn] = attrs.field(factory=list, validator=_history_bounds)
    reason: str = attrs.field(default="runner_lost", validator=_length(1, 64))


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
    resume: ResumedCall | None = None


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
    undelivered_queued_host_messages: int | None = attrs.field(default=None, validator=_at_least(0))


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
