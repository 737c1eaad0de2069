"""Failover: an agent that left a room whose record says its call was live is sent back
there by a new dispatch, or the room is recorded lost (docs/failover.md).
"""

from __future__ import annotations

import logging
import random
from typing import Any

import trio

from journal import Entry, Journal, JournalWriteFailed

from ._api import API_FAILED, API_TIMEOUT_S, LiveKitApi, is_agent, metadata_map
from ._rooms import RESUMES_JOB_KEY, RESUMES_KEY, ROOM_KEY, compact, history_of, parse_room_metadata

log = logging.getLogger("runner.worker")
NO_WORKER_AFTER_S = 15.0
"""How long a re-dispatch waits for an agent to join before the room is recorded lost."""
SETTLE_S = 2.0
"""How long the room's record must name a re-dispatch's job before its worker says ``moved``."""
LOST_JITTER_S = 2.0


class Failover:
    """Sends a lost call's agent back to its room, or records the room lost.

    Args:
        api: The LiveKit server's API: rooms, participants, dispatches.
        journal: The runner's journal, where each room acted on gets its ``curb.failover``.
        agent_name: The agent name a re-dispatch asks for when the room's record names none.
    """

    def __init__(self, api: LiveKitApi, journal: Journal, *, agent_name: str) -> None:
        self._api = api
        self._journal = journal
        self._agent_name = agent_name
        self._rescuing: set[tuple[str, str]] = set()
        self.failovers: list[dict[str, Any]] = []
        """What this worker did about rooms whose agent left (moved or lost), oldest first."""

    def rescue_nowait(self, room: str, identity: str, metadata_then: str, nursery: trio.Nursery) -> bool:
        """Start sending the agent ``identity`` that left ``room`` back there, in ``nursery``.

        ``metadata_then`` is the room's metadata as the webhook saw it (the room may be gone).
        Returns False when that agent of that room is being sent back already.
        """
        key = (room, identity)
        if key in self._rescuing:
            return False
        self._rescuing.add(key)
        nursery.start_soon(self._rescue, room, identity, metadata_then, nursery)
        return True

    async def _rescue(self, room: str, identity: str, metadata_then: str, nursery: trio.Nursery) -> None:
        try:
            with trio.fail_after(NO_WORKER_AFTER_S + 6 * API_TIMEOUT_S):
                await self._rescue_room(room, identity, metadata_then, nursery)
        except (trio.TooSlowError, *API_FAILED) as exc:
            log.warning("room %r: the call of agent %s could not be sent back: %s", room, identity, exc)
        finally:
            self._rescuing.discard((room, identity))

    async def _rescue_room(self, room: str, identity: str, metadata_then: str, nursery: trio.Nursery) -> None:
        metadata = await self._api.room_metadata(room)
        # A room already closed (its caller left before the agent was noticed gone) is read
        # from the webhook itself: the room as it was when the agent left.
        other, ours = parse_room_metadata(metadata if metadata is not None else metadata_then)
        if ours is None or ours.get("agent") != identity or ours.get("state") != "live":
            return  # no call of ours was cut there: it ended, or another agent holds it
        lost_job = str(ours.get("job") or identity)
        people = await self._api.participants(room) if metadata is not None else []
        if any(is_agent(p) and p.get("identity") == identity for p in people):
            return  # its replacement is there already
        if not any(not is_agent(p) for p in people):
            await self._lost(room, other, ours, lost_job, "caller_gone", nursery)
            return
        for dispatch in await self._api.dispatches(room):
            if metadata_map(dispatch.get("metadata")).get(RESUMES_JOB_KEY) == lost_job:
                return  # another worker (or another delivery of this webhook) sent it back
        context = ours.get("clientContext")
        context = (
            {k: v for k, v in context.items() if isinstance(v, str)} if isinstance(context, dict) else {}
        )
        dispatch_id = await self._api.dispatch(
            room,
            str(ours.get("agentName") or self._agent_name),
            compact({**context, RESUMES_KEY: identity, RESUMES_JOB_KEY: lost_job}),
        )
        log.info(
            "room %r: the call of agent %s (job %s) is dispatched again (%s)",
            room,
            identity,
            lost_job,
            dispatch_id,
        )
        reason = "no_worker"
        deadline = trio.current_time() + NO_WORKER_AFTER_S
        holder: tuple[object, float] | None = None  # the dispatch the room's record names, since
        while trio.current_time() < deadline:
            await trio.sleep(0.25)
            _, now = parse_room_metadata(await self._api.room_metadata(room) or "")
            if now is not None and now.get("job") != lost_job and now.get("state") == "live":
                # A new call holds the room and wrote its record. Told once, by the worker whose
                # dispatch it came from, once the record stayed so for a moment: two racing
                # dispatches end with the newer agent only, and its record.
                if holder is None or holder[0] != now.get("dispatchId"):
                    holder = (now.get("dispatchId"), trio.current_time())
                if trio.current_time() - holder[1] < SETTLE_S:
                    continue
                if holder[0] == dispatch_id:
                    self._record(
                        lost_job,
                        {
                            "outcome": "moved",
                            "room": room,
                            "agent": identity,
                            "dispatchId": dispatch_id,
                            "turns": len(history_of(ours)),
                            "dropped": ours.get("dropped", 0),
                        },
                        nursery,
                    )
                return  # another worker's dispatch holds it: that worker says so
            holder = None
            people = await self._api.participants(room)
            if not any(not is_agent(p) for p in people):
                reason = "caller_gone"
                break
        await self._api.delete_dispatch(room, dispatch_id)
        await self._lost(room, other, ours, lost_job, reason, nursery)

    async def _lost(
        self,
        room: str,
        other: dict[str, Any],
        ours: dict[str, Any],
        lost_job: str,
        reason: str,
        nursery: trio.Nursery,
    ) -> None:
        """A room that cannot be picked up: said in its record, the log and this worker's journal.

        Every worker that heard the webhook may come to this at once: each waits a random
        moment and says it only when the room's record does not already.
        """
        await trio.sleep(random.random() * LOST_JITTER_S)
        try:
            _, now = parse_room_metadata(await self._api.room_metadata(room) or "")
        except API_FAILED:
            now = None
        if now is not None and now.get("job") == lost_job and now.get("state") == "lost":
            return
        log.warning("room %r: the call of job %s cannot be picked up: %s", room, lost_job, reason)
        self._record(
            lost_job,
            {"outcome": "lost", "reason": reason, "room": room, "agent": ours.get("agent")},
            nursery,
        )
        try:
            await self._api.set_room_metadata(
                room, compact({**other, ROOM_KEY: {**ours, "state": "lost", "reason": reason}})
            )
        except API_FAILED as exc:
            log.warning("room %r: its record could not say so: %s", room, exc)

    def _record(self, lost_job: str, payload: dict[str, Any], nursery: trio.Nursery) -> None:
        self.failovers.append({"jobId": lost_job, **payload})
        nursery.start_soon(self._write_record, lost_job, payload)

    async def _write_record(self, lost_job: str, payload: dict[str, Any]) -> None:
        # Under the lost job's own producer, closed: a host following this worker's stream reads
        # one `curb.failover` per room it acted on, and a restart does not reopen it.
        body = {"type": "event", "name": "curb.failover", "payload": payload}
        try:
            await self._journal.append_many(
                [Entry(producer=lost_job, cls="conversation", body=body, stamp=True, closes=True)]
            )
        except JournalWriteFailed as exc:
            log.warning("job %s: the failover record was not written: %s", lost_job, exc)
