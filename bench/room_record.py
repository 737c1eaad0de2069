"""What the room's record of a worker's call costs (docs/failover.md, worker mode).

    python -m bench.room_record [--quick]        (root: it makes a network namespace)

A worker keeps its call's conversation in the room's metadata (``curb.call``), rewritten after
each turn: it reads the metadata (``ListRooms``), puts its record in, and writes it back
(``UpdateRoomMetadata``). Against a real ``livekit-server`` (1.13.5, dev mode) in a private
network namespace, this measures, in one run:

1. **The server's bound on a room's metadata**: metadata of 64,000 bytes, 64 KiB, 256 KiB,
   1 MiB and 4 MiB (accepted or refused).
2. **One write of the record** the way the worker makes it (``runner.worker.room_record``, and
   ``LiveKitApi``'s read and write), for histories of 3, 20 and 200 short turns and for 200
   turns that fill the bound: its size in bytes, and its latency p50 and p99.
3. The **baseline**: ``UpdateRoomMetadata`` of ``{}`` alone, measured in the same run; each
   write's p50 is given against it.

The client runs inside the namespace (this module again, ``--inside``), as a worker does.
Results go to ``bench/results/room_record-<UTC>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from collections.abc import Sequence
from typing import Any

import trio

from runner.wire import HistoryTurn
from runner.worker import LiveKitApi, LiveKitApiError, parse_room_metadata, room_record

from ._common import fmt, machine_info, print_table, ratio, say, summarize, write_results

HISTORIES = {
    "3 turns": (3, 60),
    "20 turns": (20, 60),
    "200 turns": (200, 60),
    "200 turns of 330 characters (a resume's 64 KiB of text)": (200, 330),
    "200 turns of 1,000 characters (over: the newest that fit)": (200, 1000),
}


def _history(turns: int, chars: int) -> list[HistoryTurn]:
    return [
        HistoryTurn(role="user" if i % 2 else "assistant", text=(f"turn {i} " + "words " * chars)[:chars])
        for i in range(turns)
    ]


async def _inside(samples: int) -> dict[str, Any]:
    api = LiveKitApi(
        os.environ["LIVEKIT_URL"], os.environ["LIVEKIT_API_KEY"], os.environ["LIVEKIT_API_SECRET"]
    )
    room = f"record-{uuid.uuid4().hex[:8]}"
    await api._call("RoomService", "CreateRoom", {"name": room, "empty_timeout": 600}, room_create=True)
    result: dict[str, Any] = {"limit": {}, "writes": {}}
    for size in (64_000, 65_536, 262_144, 1_048_576, 4_194_304):
        try:
            await api.set_room_metadata(room, "x" * size)
            result["limit"][str(size)] = "accepted"
        except LiveKitApiError as exc:
            result["limit"][str(size)] = f"refused: {exc}"
    baseline = []
    for _ in range(samples):
        began = time.perf_counter()
        await api.set_room_metadata(room, "{}")
        baseline.append(time.perf_counter() - began)
    result["baseline"] = summarize(baseline, scale=1000)
    await api.set_room_metadata(room, json.dumps({"app": {"theme": "dark"}}))
    record = {"v": 1, "state": "live", "agent": "agent-AJ_bench", "agentName": "bench", "job": "AJ_bench"}
    for name, (turns, chars) in HISTORIES.items():
        history = _history(turns, chars)
        took = []
        size = dropped = 0
        for _ in range(samples):
            began = time.perf_counter()
            metadata = await api.room_metadata(room)
            other, _ = parse_room_metadata(metadata or "")
            text, dropped = room_record(other, record, history)
            await api.set_room_metadata(room, text)
            took.append(time.perf_counter() - began)
            size = len(text.encode())
        result["writes"][name] = {"bytes": size, "dropped": dropped, **summarize(took, scale=1000)}
    await api.aclose()
    return result


async def run(samples: int, quick: bool) -> dict[str, Any]:
    sys.path.insert(
        0, str(__import__("pathlib").Path(__file__).resolve().parent.parent / "tests" / "livekit")
    )
    from .livekit import livekit_env

    async with livekit_env("curb-room-record-") as (_, env):
        say(f"measuring {samples} writes of each record inside the namespace")
        done = await trio.run_process(
            env.argv([sys.executable, "-m", "bench.room_record", "--inside", "--samples", str(samples)]),
            capture_stdout=True,
            env=env.env(),
        )
    inside = json.loads(done.stdout.decode().strip().splitlines()[-1])
    return {
        "benchmark": "room_record",
        "command": "python -m bench.room_record" + (" --quick" if quick else ""),
        "machine": machine_info(),
        **inside,
    }


def report(result: dict[str, Any]) -> None:
    print("livekit-server's bound on a room's metadata:")
    for size, outcome in result["limit"].items():
        print(f"  {int(size):,} bytes: {outcome}")
    base = result["baseline"]
    rows = [
        [
            "UpdateRoomMetadata of {} (baseline)",
            "2",
            "-",
            fmt(base["p50"], " ms"),
            fmt(base["p99"], " ms"),
            "1.00",
        ]
    ]
    for name, write in result["writes"].items():
        rows.append(
            [
                f"record write, {name}",
                fmt(write["bytes"]),
                str(write["dropped"]),
                fmt(write["p50"], " ms"),
                fmt(write["p99"], " ms"),
                fmt(ratio(write["p50"], base["p50"])),
            ]
        )
    print_table(["", "bytes", "turns left out", "p50", "p99", "p50 / baseline"], rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.room_record", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10 writes of each instead of 50")
    parser.add_argument("--samples", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    samples = args.samples or (10 if args.quick else 50)
    if args.inside:
        print(json.dumps(trio.run(_inside, samples)))
        return 0
    result = trio.run(run, samples, args.quick)
    report(result)
    path = write_results("room_record", result)
    say(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
