"""The host's side of the host protocol: a client, a stream follower, and a pool of runners.

A Python host in a few lines, under Trio or asyncio (its own concurrency is anyio's)::

    async with RunnerPool(["http://127.0.0.1:7071"], token=TOKEN) as pool:
        placed = await pool.start_call(StartCallRequest(session_id="call-1", ...))
        async with pool.client(placed.runner).follow_events(from_=0) as events:
            async for item in events:
                ...

Errors are the runner's own, one class per wire code (``RunnerDraining``,
``CursorTooOld`` with ``oldest_retained``, ...); see docs/host.md for the guarantees.
"""

from ..errors import CursorTooOld as CursorTooOld
from ..errors import GenerationMismatch as GenerationMismatch
from ..errors import HandlerFailed as HandlerFailed
from ..errors import Internal as Internal
from ..errors import InvalidPayload as InvalidPayload
from ..errors import InvalidRequest as InvalidRequest
from ..errors import InvalidSettings as InvalidSettings
from ..errors import NoHandler as NoHandler
from ..errors import NoJournal as NoJournal
from ..errors import NotAdjustable as NotAdjustable
from ..errors import NotFound as NotFound
from ..errors import RunnerAtCapacity as RunnerAtCapacity
from ..errors import RunnerDraining as RunnerDraining
from ..errors import RunnerError as RunnerError
from ..errors import RunnerTakesNoCalls as RunnerTakesNoCalls
from ..errors import SessionNotFound as SessionNotFound
from ..errors import StartFailed as StartFailed
from ..errors import Unauthorized as Unauthorized
from ..errors import UnknownVersion as UnknownVersion
from ..wire import HostMessage as HostMessage
from ..wire import JournalRecord as JournalRecord
from ..wire import SessionUpdate as SessionUpdate
from ..wire import StartCallRequest as StartCallRequest
from ._client import RunnerClient as RunnerClient
from ._client import RunnerUnreachable as RunnerUnreachable
from ._errors import ERRORS as ERRORS
from ._errors import UnknownError as UnknownError
from ._errors import error_from_answer as error_from_answer
from ._failover import CallLost as CallLost
from ._failover import CallMoved as CallMoved
from ._failover import Failover as Failover
from ._failover import FailoverEvent as FailoverEvent
from ._follow import KNOWN_CLASSES as KNOWN_CLASSES
from ._follow import EventFollower as EventFollower
from ._follow import EventsCursor as EventsCursor
from ._follow import FollowItem as FollowItem
from ._follow import FollowStats as FollowStats
from ._follow import Lost as Lost
from ._follow import SeqGap as SeqGap
from ._livekit import LiveKitRefused as LiveKitRefused
from ._livekit import LiveKitRooms as LiveKitRooms
from ._livekit import RoomParticipant as RoomParticipant
from ._pool import RunnerPool as RunnerPool
from ._state import NoRunnerAvailable as NoRunnerAvailable
from ._state import Placement as Placement
from ._state import RunnerState as RunnerState

__all__ = [
    "ERRORS",
    "KNOWN_CLASSES",
    "CallLost",
    "CallMoved",
    "CursorTooOld",
    "EventFollower",
    "EventsCursor",
    "Failover",
    "FailoverEvent",
    "FollowItem",
    "FollowStats",
    "GenerationMismatch",
    "HandlerFailed",
    "HostMessage",
    "Internal",
    "InvalidPayload",
    "InvalidRequest",
    "InvalidSettings",
    "JournalRecord",
    "LiveKitRefused",
    "LiveKitRooms",
    "Lost",
    "NoHandler",
    "NoJournal",
    "NoRunnerAvailable",
    "NotAdjustable",
    "NotFound",
    "Placement",
    "RoomParticipant",
    "RunnerAtCapacity",
    "RunnerClient",
    "RunnerDraining",
    "RunnerError",
    "RunnerPool",
    "RunnerState",
    "RunnerTakesNoCalls",
    "RunnerUnreachable",
    "SeqGap",
    "SessionNotFound",
    "SessionUpdate",
    "StartCallRequest",
    "StartFailed",
    "Unauthorized",
    "UnknownError",
    "UnknownVersion",
    "error_from_answer",
]
