"""Transports: how a call reaches its caller (loopback, LiveKit, the agent WebSocket)."""

from ..sessions import DTMF_DIGITS as DTMF_DIGITS
from ..sessions import AudioFrame as AudioFrame
from ..sessions import CallTarget as CallTarget
from ..sessions import ClientRefusal as ClientRefusal
from ..sessions import Disconnected as Disconnected
from ..sessions import DtmfReceived as DtmfReceived
from ..sessions import ParticipantJoined as ParticipantJoined
from ..sessions import ParticipantLeft as ParticipantLeft
from ..sessions import RequestHandler as RequestHandler
from ..sessions import Transport as Transport
from ..sessions import TransportError as TransportError
from ..sessions import TransportEvent as TransportEvent
from ..sessions import TransportSession as TransportSession
from ..sessions import UserText as UserText

__all__ = [
    "DTMF_DIGITS",
    "AudioFrame",
    "CallTarget",
    "ClientRefusal",
    "Disconnected",
    "DtmfReceived",
    "ParticipantJoined",
    "ParticipantLeft",
    "RequestHandler",
    "Transport",
    "TransportError",
    "TransportEvent",
    "TransportSession",
    "UserText",
]
