"""The LiveKit server API, as the runner uses it: tokens for a room's admin and for the
agent-worker socket, and hanging up a phone caller (removing it from the room, so LiveKit's
SIP service ends its call)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from urllib.parse import urlsplit

from ...sessions import CallTarget

log = logging.getLogger("runner.transports.livekit")


def admin_token(api_key: str, api_secret: str, room: str, *, ttl_s: int = 60) -> str:
    """A short-lived token for the server API on one room (``roomAdmin``)."""
    from datetime import timedelta

    from livekit import api

    return (
        api.AccessToken(api_key, api_secret)
        .with_grants(api.VideoGrants(room_admin=True, room=room))
        .with_ttl(timedelta(seconds=ttl_s))
        .to_jwt()
    )


def worker_token(api_key: str, api_secret: str, *, ttl_s: int = 600) -> str:
    """A token for the LiveKit agent-worker socket (``/agent``): the ``agent`` grant."""
    from datetime import timedelta

    from livekit import api

    return (
        api.AccessToken(api_key, api_secret)
        .with_grants(api.VideoGrants(agent=True))
        .with_ttl(timedelta(seconds=ttl_s))
        .to_jwt()
    )


def admin_token_of(token: str) -> Callable[[str], str] | None:
    """The call's own token, when it grants ``roomAdmin`` (read, not verified: the server checks)."""
    import base64

    try:
        payload = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (IndexError, ValueError):
        return None
    video = claims.get("video") if isinstance(claims, dict) else None
    if isinstance(video, dict) and video.get("roomAdmin") is True:
        return lambda room: token
    return None


async def hang_up(
    target: CallTarget, room: str, phones: list[str], admin: Callable[[str], str] | None
) -> None:
    """Remove the phone callers from the room: LiveKit's SIP service then ends their calls
    (a SIP BYE). Needs the server API: a token with ``roomAdmin`` (the call's own, or one
    signed with the runner's API key)."""
    token = admin or admin_token_of(target.token)
    if token is None:
        log.warning(
            "call %s: the phone line stays up (the host ends it): the runner has no "
            "LIVEKIT_API_KEY/LIVEKIT_API_SECRET and its token no roomAdmin grant",
            target.session_id,
        )
        return
    import aiohttp

    url = urlsplit(target.url)
    base = f"{'https' if url.scheme == 'wss' else 'http'}://{url.netloc}"
    async with aiohttp.ClientSession() as http:
        for identity in phones:
            async with http.post(
                f"{base}/twirp/livekit.RoomService/RemoveParticipant",
                json={"room": room, "identity": identity},
                headers={"Authorization": f"Bearer {token(room)}"},
            ) as answer:
                if answer.status != 200:
                    log.warning(
                        "call %s: could not hang up the phone %s: %s %s",
                        target.session_id,
                        identity,
                        answer.status,
                        (await answer.text())[:200],
                    )
                    continue
            log.info("call %s: hung up the phone %s", target.session_id, identity)
