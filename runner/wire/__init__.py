"""Every type of the host protocol, and the one converter between them and JSON.

Attributes are snake_case; the wire is camelCase, renamed here and nowhere else.
Structuring is strict: a string is a string, an integer is never a bool or a float,
and unknown fields are ignored, as the protocol asks. Pure: no Trio, no Quart.

The types are in ``_types.py``, the converter (``decode``, ``encode``) in
``_converter.py``, strict JSON parsing and compact writing in ``_json.py``.
"""

from ._converter import WireError as WireError
from ._converter import converter as converter
from ._converter import decode as decode
from ._converter import encode as encode
from ._converter import origin_of as origin_of
from ._converter import wire_name as wire_name
from ._json import MAX_JSON_DEPTH as MAX_JSON_DEPTH
from ._json import json_bytes as json_bytes
from ._json import parse_json as parse_json
from ._types import HISTORY_BYTES_MAX as HISTORY_BYTES_MAX
from ._types import HISTORY_TEXT_MAX as HISTORY_TEXT_MAX
from ._types import HISTORY_TURNS_MAX as HISTORY_TURNS_MAX
from ._types import PROTOCOL_VERSION as PROTOCOL_VERSION
from ._types import PROTOCOL_VERSIONS as PROTOCOL_VERSIONS
from ._types import RESERVED_PRODUCERS as RESERVED_PRODUCERS
from ._types import SESSION_ID_MAX as SESSION_ID_MAX
from ._types import CallEnded as CallEnded
from ._types import CallEndedEvent as CallEndedEvent
from ._types import CallMessages as CallMessages
from ._types import CallMessagesEvent as CallMessagesEvent
from ._types import CallStarted as CallStarted
from ._types import CallStartedEvent as CallStartedEvent
from ._types import ConversationEventBody as ConversationEventBody
from ._types import Direction as Direction
from ._types import DrainReason as DrainReason
from ._types import EffectiveLLM as EffectiveLLM
from ._types import EffectiveSettings as EffectiveSettings
from ._types import EffectiveSTT as EffectiveSTT
from ._types import EffectiveTTS as EffectiveTTS
from ._types import ErrorBody as ErrorBody
from ._types import ErrorCode as ErrorCode
from ._types import FieldError as FieldError
from ._types import Health as Health
from ._types import HealthState as HealthState
from ._types import Heartbeat as Heartbeat
from ._types import HistoryTurn as HistoryTurn
from ._types import HostMessage as HostMessage
from ._types import HostMessageAccepted as HostMessageAccepted
from ._types import HostRecordBody as HostRecordBody
from ._types import Issue as Issue
from ._types import JournalRecord as JournalRecord
from ._types import JSONObject as JSONObject
from ._types import Lifecycle as Lifecycle
from ._types import LifecycleDraining as LifecycleDraining
from ._types import LifecycleEnded as LifecycleEnded
from ._types import LifecycleReady as LifecycleReady
from ._types import LifecycleRecovered as LifecycleRecovered
from ._types import LiveCall as LiveCall
from ._types import LiveKitState as LiveKitState
from ._types import LLMChoice as LLMChoice
from ._types import LLMProvider as LLMProvider
from ._types import ResumedCall as ResumedCall
from ._types import RunnerStatus as RunnerStatus
from ._types import SessionSettingsResponse as SessionSettingsResponse
from ._types import SessionUpdate as SessionUpdate
from ._types import StartCallRequest as StartCallRequest
from ._types import StartCallResponse as StartCallResponse
from ._types import State as State
from ._types import StopCallResponse as StopCallResponse
from ._types import STTUpdate as STTUpdate
from ._types import TTSUpdate as TTSUpdate
from ._types import Voice as Voice

__all__ = [
    "HISTORY_BYTES_MAX",
    "HISTORY_TEXT_MAX",
    "HISTORY_TURNS_MAX",
    "MAX_JSON_DEPTH",
    "PROTOCOL_VERSION",
    "PROTOCOL_VERSIONS",
    "RESERVED_PRODUCERS",
    "SESSION_ID_MAX",
    "CallEnded",
    "CallEndedEvent",
    "CallMessages",
    "CallMessagesEvent",
    "CallStarted",
    "CallStartedEvent",
    "ConversationEventBody",
    "Direction",
    "DrainReason",
    "EffectiveLLM",
    "EffectiveSTT",
    "EffectiveSettings",
    "EffectiveTTS",
    "ErrorBody",
    "ErrorCode",
    "FieldError",
    "Health",
    "HealthState",
    "Heartbeat",
    "HistoryTurn",
    "HostMessage",
    "HostMessageAccepted",
    "HostRecordBody",
    "Issue",
    "JSONObject",
    "JournalRecord",
    "LLMChoice",
    "LLMProvider",
    "Lifecycle",
    "LifecycleDraining",
    "LifecycleEnded",
    "LifecycleReady",
    "LifecycleRecovered",
    "LiveCall",
    "LiveKitState",
    "ResumedCall",
    "RunnerStatus",
    "STTUpdate",
    "SessionSettingsResponse",
    "SessionUpdate",
    "StartCallRequest",
    "StartCallResponse",
    "State",
    "StopCallResponse",
    "TTSUpdate",
    "Voice",
    "WireError",
    "converter",
    "decode",
    "encode",
    "json_bytes",
    "origin_of",
    "parse_json",
    "wire_name",
]
