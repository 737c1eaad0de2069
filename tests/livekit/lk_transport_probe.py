"""The LiveKit transport on its own, in a Trio program run inside the test namespace.

    python lk_transport_probe.py --url ws://10.213.N.1:7880      (token in $LK_PROBE_TOKEN)

It opens a ``LiveKitTransport`` session (no runner, no agent) and reports on stdout, one
JSON line each, what the session sees and does; the test drives a peer in the same room:

  joined        {identity, room, reachable}
  participant   {joined|left, identity, kind, reachable}     (ParticipantJoined/Left)
  audio         {rate, bytes, count}                          (the first caller frame, then
                                                               every 100th)
  sent          {}                                            send_to_client done
  played        {started_at, cleared_at}                      a tone published, then cleared
  disconnected  {reason}
  left          {threads}                                     the livekit-* threads still
                                                              alive once the session closed

Steps, after the first caller joins: send_to_client("probe", {"n": 1}); publish a 4 s tone
and clear it after 1 s (``clear_audio`` while ``publish_audio`` is still running); then
wait until the caller leaves (or 60 s).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import threading
import time
from array import array
from typing import Any

import trio

from runner.transports import AudioFrame, CallTarget, Disconnected, ParticipantJoined, ParticipantLeft
from runner.transports.livekit import LiveKitSession, LiveKitTransport

TONE_RATE = 22_050


def emit(**msg: Any) -> None:
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


def tone(seconds: float, rate: int = TONE_RATE, hz: float = 440.0) -> bytes:
    return array(
        "h", (int(12_000 * math.sin(2 * math.pi * hz * i / rate)) for i in range(int(seconds * rate)))
    ).tobytes()


async def play_and_clear(session: LiveKitSession) -> None:
    returned: list[float] = []

    async def play() -> None:
        await session.publish_audio(tone(4.0), TONE_RATE)
        returned.append(time.monotonic())

    started = time.monotonic()
    with trio.fail_after(4):  # the clear cuts the 4 s tone short: publish_audio returns early
        async with trio.open_nursery() as nursery:
            nursery.start_soon(play)
            await trio.sleep(1.0)
            cleared = time.monotonic()
            await session.clear_audio()
    emit(event="played", started_at=started, cleared_at=cleared, returned_at=returned[0])


async def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--max-seconds", type=float, default=60.0)
    args = parser.parse_args()
    target = CallTarget(session_id="probe", url=args.url, token=os.environ["LK_PROBE_TOKEN"])
    with trio.move_on_after(args.max_seconds):
        async with LiveKitTransport().open_session(target) as session:
            emit(
                event="joined",
                identity=session.identity,
                room=session.room_name,
                reachable=session.client_reachable(),
            )
            frames = 0
            acted = False
            async for event in session.events:
                if isinstance(event, ParticipantJoined | ParticipantLeft):
                    emit(
                        event="participant",
                        change="joined" if isinstance(event, ParticipantJoined) else "left",
                        identity=event.identity,
                        kind=event.kind,
                        reachable=session.client_reachable(),
                    )
                    if isinstance(event, ParticipantLeft) and event.kind in ("caller", "sip"):
                        break
                    if isinstance(event, ParticipantJoined) and event.kind == "caller" and not acted:
                        acted = True
                        await session.send_to_client("probe", {"n": 1})
                        emit(event="sent")
                        await play_and_clear(session)
                elif isinstance(event, AudioFrame):
                    if frames % 100 == 0:
                        emit(event="audio", rate=event.sample_rate_hz, bytes=len(event.pcm), count=frames)
                    frames += 1
                elif isinstance(event, Disconnected):
                    emit(event="disconnected", reason=event.reason)
                    break
    emit(event="left", threads=[t.name for t in threading.enumerate() if t.name.startswith("livekit-")])
    return 0


if __name__ == "__main__":
    sys.exit(trio.run(main))
