"""The runner's status: each held call's ``LiveCall`` as JSON, kept per call."""

from __future__ import annotations

import logging

log = logging.getLogger("runner.calls")


class StatusParts:
    """Each held call's LiveCall as JSON, in start order, for ``GET /v1/runner``.

    Calls are grouped by start order, and each group keeps its parts joined until one of
    them changes, so an answer re-joins only the groups that changed since the last one.
    """

    GROUP = 128

    def __init__(self) -> None:
        self._groups: dict[int, dict[str, bytes]] = {}
        self._joined: dict[int, bytes] = {}
        self._group_of: dict[str, int] = {}
        self._added = 0

    def set(self, session_id: str, part: bytes) -> None:
        group = self._group_of.get(session_id)
        if group is None:
            # Only the newest group takes new calls, so the groups stay in start order.
            group = self._group_of[session_id] = self._added // self.GROUP
            self._added += 1
        self._groups.setdefault(group, {})[session_id] = part
        self._joined.pop(group, None)

    def discard(self, session_id: str) -> None:
        group = self._group_of.pop(session_id, None)
        if group is None:
            return
        parts = self._groups[group]
        del parts[session_id]
        self._joined.pop(group, None)
        if not parts:
            del self._groups[group]

    def joined(self, before: bytes = b"", after: bytes = b"") -> bytes:
        """Every part, comma-separated, between ``before`` and ``after``: one copy of the whole."""
        out = [before]
        for group, parts in self._groups.items():
            joined = self._joined.get(group)
            if joined is None:
                joined = self._joined[group] = b",".join(parts.values())
            out += (joined, b",")
        if len(out) > 1:
            out.pop()
        out.append(after)
        return b"".join(out)
