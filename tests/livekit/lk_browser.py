"""A LiveKit participant that is a web page in Chromium, driven over stdin/stdout JSON lines.

Run inside the test's network namespace by lk_harness.LiveKitEnv.peer(program=...):

    python lk_browser.py --url ws://10.213.N.1:7880      (token in $LK_PEER_TOKEN)

It starts Debian's Chromium headless through Playwright, opens clients/typescript/e2e/index.html
(the built curb/client and livekit-client from node_modules, served from disk by Playwright's
request routing: nothing is fetched), connects the page's Room, prints {"event": "connected"},
then reads one request per line on stdin, as lk_peer.py does:

  call fn [args]      window.e2e[fn](...args) in the page -> {value: what it returned}
  quit                close the browser and exit

Events: agent_message and form (emitted by the page), console (each console message, with its
type and text), pageerror.

This is test code: Playwright's async API is asyncio, so this program is asyncio.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import mimetypes
import os
import sys
from pathlib import Path
from typing import Any

from playwright.async_api import Error as PlaywrightError
from playwright.async_api import Page, Route, async_playwright

CLIENT = Path(__file__).resolve().parents[2] / "clients" / "typescript"
# localhost is a secure context (crypto.randomUUID needs one); Playwright answers every
# request to it from CLIENT, so no server listens.
ORIGIN = "http://localhost:8000"
SERVED = ("e2e/", "dist/", "node_modules/livekit-client/dist/")
CHROMIUM = os.environ.get("CURB_CHROMIUM", "/usr/bin/chromium")
# No background traffic: the namespace has no route out, and nothing should try one.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]
CALL_TIMEOUT_S = 60.0
MAX_LINE = 1 << 20


def emit(**fields: Any) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


async def serve(route: Route) -> None:
    path = route.request.url.removeprefix(ORIGIN + "/").split("?", 1)[0]
    file = (CLIENT / path).resolve()
    if not path.startswith(SERVED) or not file.is_relative_to(CLIENT) or not file.is_file():
        await route.fulfill(status=404, body=f"not served: {path}")
        return
    kind = "text/javascript" if file.suffix in (".js", ".mjs") else mimetypes.guess_type(file.name)[0]
    await route.fulfill(status=200, body=file.read_bytes(), content_type=kind or "application/octet-stream")


async def call(page: Page, req: dict[str, Any]) -> None:
    req_id = req.get("id")
    try:
        value = await asyncio.wait_for(
            page.evaluate("([fn, args]) => window.e2e[fn](...args)", [req["fn"], req.get("args", [])]),
            CALL_TIMEOUT_S,
        )
    except (PlaywrightError, TimeoutError) as exc:  # reported to the test, which fails on it
        emit(event="result", id=req_id, ok=False, error=f"{type(exc).__name__}: {exc}")
        return
    emit(event="result", id=req_id, ok=True, value=value)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    args = parser.parse_args()
    token = os.environ["LK_PEER_TOKEN"]

    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        context = await browser.new_context()
        # What a person allows when Chromium asks: the server is on a private address (the
        # namespace's veth), and only a page with microphone access gathers ICE candidates on
        # every interface (without it, just the default route's, and the namespace has none).
        await context.grant_permissions(["local-network-access", "microphone"], origin=ORIGIN)
        page = await context.new_page()
        await page.route(f"{ORIGIN}/**", serve)
        await page.expose_function("curbEmit", lambda event: emit(**event))
        page.on("console", lambda msg: emit(event="console", type=msg.type, text=msg.text))
        page.on("pageerror", lambda error: emit(event="pageerror", error=str(error)))
        await page.goto(f"{ORIGIN}/e2e/index.html")
        await page.wait_for_function("() => window.e2e !== undefined", timeout=20_000)
        info = await page.evaluate("([url, token]) => window.e2e.connect(url, token)", [args.url, token])
        emit(event="connected", **info)

        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=MAX_LINE, loop=loop)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader, loop=loop), sys.stdin)
        tasks: set[asyncio.Task[None]] = set()
        while line := await reader.readline():
            req = json.loads(line)
            if req.get("op") == "quit":
                emit(event="result", id=req.get("id"), ok=True)
                break
            if req.get("op") != "call":
                emit(event="result", id=req.get("id"), ok=False, error=f"unknown op {req.get('op')!r}")
                continue
            task = asyncio.create_task(call(page, req))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        for task in tasks:
            task.cancel()
        await browser.close()


if __name__ == "__main__":
    asyncio.run(main())
