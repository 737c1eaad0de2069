"""The runner's calls: capacity, draining, and each call's lifecycle.

A call is one Trio nursery that owns its transport session, its agent's
conversation and its stop timer. Its record is written under its own producer
(the session id): ``curb.started`` first, ``curb.ended`` always last.

``_runner.py`` holds the :class:`Runner` (capacity, drain, registry), ``_call.py`` one
:class:`Call`, ``_record.py`` its journal records (and the ends a crash left out),
``_status.py`` the runner's status JSON, kept per call.
"""

from ._call import MAX_HELD_MESSAGES as MAX_HELD_MESSAGES
from ._call import START_TIMEOUT_S as START_TIMEOUT_S
from ._call import Call as Call
from ._call import CallContext as CallContext
from ._call import Conversation as Conversation
from ._call import ConversationFactory as ConversationFactory
from ._call import HostMessages as HostMessages
from ._record import END_REASON_CRASHED as END_REASON_CRASHED
from ._record import KEEP_JSON_BYTES as KEEP_JSON_BYTES
from ._record import CallRecord as CallRecord
from ._record import close_open_calls as close_open_calls
from ._record import keep_json as keep_json
from ._runner import STOP_DEADLINE_S as STOP_DEADLINE_S
from ._runner import STOP_GRACE_S as STOP_GRACE_S
from ._runner import Runner as Runner
from ._status import StatusParts as StatusParts

__all__ = [
    "END_REASON_CRASHED",
    "KEEP_JSON_BYTES",
    "MAX_HELD_MESSAGES",
    "START_TIMEOUT_S",
    "STOP_DEADLINE_S",
    "STOP_GRACE_S",
    "Call",
    "CallContext",
    "CallRecord",
    "Conversation",
    "ConversationFactory",
    "HostMessages",
    "Runner",
    "StatusParts",
    "close_open_calls",
    "keep_json",
]
