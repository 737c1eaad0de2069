"""A small host: places calls on a pool of runners, follows every runner's stream, prints each call.

    runner serve --address 127.0.0.1:7071 --journal a.db &
    runner serve --address 127.0.0.1:7072 --journal b.db &
    CURB_MANAGEMENT_TOKEN=... python -m examples.host http://127.0.0.1:7071 http://127.0.0.1:7072 \\
        --calls 3 --state-dir ./host-state

Each call is placed with ``RunnerPool.start_call`` (which moves on past draining, full and
unreachable runners), talked to for ``--talk-seconds`` and stopped where it runs. A follower
per runner prints every record of every call as it is committed; with ``--state-dir`` each
follower's cursor is saved there, so a restarted host goes on where it stopped, printing
nothing twice and missing nothing (or saying what the runner no longer held).

``--realtime-url`` defaults to ``loopback:`` (the runner's in-process transport); a real host
creates a LiveKit room and a room token per call. ``--backend asyncio`` runs the same code on
asyncio, as a FastAPI host would.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio

from runner.host import (
    EventsCursor,
    JournalRecord,
    Lost,
    RunnerClient,
    RunnerPool,
    SeqGap,
    StartCallRequest,
)
from runner.wire import decode, encode


def describe(record: JournalRecord) -> str | None:
    """One line for a record of a call, or None for one this host does not show."""
    body = record.body
    if record.cls == "conversation" and body.get("type") == "turn":
        return f"{body.get('role')}: {body.get('text')}"
    if record.cls == "conversation" and body.get("type") == "event":
        payload = body.get("payload") or {}
        if body.get("name") == "curb.ended":
            return f"ended ({payload.get('reason')})"
        if body.get("name") == "curb.started":
            return f"started over {payload.get('transport')}"
        return str(body.get("name"))
    if record.cls == "host":
        return f"to the host: {body.get('name')} {json.dumps(body.get('payload'))}"
    return None  # a class this host does not know: skipped, as the protocol asks


class Host:
    def __init__(self, state_dir: Path | None) -> None:
        self.state_dir = state_dir
        self.placed: set[str] = set()
        self.ended: set[str] = set()
        self.all_ended = anyio.Event()

    def _cursor_file(self, url: str) -> Path | None:
        if self.state_dir is None:
            return None
        return self.state_dir / (url.split("//", 1)[-1].replace(":", "_").replace("/", "_") + ".cursor.json")

    def load_cursor(self, url: str) -> EventsCursor | int:
        path = self._cursor_file(url)
        if path is None or not path.exists():
            return 0
        return decode(EventsCursor, json.loads(path.read_text()))

    def save_cursor(self, url: str, cursor: EventsCursor) -> None:
        path = self._cursor_file(url)
        if path is not None:
            partial = path.with_suffix(".tmp")
            partial.write_text(json.dumps(encode(cursor)))
            partial.replace(path)  # atomic: a crash leaves the old cursor or the new one

    async def follow(self, client: RunnerClient) -> None:
        url = client.base_url
        async with client.follow_events(from_=self.load_cursor(url), on_cursor_too_old="resync") as events:
            async for item in events:
                if isinstance(item, Lost):
                    print(f"{url}: envelopes {item.after + 1}..{item.before - 1} were lost ({item.reason})")
                elif isinstance(item, SeqGap):
                    print(f"[{item.producer}] {item.missing} record(s) never reached the stream")
                else:
                    line = describe(item)
                    if line is not None and item.producer != "runner":
                        print(f"[{item.producer}] {line}", flush=True)
                # After the item is handled: a crash before this line shows it again, never loses it.
                await anyio.to_thread.run_sync(self.save_cursor, url, events.cursor)
                # Only then may the host stop: its cursor is past the last call's end.
                if (
                    not isinstance(item, (Lost, SeqGap))
                    and item.body.get("name") == "curb.ended"
                    and item.producer in self.placed
                ):
                    self.ended.add(item.producer)
                    if self.ended >= self.placed:
                        self.all_ended.set()


async def main(
    urls: Sequence[str],
    *,
    token: str,
    calls: int,
    talk_seconds: float,
    realtime_url: str,
    state_dir: Path | None,
) -> None:
    host = Host(state_dir)
    async with RunnerPool(urls, token=token) as pool, anyio.create_task_group() as tasks:
        for url in urls:
            tasks.start_soon(host.follow, pool.client(url))
        session_ids = [f"example-{uuid.uuid4().hex[:8]}" for _ in range(calls)]
        for session_id in session_ids:
            placed = await pool.start_call(
                StartCallRequest(session_id=session_id, realtime_url=realtime_url, realtime_token="-")
            )
            host.placed.add(session_id)
            print(f"placed {session_id} on {placed.runner}", flush=True)
        await anyio.sleep(talk_seconds)
        for session_id in session_ids:
            await pool.stop_call(session_id, reason="host_done")
        with anyio.fail_after(30):
            await host.all_ended.wait()
        tasks.cancel_scope.cancel()


def run(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m examples.host", description=__doc__.splitlines()[0])
    parser.add_argument("urls", nargs="+", help="the runners' management addresses")
    parser.add_argument("--calls", type=int, default=2)
    parser.add_argument("--talk-seconds", type=float, default=2.0)
    parser.add_argument("--realtime-url", default="loopback:")
    parser.add_argument("--state-dir", type=Path, help="where each runner's stream cursor is kept")
    parser.add_argument("--backend", choices=("trio", "asyncio"), default="trio")
    args = parser.parse_args(argv)
    token = os.environ.get("CURB_MANAGEMENT_TOKEN")
    if not token:
        sys.exit("set CURB_MANAGEMENT_TOKEN to the runners' management token")
    if args.state_dir is not None:
        args.state_dir.mkdir(parents=True, exist_ok=True)
    options: dict[str, Any] = {
        "token": token,
        "calls": args.calls,
        "talk_seconds": args.talk_seconds,
        "realtime_url": args.realtime_url,
        "state_dir": args.state_dir,
    }

    async def entry() -> None:
        await main(args.urls, **options)

    anyio.run(entry, backend=args.backend)


if __name__ == "__main__":
    run()
