"""The LiveKit server's API, as the worker's failover uses it: room metadata, participants and
agent dispatches (Twirp over HTTP, with tokens the worker mints).
"""

from __future__ import annotations

import json
import logging
from typing import Any
from urllib.parse import urlsplit

import httpx

log = logging.getLogger("runner.worker")
API_TIMEOUT_S = 10.0


class LiveKitApi:
    """The part of LiveKit's server API a worker's failover needs, as Twirp JSON over httpx;
    each request is signed with a token of the grants it needs, valid for a minute."""

    def __init__(self, url: str, api_key: str, api_secret: str) -> None:
        parts = urlsplit(url)
        scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
        self._key = api_key
        self._secret = api_secret
        self._http = httpx.AsyncClient(
            base_url=f"{scheme}://{parts.netloc}", timeout=httpx.Timeout(API_TIMEOUT_S)
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    def _token(self, **video: Any) -> str:
        from datetime import timedelta

        from livekit import api

        return (
            api.AccessToken(self._key, self._secret)
            .with_ttl(timedelta(seconds=60))
            .with_grants(api.VideoGrants(**video))
            .to_jwt()
        )

    async def _call(self, service: str, method: str, body: dict[str, Any], **grants: Any) -> dict[str, Any]:
        answer = await self._http.post(
            f"/twirp/livekit.{service}/{method}",
            json=body,
            headers={"Authorization": f"Bearer {self._token(**grants)}"},
        )
        if answer.status_code != 200:
            raise LiveKitApiError(f"{method}: {answer.status_code} {answer.text[:200]}")
        data = answer.json()
        return data if isinstance(data, dict) else {}

    async def room_metadata(self, room: str) -> str | None:
        """The room's metadata now, or None when the server holds no such room."""
        answer = await self._call("RoomService", "ListRooms", {"names": [room]}, room_list=True)
        for info in answer.get("rooms", []):
            if info.get("name") == room:
                return str(info.get("metadata") or "")
        return None

    async def set_room_metadata(self, room: str, metadata: str) -> None:
        await self._call(
            "RoomService",
            "UpdateRoomMetadata",
            {"room": room, "metadata": metadata},
            room_admin=True,
            room=room,
        )

    async def participants(self, room: str) -> list[dict[str, Any]]:
        answer = await self._call(
            "RoomService", "ListParticipants", {"room": room}, room_admin=True, room=room
        )
        return list(answer.get("participants", []))

    async def dispatches(self, room: str) -> list[dict[str, Any]]:
        answer = await self._call(
            "AgentDispatchService", "ListDispatch", {"room": room}, room_admin=True, room=room
        )
        return list(answer.get("agentDispatches", answer.get("agent_dispatches", [])))

    async def dispatch(self, room: str, agent_name: str, metadata: str) -> str:
        body = {"room": room, "agent_name": agent_name, "metadata": metadata}
        answer = await self._call("AgentDispatchService", "CreateDispatch", body, room_admin=True, room=room)
        return str(answer.get("id", ""))

    async def delete_dispatch(self, room: str, dispatch_id: str) -> None:
        body = {"room": room, "dispatch_id": dispatch_id}
        await self._call("AgentDispatchService", "DeleteDispatch", body, room_admin=True, room=room)


class LiveKitApiError(Exception):
    """The LiveKit server refused or failed a request of the worker's failover."""


def is_agent(participant: dict[str, Any]) -> bool:
    return participant.get("kind") in ("AGENT", 4)


API_FAILED = (httpx.HTTPError, LiveKitApiError, ValueError)


AGENT_KIND = 4  # ParticipantInfo.Kind.AGENT


def metadata_map(metadata: object) -> dict[str, Any]:
    try:
        parsed = json.loads(metadata) if isinstance(metadata, str) and metadata else {}
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}
