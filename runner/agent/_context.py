"""The per-call API agent code gets: ``ctx.client``, ``ctx.call``, ``ctx.experiment``,
``ctx.state``, ``ctx.settings``, ``ctx.send`` (``to_client``, ``to_host``, ``dtmf``) and
``ctx.ask_host``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

import attrs

from ..wire import Direction, EffectiveSettings, HistoryTurn, ResumedCall


class HostUnavailableError(Exception):
    """No host is connected to this call, or the call ended while the agent waited."""


class HostTimeoutError(Exception):
    """The host did not answer an ``ask_host`` in time."""


class Entries(Mapping[str, str]):
    """String entries read as attributes: ``ctx.client.event`` (``None`` when absent)."""

    def __init__(self, entries: Mapping[str, str], what: str) -> None:
        self._entries = dict(entries)
        self._what = what

    def __getattr__(self, name: str) -> str | None:
        if name.startswith("_"):
            raise AttributeError(name)
        return self._entries.get(name)

    def __getitem__(self, key: str) -> str:
        return self._entries[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"{self._what}({self._entries!r})"


class Variants(Entries):
    """The call's variant per experiment: ``ctx.experiment.greeting``. Unknown names fail."""

    def __getattr__(self, name: str) -> str:
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self._entries[name]
        except KeyError:
            raise AttributeError(f"this agent declares no experiment {name!r}") from None


@attrs.frozen(kw_only=True)
class CallInfo:
    """Attributes:
    session_id: The host's id of the call.
    direction: ``outbound`` when the host dialed the caller.
    resumed: The call continues one another runner held (a start with ``resume``).
    history: The conversation so far when the call was resumed, oldest first.
    """

    session_id: str
    direction: Direction
    resumed: bool = False
    history: tuple[HistoryTurn, ...] = ()


class CallLink(Protocol):
    """What the call runtime provides to agent code."""

    def to_client(self, key: str, payload: Mapping[str, Any] | None) -> None: ...

    def to_host(self, key: str, payload: Mapping[str, Any] | None) -> None: ...

    async def ask_host(self, key: str, payload: Mapping[str, Any] | None, timeout_s: float) -> Any: ...

    def dtmf(self, digits: str) -> None: ...


class Send:
    """``ctx.send``: messages to the caller's app and to the host, keys to the phone. Never
    raises for delivery: what nobody can receive is dropped with one warning per key and reason.
    """

    def __init__(self, link: CallLink) -> None:
        self._link = link

    def to_client(self, key: str, payload: Mapping[str, Any] | None = None) -> None:
        """Send ``{key, payload}`` to the app on the ``curb.message`` text stream."""
        self._link.to_client(key, payload)

    def to_host(self, key: str, payload: Mapping[str, Any] | None = None) -> None:
        """Write a ``host`` record (``expectsReply: false``) on the events stream."""
        self._link.to_host(key, payload)

    def dtmf(self, digits: str) -> None:
        """Press keys on the call's phone line (``"1"``, ``"0123#"``): RFC 4733 events to the
        phone, in order, after whatever was sent before. Keys are ``0``-``9``, ``*``, ``#`` and
        ``A``-``D``. On a call with no phone line they are dropped with one warning.

        Raises:
            ValueError: ``digits`` is empty or holds something that is not a key.
        """
        self._link.dtmf(digits)


class Context:
    """One call, as its agent's code sees it. Safe to use from tools and handlers."""

    def __init__(
        self,
        *,
        session_id: str,
        direction: Direction,
        client: Mapping[str, str],
        experiments: Mapping[str, str],
        state: Any,
        link: CallLink,
        settings: Callable[[], EffectiveSettings],
        resume: ResumedCall | None = None,
    ) -> None:
        self.call = CallInfo(
            session_id=session_id,
            direction=direction,
            resumed=resume is not None,
            history=tuple(resume.history) if resume is not None else (),
        )
        self.client = Entries(client, "client")
        self.experiment = Variants(experiments, "experiment")
        self.state = state
        self.send = Send(link)
        self._link = link
        self._settings = settings

    @property
    def session_id(self) -> str:
        return self.call.session_id

    @property
    def settings(self) -> EffectiveSettings:
        """The settings the call runs with now, host and client changes included."""
        return self._settings()

    async def ask_host(
        self, key: str, payload: Mapping[str, Any] | None = None, *, timeout: float = 10.0
    ) -> Any:
        """Ask the host and wait for its answer (the payload of its ``inReplyTo`` message).

        Raises:
            HostUnavailableError: No host is connected, or the call ended while waiting.
            HostTimeoutError: No answer within ``timeout`` seconds.
        """
        return await self._link.ask_host(key, payload, timeout)
