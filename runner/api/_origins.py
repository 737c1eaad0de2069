"""Which ``Host`` and ``Origin`` a public listener answers: the guard against DNS rebinding.

A web page on any site can make a browser send requests to a listener on the person's own
machine: by its address (a cross-site request carries the page's ``Origin``) or by a DNS name
of the attacker's that it rebinds to ``127.0.0.1`` (then even ``Origin`` names that host, and
only ``Host`` gives it away). A dev runner's playground routes hold no credential of their own
(they mint keys), so ``runner dev`` answers only:

- a ``Host`` naming the listener: ``localhost`` (and ``*.localhost``), a loopback address,
  the listener's own address (any address when it is bound to all of them), or a name of
  ``--allow-host``; a request with another ``Host`` is answered ``421`` and goes no further;
- a request with no ``Origin`` (not a browser's page), one from the page's own origin (the
  ``Origin`` names the ``Host`` it was sent to), or from an origin of ``--allow-origin``; any
  other, a WebSocket upgrade included, is refused ``403``.

``runner serve`` holds no ambient credential either (a bearer token in a header, or the
agent socket's auth frame, never a cookie), and apps' pages on their own sites are its
callers: it answers any ``Host`` and ``Origin`` unless ``--allow-host`` or ``--allow-origin``
names the ones it should (docs/operations.md).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from typing import Any

import attrs

from ..wire import ErrorBody, json_bytes

ANY = "*"
_LOOPBACK_NAMES = frozenset({"localhost"})


def _host_name(host: str) -> str:
    """The name or address of a ``Host`` value, without its port, brackets or trailing dot."""
    host = host.strip().lower()
    if host.startswith("["):
        inside, bracket, rest = host[1:].partition("]")
        # Only a port may follow the brackets; anything else names no address.
        return inside if bracket and (not rest or (rest[0] == ":" and rest[1:].isdigit())) else host
    name, sep, port = host.rpartition(":")
    if sep and port.isdigit() and ":" not in name:
        host = name
    return host.rstrip(".")


def _address(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(name)
    except ValueError:
        return None


def _origin(value: str) -> str:
    return value.strip().lower().rstrip("/")


@attrs.frozen(kw_only=True)
class OriginPolicy:
    """The ``Host`` and ``Origin`` values one listener answers.

    Attributes:
        hosts: Names (and addresses) a ``Host`` may give; ``None``: any.
        any_address: Whether the listener is bound to every address, so that any address
            literal names it; otherwise ``hosts`` holds the one it is bound to.
        origins: Origins (``scheme://host[:port]``) allowed besides the page's own; ``None``: any.
    """

    hosts: frozenset[str] | None
    any_address: bool = False
    origins: frozenset[str] | None

    @classmethod
    def for_dev(
        cls, bound_host: str, allow_hosts: Iterable[str], allow_origins: Iterable[str]
    ) -> OriginPolicy:
        """A dev runner's: loopback names and its own address, plus what the flags allow."""
        extra_hosts = {_host_name(h) for h in allow_hosts}
        extra_origins = {_origin(o) for o in allow_origins}
        bound = _host_name(bound_host)
        address = _address(bound)
        return cls(
            hosts=None if ANY in extra_hosts else frozenset({*_LOOPBACK_NAMES, bound, *extra_hosts}),
            any_address=address is not None and address.is_unspecified,
            origins=None if ANY in extra_origins else frozenset(extra_origins),
        )

    @classmethod
    def for_public(cls, allow_hosts: Iterable[str], allow_origins: Iterable[str]) -> OriginPolicy:
        """A serving runner's: any ``Host`` and ``Origin``, unless the flags name the ones allowed."""
        hosts = {_host_name(h) for h in allow_hosts}
        origins = {_origin(o) for o in allow_origins}
        return cls(
            hosts=frozenset(hosts) if hosts and ANY not in hosts else None,
            origins=frozenset(origins) if origins and ANY not in origins else None,
        )

    def host_allowed(self, host: str | None) -> bool:
        """Whether a request sent with this ``Host`` is meant for this listener."""
        if self.hosts is None or host is None:
            # No Host at all is no browser's request (HTTP/1.1 browsers always send one).
            return True
        name = _host_name(host)
        if name in self.hosts or name.endswith(".localhost"):
            return True
        address = _address(name)
        return address is not None and (address.is_loopback or self.any_address)

    def origin_allowed(self, origin: str | None, host: str | None) -> bool:
        """Whether a request from a page of ``origin`` may be answered (``None``: not from a page)."""
        if self.origins is None or origin is None:
            return True
        seen = _origin(origin)
        if seen in self.origins:
            return True
        scheme, sep, netloc = seen.partition("://")
        # The page's own origin: it names the host it sent the request to.
        return (
            bool(sep) and scheme in ("http", "https") and host is not None and netloc == host.strip().lower()
        )


def _header(scope: Any, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return None


class OriginGuard:
    """ASGI middleware: a request (or WebSocket upgrade) the policy refuses never reaches the app."""

    def __init__(self, app: Any, policy: OriginPolicy) -> None:
        self.app = app
        self.policy = policy

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        host = _header(scope, b"host") or _header(scope, b":authority")
        origin = _header(scope, b"origin")
        if not self.policy.host_allowed(host):
            refusal = (421, f"this listener does not answer for the host {_host_name(host or '')!r}")
        elif not self.policy.origin_allowed(origin, host):
            refusal = (403, f"requests from pages of {origin!r} are not allowed here")
        else:
            await self.app(scope, receive, send)
            return
        await _refuse(scope, send, *refusal)


async def _refuse(scope: Any, send: Any, status: int, detail: str) -> None:
    body = json_bytes(ErrorBody(error="invalid_request", detail=detail))
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    if scope["type"] == "http":
        # The body, if any, is never read: the connection does not outlive the answer.
        headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        return
    if "websocket.http.response" in scope.get("extensions", {}):
        await send({"type": "websocket.http.response.start", "status": status, "headers": headers})
        await send({"type": "websocket.http.response.body", "body": body})
    else:
        await send({"type": "websocket.close", "code": 1008})
