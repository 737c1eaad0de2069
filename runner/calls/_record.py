"""A call's record in the journal: its events under the session id, and the end a crash left out."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from journal import Entry, Journal, JournalClosed, JournalWriteFailed

from ..wire import (
    HostMessage,
)

log = logging.getLogger("runner.calls")

KEEP_JSON_BYTES = 4096
END_REASON_CRASHED = "runner_crashed"


def keep_json(value: Any) -> tuple[Any, bool]:
    """The record's copy of a payload: as sent up to 4 KiB of JSON, else its first 4 KiB as text."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    data = text.encode()
    if len(data) <= KEEP_JSON_BYTES:
        return value, False
    return data[:KEEP_JSON_BYTES].decode(errors="ignore"), True


def host_message_event(message: HostMessage, outcome: str, **extra: Any) -> dict[str, Any]:
    """The ``curb.message`` payload of a host message, as the agent's own records shape it."""
    kept, truncated = keep_json(message.payload)
    event: dict[str, Any] = {"from": "host", "key": message.name, "id": message.id}
    if message.in_reply_to is not None:
        event["inReplyTo"] = message.in_reply_to
    event["payload"] = kept
    event["outcome"] = outcome
    event.update(extra)
    if truncated:
        event["truncated"] = True
    return event


def _event_body(name: str, payload: Mapping[str, Any]) -> dict[str, Any]:
    """A conversation event's body; the journal stamps its seq and at in after the type."""
    return {"type": "event", "name": name, "payload": dict(payload)}


class CallRecord:
    """Writes one call's records: its producer is the session id."""

    def __init__(self, journal: Journal, session_id: str) -> None:
        self.journal = journal
        self.session_id = session_id
        self.host_outcomes: set[str] = set()
        """Ids of host messages whose outcome record (anything but ``held``) was handed to the journal."""

    async def event(self, name: str, payload: Mapping[str, Any]) -> None:
        """A conversation event: ``{type:"event", seq, at, name, payload}``."""
        outcome_of: str | None = None
        if name == "curb.message" and payload.get("from") == "host" and payload.get("outcome") != "held":
            # Noted before the append: a writer cancelled while it waits still has its record written.
            outcome_of = str(payload.get("id"))
            self.host_outcomes.add(outcome_of)
        try:
            await self.journal.append(self.session_id, "conversation", _event_body(name, payload), stamp=True)
        except (JournalWriteFailed, JournalClosed):
            if outcome_of is not None:
                self.host_outcomes.discard(outcome_of)
            raise

    async def end(
        self,
        reason: str,
        messages: Mapping[str, Any] | None,
        undelivered: Sequence[Mapping[str, Any]] = (),
    ) -> None:
        """The call's last records: a ``curb.message`` for each held host message never delivered
        (``undelivered``), ``curb.messages`` (for a call with an agent), then ``curb.ended``.

        One transaction: one commit (one fsync), and a crash leaves all or none.
        """
        last = [("curb.message", payload) for payload in undelivered]
        if messages is not None:
            last.append(("curb.messages", messages))
        last.append(("curb.ended", {"reason": reason}))
        await self.journal.append_many(
            [
                Entry(
                    producer=self.session_id,
                    cls="conversation",
                    body=_event_body(name, payload),
                    stamp=True,
                    closes=name == "curb.ended",
                )
                for name, payload in last
            ]
        )

    async def write(self, cls: str, body: Mapping[str, Any]) -> int:
        """Any other record of this call (turns, host records); returns its seq."""
        record = await self.journal.append(self.session_id, cls, body, stamp=True)
        return record.seq


async def close_open_calls(journal: Journal) -> list[str]:
    """End the record of every call a crash left open, so no conversation stays truncated.

    A host message such a call held (answered 202, journaled ``held``) and never answered gets
    its ``curb.message`` with ``outcome: "undelivered"`` and reason ``runner_crashed`` first.
    """
    open_calls = await journal.open_producers(exclude=["runner"])
    entries: list[Entry] = []
    for session_id, payload in await _unanswered_held(journal):
        undelivered = {**payload, "outcome": "undelivered", "reason": END_REASON_CRASHED}
        entries.append(
            Entry(
                producer=session_id,
                cls="conversation",
                body=_event_body("curb.message", undelivered),
                stamp=True,
            )
        )
    # One transaction for them all: one fsync, however many calls the crash left open.
    ended = _event_body("curb.ended", {"reason": END_REASON_CRASHED})
    entries += [
        Entry(producer=session_id, cls="conversation", body=ended, stamp=True, closes=True)
        for session_id in open_calls
    ]
    await journal.append_many(entries)
    return open_calls


async def _unanswered_held(journal: Journal) -> list[tuple[str, dict[str, Any]]]:
    """The held host messages of the open calls that no outcome followed: (session id, payload)."""
    held: dict[tuple[str, str], dict[str, Any]] = {}
    for record in await journal.read_open_named("conversation", "curb.message", exclude=["runner"]):
        payload = dict(record.body.get("payload") or {})
        if payload.get("from") != "host":
            continue
        key = (record.producer, str(payload.get("id")))
        if payload.get("outcome") == "held":
            held[key] = payload
        else:
            held.pop(key, None)
    return [(session_id, payload) for (session_id, _), payload in held.items()]
