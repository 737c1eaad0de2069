"""The room carries the call (docs/failover.md): the record a worker keeps in its room's
metadata (who holds the call, its client context, the conversation so far), kept current
as the call's turns are written and removed when the call ends.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from journal import Journal

from ..calls import Call
from ..wire import (
    HISTORY_BYTES_MAX,
    HISTORY_TEXT_MAX,
    HISTORY_TURNS_MAX,
    HistoryTurn,
    ResumedCall,
)
from ._api import API_FAILED, LiveKitApi

log = logging.getLogger("runner.worker")


ROOM_KEY = "curb.call"
"""The key of the room metadata's JSON object this runner keeps its call's record under."""
RESUMES_KEY = "curb.resumes"
"""The key of a re-dispatch's metadata naming the agent identity whose call it picks up."""
RESUMES_JOB_KEY = "curb.resumesJob"
"""The key of a re-dispatch's metadata naming the job whose call it picks up."""
ROOM_METADATA_MAX = 128 * 1024
"""The most the room's metadata may hold with our record in it, in bytes: a ``resume``'s
64 KiB of text fits in it with room for the JSON and the metadata's other keys, and it is a
quarter of livekit-server 1.13.5's own bound (512 KiB, ``limit.max_metadata_size``)."""
# A call that ended this way leaves its room's record: another agent of the same identity took
# its place (a duplicate re-dispatch), and that one keeps the record current.
KEEPS_ROOM_RECORD = ("disconnected: DUPLICATE_IDENTITY",)


def compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def room_record(
    other: dict[str, Any],
    record: dict[str, Any],
    history: list[HistoryTurn],
    *,
    limit: int = ROOM_METADATA_MAX,
) -> tuple[str, int]:
    """The room's metadata with ``record`` (and the newest turns of ``history`` that fit) under
    :data:`ROOM_KEY`, every other key of ``other`` kept; and how many older turns were left out.

    The turns are bounded as a ``resume`` is (200 turns, 4096 characters each, 64 KiB of text)
    and so that the whole metadata stays within ``limit`` bytes.
    """
    turns: list[dict[str, str]] = []
    text_bytes = 0
    for turn in reversed(history):
        text = turn.text[:HISTORY_TEXT_MAX]
        text_bytes += len(text.encode())
        if len(turns) == HISTORY_TURNS_MAX or text_bytes > HISTORY_BYTES_MAX:
            break
        turns.append({"role": turn.role, "text": text})
    turns.reverse()
    base = {**other, ROOM_KEY: {**record, "history": [], "dropped": 0}}
    # Each turn costs its own JSON and a comma; the dropped count may grow by a few digits.
    room = len(compact(base).encode()) + 8
    sizes = [len(compact(turn).encode()) + 1 for turn in turns]
    total = sum(sizes)
    start = 0
    while start < len(turns) and room + total > limit:
        total -= sizes[start]
        start += 1
    kept = turns[start:]
    dropped = len(history) - len(kept)
    return compact({**other, ROOM_KEY: {**record, "history": kept, "dropped": dropped}}), dropped


def parse_room_metadata(metadata: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """A room's metadata as (every other key, our record or None); metadata that is not a JSON
    object is kept under no key of ours: it is replaced only when we write (and logged)."""
    try:
        parsed = json.loads(metadata) if metadata else {}
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        return {}, None
    ours = parsed.pop(ROOM_KEY, None)
    return parsed, ours if isinstance(ours, dict) else None


def history_of(record: dict[str, Any]) -> list[HistoryTurn]:
    """The turns a room's record carries (malformed ones skipped)."""
    turns = []
    for turn in record.get("history") or []:
        if (
            isinstance(turn, dict)
            and turn.get("role") in ("user", "assistant")
            and isinstance(turn.get("text"), str)
        ):
            turns.append(HistoryTurn(role=turn["role"], text=turn["text"][:HISTORY_TEXT_MAX]))
    return turns


class RoomRecords:
    """The record of each call this worker holds, in its room's metadata.

    Args:
        api: The LiveKit server's API the metadata is read and written through.
        journal: The runner's journal, whose turn records the room's record follows.
    """

    def __init__(self, api: LiveKitApi, journal: Journal) -> None:
        self._api = api
        self._journal = journal
        self.writes: list[tuple[int, float]] = []
        """Each write of a room's record: its bytes and how long it took (ms)."""

    async def resumed(self, room: str, resumes: str) -> tuple[ResumedCall, dict[str, Any] | None]:
        """The ``resume`` of a re-dispatched job: the history the room's record carries."""
        record: dict[str, Any] | None = None
        try:
            metadata = await self._api.room_metadata(room)
            _, record = parse_room_metadata(metadata or "")
        except API_FAILED as exc:
            log.warning(
                "room %r: its record could not be read (%s): the call resumes without history", room, exc
            )
        history = history_of(record) if record is not None and record.get("agent") == resumes else []
        return ResumedCall(history=history, reason="worker_lost"), record

    async def carry(
        self, call: Call, room: str, record: dict[str, Any], history: list[HistoryTurn], cursor: int
    ) -> None:
        """Keep the room's record current: written at the start and after each turn the call
        writes (turns that come while a write is on its way go out with the next one)."""
        journal = self._journal
        written = -1
        while True:
            if len(history) != written:
                written = len(history)
                await self.write(room, record, history)
            await journal.wait_past(cursor)
            head = journal.head
            records = await journal.read(cursor, 10_000, producer=call.session_id)
            cursor = max(head, records[-1].envelope) if records else head
            for entry in records:
                role, text = entry.body.get("role"), entry.body.get("text")
                if (
                    entry.body.get("type") == "turn"
                    and role in ("user", "assistant")
                    and isinstance(text, str)
                ):
                    history.append(HistoryTurn(role=role, text=text))

    async def write(self, room: str, record: dict[str, Any], history: list[HistoryTurn]) -> None:
        began = time.perf_counter()
        try:
            metadata = await self._api.room_metadata(room)
            if metadata is None:
                return
            other, _ = parse_room_metadata(metadata)
            text, dropped = room_record(other, record, history)
            await self._api.set_room_metadata(room, text)
        except API_FAILED as exc:
            log.warning("room %r: its record could not be written: %s", room, exc)
            return
        took_ms = (time.perf_counter() - began) * 1000
        log.debug(
            "room %r: record of %d turns (%d left out), %d bytes, %.1f ms",
            room,
            len(history),
            dropped,
            len(text.encode()),
            took_ms,
        )
        self.writes.append((len(text.encode()), took_ms))

    async def forget(self, room: str, job_id: str) -> None:
        """Remove the room's record of a call that ended: its room is not to be picked up.

        Only this call's own record: an agent of the same identity that took its place (a
        duplicate re-dispatch) keeps its own."""
        try:
            metadata = await self._api.room_metadata(room)
            other, ours = parse_room_metadata(metadata or "")
            if metadata is not None and ours is not None and ours.get("job") == job_id:
                await self._api.set_room_metadata(room, compact(other) if other else "")
        except API_FAILED as exc:
            log.warning("room %r: its record could not be removed: %s", room, exc)
