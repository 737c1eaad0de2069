"""The host's side of LiveKit for phone calls: rooms, tokens, dialing, transfers, hang-ups.

A host that places calls on runners owns the LiveKit credentials (the runner gets a room
token per call). This is the part of LiveKit's server API such a host needs for telephones,
spoken as Twirp JSON over httpx, so it runs under Trio or asyncio like the rest of
``runner.host``; tokens are signed with the ``livekit-api`` package.
"""

from __future__ import annotations

from datetime import timedelta
from types import TracebackType
from typing import Any, Literal
from urllib.parse import urlsplit

import attrs
import httpx

DIAL_TIMEOUT = httpx.Timeout(10.0, read=60.0)
"""Dialing waits for the phone to be answered; the read waits as long as it may ring."""


class LiveKitRefused(Exception):
    """The LiveKit server refused a request: its Twirp ``code`` and ``message``."""

    def __init__(self, method: str, status: int, code: str, message: str) -> None:
        super().__init__(f"{method}: {status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message


@attrs.frozen(kw_only=True)
class RoomParticipant:
    """A participant as the server lists it; ``attributes`` carry ``sip.*`` for a phone."""

    identity: str
    kind: Literal["standard", "ingress", "egress", "sip", "agent", "other"]
    attributes: dict[str, str]


_KINDS: dict[Any, Any] = {
    "STANDARD": "standard",
    "INGRESS": "ingress",
    "EGRESS": "egress",
    "SIP": "sip",
    "AGENT": "agent",
    0: "standard",
    1: "ingress",
    2: "egress",
    3: "sip",
    4: "agent",
}


class LiveKitRooms:
    """A host's client for one LiveKit server's API (rooms and SIP), under Trio or asyncio.

    Args:
        url: The server, ``wss://livekit.example.com`` (the ``realtimeUrl`` runners get) or
            its ``https://`` address.
        api_key, api_secret: The server's API key; every request is signed with a token of
            the grants it needs, valid for a minute.
        transport: An httpx transport, for your own TLS settings.
    """

    def __init__(
        self, url: str, api_key: str, api_secret: str, *, transport: httpx.AsyncBaseTransport | None = None
    ) -> None:
        parts = urlsplit(url)
        scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
        self.url = url
        self._key = api_key
        self._secret = api_secret
        self._http = httpx.AsyncClient(
            base_url=f"{scheme}://{parts.netloc}", timeout=httpx.Timeout(10.0), transport=transport
        )

    async def __aenter__(self) -> LiveKitRooms:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    # -- Tokens ---------------------------------------------------------------------------

    def _token(self, *, ttl_s: int = 60, sip: bool = False, **video: Any) -> str:
        from livekit import api

        token = api.AccessToken(self._key, self._secret).with_ttl(timedelta(seconds=ttl_s))
        token = token.with_grants(api.VideoGrants(**video))
        if sip:
            token = token.with_sip_grants(api.SIPGrants(admin=True, call=True))
        return token.to_jwt()

    def agent_token(self, room: str, identity: str = "agent", *, ttl_s: int = 3600) -> str:
        """The ``realtimeToken`` for a runner's call in ``room``: kind agent, and ``roomAdmin``
        so the agent can hang up a phone caller when the call ends on its side."""
        from livekit import api

        return (
            api.AccessToken(self._key, self._secret)
            .with_identity(identity)
            .with_kind("agent")
            .with_ttl(timedelta(seconds=ttl_s))
            .with_grants(api.VideoGrants(room_join=True, room=room, room_admin=True))
            .to_jwt()
        )

    # -- Requests -------------------------------------------------------------------------

    async def _call(
        self,
        service: str,
        method: str,
        body: dict[str, Any],
        token: str,
        patience: httpx.Timeout | None = None,
    ) -> dict[str, Any]:
        answer = await self._http.post(
            f"/twirp/livekit.{service}/{method}",
            json=body,
            headers={"Authorization": f"Bearer {token}"},
            timeout=patience or self._http.timeout,
        )
        try:
            data = answer.json()
        except ValueError:
            data = {}
        if answer.status_code != 200:
            raise LiveKitRefused(
                method,
                answer.status_code,
                str(data.get("code", "unknown")) if isinstance(data, dict) else "unknown",
                str(data.get("msg", answer.text[:200])) if isinstance(data, dict) else answer.text[:200],
            )
        return data if isinstance(data, dict) else {}

    async def list_rooms(self) -> list[str]:
        """The names of the rooms the server holds now."""
        answer = await self._call("RoomService", "ListRooms", {}, self._token(room_list=True))
        return sorted(str(room["name"]) for room in answer.get("rooms", []))

    async def participants(self, room: str) -> list[RoomParticipant]:
        """Who is in ``room`` now."""
        answer = await self._call(
            "RoomService", "ListParticipants", {"room": room}, self._token(room_admin=True, room=room)
        )
        return [
            RoomParticipant(
                identity=str(p["identity"]),
                kind=_KINDS.get(p.get("kind", 0), "other"),
                attributes={str(k): str(v) for k, v in (p.get("attributes") or {}).items()},
            )
            for p in answer.get("participants", [])
        ]

    async def dial(
        self,
        room: str,
        *,
        trunk_id: str,
        number: str,
        identity: str,
        attributes: dict[str, str] | None = None,
        wait_until_answered: bool = True,
    ) -> dict[str, Any]:
        """Dial ``number`` through the outbound trunk ``trunk_id`` into ``room``
        (``CreateSIPParticipant``); with ``wait_until_answered`` it returns once the phone
        answered. The answer holds ``participantIdentity`` and ``sipCallId``.

        Raises:
            LiveKitRefused: The server or the phone refused (busy, no answer: its SIP status).
        """
        body = {
            "sip_trunk_id": trunk_id,
            "sip_call_to": number,
            "room_name": room,
            "participant_identity": identity,
            "participant_attributes": dict(attributes or {}),
            "wait_until_answered": wait_until_answered,
        }
        token = self._token(sip=True, room_admin=True, room=room)
        return await self._call("SIP", "CreateSIPParticipant", body, token, patience=DIAL_TIMEOUT)

    async def transfer(self, room: str, identity: str, to: str) -> None:
        """Transfer the phone ``identity`` to ``to`` (``sip:...`` or ``tel:...``) with a SIP
        REFER (``TransferSIPParticipant``): a cold transfer; the phone leaves the room.

        Raises:
            LiveKitRefused: The server refused, or the phone did not take the transfer.
        """
        body = {"room_name": room, "participant_identity": identity, "transfer_to": to}
        token = self._token(sip=True, room_admin=True, room=room)
        await self._call("SIP", "TransferSIPParticipant", body, token, patience=DIAL_TIMEOUT)

    async def hang_up(self, room: str, identity: str) -> None:
        """Remove ``identity`` from ``room``; for a phone, LiveKit's SIP service ends its call."""
        token = self._token(room_admin=True, room=room)
        await self._call("RoomService", "RemoveParticipant", {"room": room, "identity": identity}, token)
