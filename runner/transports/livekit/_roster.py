"""Who is who in the room (``ParticipantJoined.kind``); the package's docstring says in what order."""

from __future__ import annotations

from typing import Literal

from livekit import rtc

ROLE_ATTRIBUTE = "curb.role"
# LiveKit's SIP service says where a phone call is: ringing, active, hangup, ...
SIP_STATUS_ATTRIBUTE = "sip.callStatus"

Kind = Literal["caller", "app", "sip", "agent", "transfer_target"]
CALLER_KINDS = ("caller", "sip")
APP_KINDS = ("caller", "app")


def classify(participant: rtc.RemoteParticipant, *, has_caller: bool) -> Kind | None:
    """The kind of ``participant``, given whether a caller is in the room already; None for
    those not part of the conversation (ingress, egress, ...)."""
    is_sip = participant.kind == rtc.ParticipantKind.PARTICIPANT_KIND_SIP
    role = participant.attributes.get(ROLE_ATTRIBUTE)
    if role == "caller":
        return "sip" if is_sip else "caller"
    if role in ("app", "transfer_target"):
        return role  # type: ignore[return-value]  # narrowed to the two literals by the membership test just above
    if participant.kind == rtc.ParticipantKind.PARTICIPANT_KIND_AGENT:
        return "agent"
    if is_sip:
        return "transfer_target" if has_caller else "sip"
    if participant.kind == rtc.ParticipantKind.PARTICIPANT_KIND_STANDARD:
        return "app" if has_caller else "caller"
    return None


def kind_name(participant: rtc.Participant) -> str:
    """LiveKit's name of the participant's kind (``PARTICIPANT_KIND_SIP``, ...), for the log."""
    try:
        return rtc.ParticipantKind.Name(participant.kind)
    except ValueError:
        return str(participant.kind)
