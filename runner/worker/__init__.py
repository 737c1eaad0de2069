"""Worker mode: LiveKit's agent dispatch hands this runner its calls.

``runner start`` keeps one WebSocket to the LiveKit server's ``/agent`` endpoint and speaks
the agent-worker protocol (the ``WorkerMessage`` / ``ServerMessage`` protobufs that
``livekit-protocol`` ships): it registers a room worker under an agent name, answers each
availability request from its real load, and runs every assigned job as an ordinary call of
the :class:`~runner.calls.Runner` (same ``Call``, same journal records, same agent code),
joining the job's room through the LiveKit transport with the token the server minted.
Many such runners, on as many machines, register under one agent name and LiveKit's own
dispatch spreads the rooms across them.

The socket is Trio (trio-websocket): the only asyncio is inside the LiveKit transport.
A lost socket is reconnected with backoff; the calls run in the runner's nursery, not the
socket's, so they go on meanwhile, and what the worker has to tell the server (job status)
waits in an outbox for the next connection.

``_worker.py`` holds the :class:`AgentWorker` (the socket, availability, jobs), ``_rooms.py``
the record a call keeps in its room's metadata, ``_failover.py`` what is done about a room
whose agent left, ``_api.py`` the LiveKit server API both use.
"""

from ._api import API_TIMEOUT_S as API_TIMEOUT_S
from ._api import LiveKitApi as LiveKitApi
from ._api import LiveKitApiError as LiveKitApiError
from ._failover import LOST_JITTER_S as LOST_JITTER_S
from ._failover import NO_WORKER_AFTER_S as NO_WORKER_AFTER_S
from ._failover import SETTLE_S as SETTLE_S
from ._rooms import RESUMES_JOB_KEY as RESUMES_JOB_KEY
from ._rooms import RESUMES_KEY as RESUMES_KEY
from ._rooms import ROOM_KEY as ROOM_KEY
from ._rooms import ROOM_METADATA_MAX as ROOM_METADATA_MAX
from ._rooms import history_of as history_of
from ._rooms import parse_room_metadata as parse_room_metadata
from ._rooms import room_record as room_record
from ._worker import AGENT_PATH as AGENT_PATH
from ._worker import ASSIGNMENT_TIMEOUT_S as ASSIGNMENT_TIMEOUT_S
from ._worker import BACKOFF_FIRST_S as BACKOFF_FIRST_S
from ._worker import BACKOFF_MAX_S as BACKOFF_MAX_S
from ._worker import CLOSE_TIMEOUT_S as CLOSE_TIMEOUT_S
from ._worker import CONNECT_TIMEOUT_S as CONNECT_TIMEOUT_S
from ._worker import IDENTITY_PREFIX as IDENTITY_PREFIX
from ._worker import REGISTER_TIMEOUT_S as REGISTER_TIMEOUT_S
from ._worker import AgentWorker as AgentWorker
from ._worker import WorkerRejected as WorkerRejected
from ._worker import WorkerSetup as WorkerSetup
from ._worker import agent_url as agent_url
from ._worker import client_context_of as client_context_of
from ._worker import resumes_of as resumes_of
from ._worker import room_url as room_url

__all__ = [
    "AGENT_PATH",
    "API_TIMEOUT_S",
    "ASSIGNMENT_TIMEOUT_S",
    "BACKOFF_FIRST_S",
    "BACKOFF_MAX_S",
    "CLOSE_TIMEOUT_S",
    "CONNECT_TIMEOUT_S",
    "IDENTITY_PREFIX",
    "LOST_JITTER_S",
    "NO_WORKER_AFTER_S",
    "REGISTER_TIMEOUT_S",
    "RESUMES_JOB_KEY",
    "RESUMES_KEY",
    "ROOM_KEY",
    "ROOM_METADATA_MAX",
    "SETTLE_S",
    "AgentWorker",
    "LiveKitApi",
    "LiveKitApiError",
    "WorkerRejected",
    "WorkerSetup",
    "agent_url",
    "client_context_of",
    "history_of",
    "parse_room_metadata",
    "resumes_of",
    "room_record",
    "room_url",
]
