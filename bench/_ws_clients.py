"""The clients of bench.websocket, in a process of their own (so the runner, not they, is measured).

    python -m bench._ws_clients '{"public": "127.0.0.1:PORT", "api_key": ..., "sockets": N, ...}'

Each of N people gets an ephemeral key and a conversation, opens an ``ino.v2`` socket and
authenticates; then the process prints ``ready`` and waits for a line on stdin. On that
line every socket takes ``turns`` typed turns, one after another, until ``seconds`` pass.
It prints one JSON line: per turn, seconds from sending ``user_message`` to the first
``text.delta``, the first binary (audio) frame and the turn's end, and then the round trip
of a ``ping`` sent right after the turn (to its ``pong``).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import httpx
import trio
from trio_websocket import open_websocket_url

QUESTION = "When is breakfast served?"
_TEXT_DELTA = '{"type":"text.delta"'
_ENDS = ('{"type":"turn.done"', '{"type":"interrupted"')


async def _person(client: httpx.AsyncClient, api_key: str, person: str) -> tuple[str, str]:
    minted = await client.post(
        "/v1/ephemeral-keys",
        json={"end_user_id": person, "ttl_seconds": 86_400},
        headers={"Authorization": f"Bearer {api_key}"},
    )
    minted.raise_for_status()
    token = minted.json()["token"]
    session = await client.post("/v1/agent/sessions", json={}, headers={"Authorization": f"Bearer {token}"})
    session.raise_for_status()
    return token, session.json()["session_id"]


async def _socket(
    public: str,
    token: str,
    session_id: str,
    turns: int,
    opened: trio.Semaphore,
    go: trio.Event,
    deadline: list[float],
    out: list[list[float | None]],
) -> None:
    url = f"ws://{public}/v1/agent/stream?session_id={session_id}"
    async with open_websocket_url(url, subprotocols=["ino.v2"], max_message_size=4 << 20) as ws:
        stream = ws._stream
        await ws.send_message(json.dumps({"type": "auth", "key": token, "session_id": session_id}))
        ready = json.loads(await ws.get_message())
        if ready.get("type") != "ready":
            raise RuntimeError(f"not ready: {ready}")
        opened.release()
        await go.wait()
        for _ in range(turns):
            if time.perf_counter() > deadline[0]:
                break
            first_text = first_audio = None
            began = time.perf_counter()
            await ws.send_message(json.dumps({"type": "user_message", "text": QUESTION}))
            while True:
                message = await ws.get_message()
                now = time.perf_counter() - began
                if isinstance(message, bytes):
                    if first_audio is None:
                        first_audio = now
                elif message.startswith(_TEXT_DELTA):
                    if first_text is None:
                        first_text = now
                elif message.startswith(_ENDS):
                    total = now
                    break
                elif message.startswith('{"type":"error"'):
                    raise RuntimeError(message)
            # The floor under any frame's latency at this load: a ping's round trip through
            # the same socket, the runner's reader and writer, and both processes' wake-ups.
            pinged = time.perf_counter()
            await ws.send_message('{"type":"ping"}')
            while (await ws.get_message()) != '{"type":"pong"}':
                pass
            out.append([first_text, first_audio, total, time.perf_counter() - pinged])
    await stream.aclose()  # trio-websocket leaves it open when the server closed first


async def main(config: dict[str, Any]) -> None:
    public, count = config["public"], config["sockets"]
    async with httpx.AsyncClient(base_url=f"http://{public}", timeout=300) as client:
        people: list[tuple[str, str]] = []
        async with trio.open_nursery() as nursery:
            limit = trio.Semaphore(8)

            async def mint(index: int) -> None:
                async with limit:
                    people.append(await _person(client, config["api_key"], f"{config['prefix']}-{index}"))

            for index in range(count):
                nursery.start_soon(mint, index)
    opened = trio.Semaphore(0)
    go = trio.Event()
    deadline = [float("inf")]
    samples: list[list[float | None]] = []
    # Opening hundreds of sockets on a loaded machine takes a while; the turns then have
    # their own deadline (``seconds``, checked before each turn).
    with trio.fail_after(config["seconds"] + 600):
        async with trio.open_nursery() as nursery:
            for token, session_id in people:
                nursery.start_soon(
                    _socket, public, token, session_id, config["turns"], opened, go, deadline, samples
                )
            for _ in people:
                await opened.acquire()
            print("ready", flush=True)
            await trio.to_thread.run_sync(sys.stdin.readline)
            deadline[0] = time.perf_counter() + config["seconds"]
            go.set()
    print(json.dumps({"samples": samples}), flush=True)


if __name__ == "__main__":
    trio.run(main, json.loads(sys.argv[1]))
