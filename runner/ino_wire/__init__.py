"""The frames of the agent WebSocket (subprotocol ``ino.v2``), its REST bodies, and the one
converter between them and JSON.

A turn's events whose frame says just what the event says (``text.delta``, ``heard``,
``audio.end``...) are not declared again here: the socket writes them as they are, under the
frame type its table names (``runner.transports.websocket.EVENT_FRAMES``), and this converter.

This wire is not the host protocol's (``runner.wire``), and its rules are the opposite ones,
so it has its own converter: names are snake_case as written (no renaming), a frame the
client sends may hold only the fields its verb takes (the host protocol ignores unknown
fields), and every field of a frame the runner sends is written, ``null`` where it does not
apply (the host protocol omits absent optionals). ``runner/ino.schema.json`` states the
same frames as JSON Schema; a test keeps the two in step. Pure: no Trio, no Quart.

The protocol's constants and limits are in ``_limits.py``, what the client sends in
``_verbs.py``, what the runner sends in ``_frames.py``, the REST bodies in ``_rest.py`` and
the converter (``decode_verb``, ``encode_frame``, ``decode_body``, ``encode``) in ``_converter.py``.
"""

from ._converter import converter as converter
from ._converter import decode_body as decode_body
from ._converter import decode_verb as decode_verb
from ._converter import encode as encode
from ._converter import encode_frame as encode_frame
from ._converter import rfc3339 as rfc3339
from ._converter import verb_of as verb_of
from ._frames import EVENTS as EVENTS
from ._frames import PONG as PONG
from ._frames import AudioFormat as AudioFormat
from ._frames import AudioStart as AudioStart
from ._frames import Compacted as Compacted
from ._frames import Error as Error
from ._frames import ErrorCode as ErrorCode
from ._frames import Event as Event
from ._frames import HeardPartial as HeardPartial
from ._frames import Interrupted as Interrupted
from ._frames import Knowledge as Knowledge
from ._frames import KnowledgeEntry as KnowledgeEntry
from ._frames import Ready as Ready
from ._frames import Relation as Relation
from ._frames import RelationBody as RelationBody
from ._frames import RelationNoteBody as RelationNoteBody
from ._frames import Source as Source
from ._frames import Stage as Stage
from ._frames import ToolCallRecord as ToolCallRecord
from ._frames import ToolEnd as ToolEnd
from ._frames import ToolKind as ToolKind
from ._frames import ToolStart as ToolStart
from ._frames import Transcript as Transcript
from ._frames import TurnDone as TurnDone
from ._frames import TurnStart as TurnStart
from ._frames import TurnTimings as TurnTimings
from ._frames import UsageFrame as UsageFrame
from ._limits import AGENT_STREAM_PATH as AGENT_STREAM_PATH
from ._limits import CODEC as CODEC
from ._limits import MAX_APP_TOOLS as MAX_APP_TOOLS
from ._limits import MAX_RECORDING_BYTES as MAX_RECORDING_BYTES
from ._limits import MAX_RECORDING_ID_CHARS as MAX_RECORDING_ID_CHARS
from ._limits import MAX_TEXT_CHARS as MAX_TEXT_CHARS
from ._limits import MAX_TOOL_ERROR_CHARS as MAX_TOOL_ERROR_CHARS
from ._limits import PROTOCOL as PROTOCOL
from ._limits import RATES_HZ as RATES_HZ
from ._limits import RECORDING_TOO_LONG as RECORDING_TOO_LONG
from ._limits import FrameInvalid as FrameInvalid
from ._limits import FrameRejected as FrameRejected
from ._limits import LimitError as LimitError
from ._rest import AgentSession as AgentSession
from ._rest import AgentSessionMessages as AgentSessionMessages
from ._rest import AgentSessionRequest as AgentSessionRequest
from ._rest import CompactionDone as CompactionDone
from ._rest import Deleted as Deleted
from ._rest import EphemeralKey as EphemeralKey
from ._rest import EphemeralKeyRequest as EphemeralKeyRequest
from ._rest import Relations as Relations
from ._rest import Revoked as Revoked
from ._rest import TranscriptMessage as TranscriptMessage
from ._verbs import VERBS as VERBS
from ._verbs import Auth as Auth
from ._verbs import Cancel as Cancel
from ._verbs import Mute as Mute
from ._verbs import Ping as Ping
from ._verbs import ToolConfirmed as ToolConfirmed
from ._verbs import ToolResult as ToolResult
from ._verbs import UserAudioEnd as UserAudioEnd
from ._verbs import UserAudioStart as UserAudioStart
from ._verbs import UserMessage as UserMessage
from ._verbs import Verb as Verb

__all__ = [
    "AGENT_STREAM_PATH",
    "CODEC",
    "EVENTS",
    "MAX_APP_TOOLS",
    "MAX_RECORDING_BYTES",
    "MAX_RECORDING_ID_CHARS",
    "MAX_TEXT_CHARS",
    "MAX_TOOL_ERROR_CHARS",
    "PONG",
    "PROTOCOL",
    "RATES_HZ",
    "RECORDING_TOO_LONG",
    "VERBS",
    "AgentSession",
    "AgentSessionMessages",
    "AgentSessionRequest",
    "AudioFormat",
    "AudioStart",
    "Auth",
    "Cancel",
    "Compacted",
    "CompactionDone",
    "Deleted",
    "EphemeralKey",
    "EphemeralKeyRequest",
    "Error",
    "ErrorCode",
    "Event",
    "FrameInvalid",
    "FrameRejected",
    "HeardPartial",
    "Interrupted",
    "Knowledge",
    "KnowledgeEntry",
    "LimitError",
    "Mute",
    "Ping",
    "Ready",
    "Relation",
    "RelationBody",
    "RelationNoteBody",
    "Relations",
    "Revoked",
    "Source",
    "Stage",
    "ToolCallRecord",
    "ToolConfirmed",
    "ToolEnd",
    "ToolKind",
    "ToolResult",
    "ToolStart",
    "Transcript",
    "TranscriptMessage",
    "TurnDone",
    "TurnStart",
    "TurnTimings",
    "UsageFrame",
    "UserAudioEnd",
    "UserAudioStart",
    "UserMessage",
    "Verb",
    "converter",
    "decode_body",
    "decode_verb",
    "encode",
    "encode_frame",
    "rfc3339",
    "verb_of",
]
