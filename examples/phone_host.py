"""A host for phone calls: answers a ringing phone with a runner's agent, dials out, transfers.

LiveKit's SIP service puts each phone call into a LiveKit room; the host owns the LiveKit
credentials (``LIVEKIT_URL``, ``LIVEKIT_API_KEY``, ``LIVEKIT_API_SECRET``) and the runner's
management token (``CURB_MANAGEMENT_TOKEN``). See docs/telephony.md.

    # Inbound: each phone that rings in a room named call-... gets the agent (the room's
    # name is the call's session id). An individual dispatch rule with room_prefix "call-".
    python -m examples.phone_host inbound http://127.0.0.1:7071 --room-prefix call- --calls 1

    # Outbound: dial +15550100 through an outbound trunk; once the phone answers, the agent
    # joins with direction "outbound" (the agent reads it as ctx.call.direction).
    python -m examples.phone_host dial http://127.0.0.1:7071 --trunk ST_xxx --number +15550100

    # A cold transfer (SIP REFER): the phone is sent to another number and leaves the room.
    python -m examples.phone_host transfer --room call-42 --identity sip_+15550123 --to sip:desk@pbx

Each step prints one JSON line: what it did, with the session id, room and phone identity.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
from collections.abc import Sequence
from typing import Any, Literal

import anyio

from runner.host import LiveKitRooms, RunnerClient, StartCallRequest


def say(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def rooms_from_env() -> LiveKitRooms:
    return LiveKitRooms(
        os.environ["LIVEKIT_URL"], os.environ["LIVEKIT_API_KEY"], os.environ["LIVEKIT_API_SECRET"]
    )


async def place(
    runner: RunnerClient, rooms: LiveKitRooms, room: str, *, direction: Literal["inbound", "outbound"]
) -> None:
    """Start the runner's call in ``room``: the agent joins it (and answers a ringing phone)."""
    request = StartCallRequest(
        session_id=room,
        realtime_url=rooms.url,
        realtime_token=rooms.agent_token(room),
        direction=direction,
    )
    placed = await runner.start_call(request)
    say(event="placed", sessionId=room, room=room, direction=direction, state=placed.call.state)


async def inbound(runner_url: str, *, room_prefix: str, calls: int, within_s: float) -> int:
    """Answer each phone ringing in a room named ``room_prefix...``, ``calls`` of them."""
    answered: set[str] = set()
    async with (
        rooms_from_env() as rooms,
        RunnerClient(runner_url, token=os.environ["CURB_MANAGEMENT_TOKEN"]) as runner,
    ):
        with anyio.move_on_after(within_s):
            while len(answered) < calls:
                for room in await rooms.list_rooms():
                    if not room.startswith(room_prefix) or room in answered:
                        continue
                    phones = [p for p in await rooms.participants(room) if p.kind == "sip"]
                    if phones:
                        say(
                            event="ringing",
                            room=room,
                            caller=phones[0].identity,
                            number=phones[0].attributes.get("sip.phoneNumber"),
                        )
                        await place(runner, rooms, room, direction="inbound")
                        answered.add(room)
                await anyio.sleep(0.25)
    return 0 if len(answered) == calls else 1


async def dial(runner_url: str, *, trunk: str, number: str, room: str | None) -> int:
    """Dial ``number``; once it answered, the agent joins with direction outbound."""
    room = room or f"out-{secrets.token_hex(4)}"
    identity = f"phone-{number.lstrip('+')}"
    async with (
        rooms_from_env() as rooms,
        RunnerClient(runner_url, token=os.environ["CURB_MANAGEMENT_TOKEN"]) as runner,
    ):
        dialed = await rooms.dial(room, trunk_id=trunk, number=number, identity=identity)
        say(
            event="answered",
            room=room,
            callee=identity,
            sipCallId=dialed.get("sipCallId") or dialed.get("sip_call_id"),
        )
        await place(runner, rooms, room, direction="outbound")
    return 0


async def transfer(*, room: str, identity: str, to: str) -> int:
    async with rooms_from_env() as rooms:
        await rooms.transfer(room, identity, to)
    say(event="transferred", room=room, identity=identity, to=to)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m examples.phone_host", description=__doc__.splitlines()[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    answer = commands.add_parser("inbound", help="give each ringing phone the runner's agent")
    answer.add_argument("runner")
    answer.add_argument("--room-prefix", default="call-")
    answer.add_argument("--calls", type=int, default=1)
    answer.add_argument("--within", type=float, default=60.0, help="give up after this many seconds")
    out = commands.add_parser("dial", help="dial a number, then let the agent talk")
    out.add_argument("runner")
    out.add_argument("--trunk", required=True, help="the outbound trunk's id")
    out.add_argument("--number", required=True)
    out.add_argument("--room")
    move = commands.add_parser("transfer", help="send a phone elsewhere (SIP REFER)")
    move.add_argument("--room", required=True)
    move.add_argument("--identity", required=True)
    move.add_argument("--to", required=True)
    args = parser.parse_args(argv)
    if args.command == "inbound":
        return anyio.run(
            lambda: inbound(args.runner, room_prefix=args.room_prefix, calls=args.calls, within_s=args.within)
        )
    if args.command == "dial":
        return anyio.run(lambda: dial(args.runner, trunk=args.trunk, number=args.number, room=args.room))
    return anyio.run(lambda: transfer(room=args.room, identity=args.identity, to=args.to))


if __name__ == "__main__":
    sys.exit(main())
