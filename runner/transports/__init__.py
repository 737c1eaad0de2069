"""Transports: how a call reaches its caller (loopback, LiveKit, the agent WebSocket)."""

from ._base import AudioFrame as AudioFrame
from ._base import CallTarget as CallTarget
from ._base import ClientRefusal as ClientRefusal
from ._base import Disconnected as Disconnected
from ._base import ParticipantJoined as ParticipantJoined
from ._base import ParticipantLeft as ParticipantLeft
from ._base import RequestHandler as RequestHandler
from ._base import Transport as Transport
from ._base import TransportError as TransportError
from ._base import TransportEvent as TransportEvent
from ._base import TransportSession as TransportSession
from ._base import UserText as UserText
