"""curb/client (clients/typescript) in Chromium, against a runner's agent in a real LiveKit room.

The page (clients/typescript/e2e/) loads the built package and livekit-client from node_modules;
lk_browser.py runs it in Debian's Chromium inside the test's network namespace, next to
livekit-server and the runner. Every line of the seed's client example runs, and then the seed's
"livekit-client alone" example as written, against the same agent.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
import trio
from lk_browser import CHROMIUM, CLIENT
from lk_harness import LiveKitEnv, Peer
from lk_runner import AGENT_IDENTITY, Host, agent_spec, open_runner

pytestmark = [pytest.mark.livekit, pytest.mark.slow]

BROWSER = Path(__file__).with_name("lk_browser.py")
NO_HANDLER_WARNING = """curb/client: no handler for the agent's message "show-form"; dropped"""


@pytest.fixture(scope="module")
def client_build() -> Path:
    """The package and the page, built from the sources under test (tsc, a few seconds)."""
    npm = shutil.which("npm")
    if npm is None or not (CLIENT / "node_modules").is_dir():
        pytest.fail("run `npm ci` in clients/typescript (as .ci/run does)", pytrace=False)
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"no Chromium at {CHROMIUM}: run .ci/install-chromium", pytrace=False)
    built = subprocess.run(
        [npm, "run", "--silent", "build:e2e"], cwd=CLIENT, capture_output=True, text=True, timeout=300
    )
    if built.returncode != 0:
        pytest.fail(f"npm run build:e2e failed:\n{built.stdout}\n{built.stderr}", pytrace=False)
    return CLIENT


async def page(browser: Peer, fn: str, *args: Any) -> Any:
    """``window.e2e[fn](...args)`` in the page: what it returned."""
    return (await browser.request("call", fn=fn, args=list(args), timeout=30))["value"]


async def start_call(host: Host, room: str) -> str:
    session_id = f"web-{uuid.uuid4().hex[:8]}"
    started = await host.start_call(session_id, room)
    assert started.status == 202, started.body
    return session_id


def outcomes(records: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [
        r["body"]["payload"]
        for r in records
        if r["body"].get("type") == "event" and r["body"]["name"] == name
    ]


def warnings(browser: Peer, text: str) -> list[dict[str, Any]]:
    """The page's console warnings: those with ``text``, or all of them."""
    return [
        e
        for e in browser.seen
        if e.get("event") == "console" and e["type"] == "warning" and e["text"] == (text or e["text"])
    ]


async def test_the_seed_example_in_chromium(
    livekit: LiveKitEnv, tmp_path: Path, client_build: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The runner's warm-up wants a KugelAudio key; this agent never speaks, so none is used.
    monkeypatch.setenv("KUGELAUDIO_API_KEY", "curb-test-not-a-key")
    room = livekit.unique_room("web")
    async with (
        open_runner(livekit, tmp_path / "journal.db", agent=agent_spec("web")) as host,
        livekit.peer("caller", room, program=BROWSER, ready_timeout=60) as browser,
    ):
        assert (await page(browser, "connectAgent"))["value"] is None
        await page(browser, "on", "show-form")

        # A request made before the agent joined waits for it, then succeeds.
        early: dict[str, Any] = {}

        async def ask_early() -> None:
            early.update(await page(browser, "ask", "quote", {"plan": "basic"}))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask_early)
            await trio.sleep(1.0)
            assert early == {}
            session_id = await start_call(host, room)
        assert early["value"] == {"price": 17}, early
        assert early["elapsedMs"] >= 1000

        # send resolves once the agent took it; on() gets the agent's to_client.
        sent = await page(browser, "send", "claim-submitted", {"claimId": "C-17"})
        assert sent["value"] is None, sent
        shown = await browser.expect("agent_message", key="show-form")
        assert shown["payload"] == {"claimId": "C-17", "fields": ["name", "date"]}
        assert shown["id"]
        quote = await page(browser, "ask", "quote", {"plan": "premium"}, 5000)
        assert quote["value"] == {"price": 42}

        # update: the effective settings, or a coded refusal that changes nothing.
        settings = (await page(browser, "update", {"tts": {"voice": 17}}))["value"]
        assert (settings["tts"]["provider"], settings["tts"]["voice"]) == ("kugelaudio", 17)
        assert settings["llm"] == {"provider": "local", "model": "local"}
        refused = await page(browser, "update", {"stt": {"language": "de"}})
        assert refused["failed"] == "AgentRefusedError", refused
        assert (refused["code"], refused["path"], refused["issues"]) == (
            "not_adjustable",
            "stt.language",
            None,
        )
        refused = await page(browser, "update", {"tts": {"voice": "calm"}})
        assert refused["code"] == "invalid_settings"
        assert refused["issues"][0]["path"] == ["tts", "voice"], refused

        # Every refusal the agent sends is AgentRefusedError with its code.
        assert (await page(browser, "send", "nobody-listens"))["code"] == "no_handler"
        assert (await page(browser, "send", "boom"))["code"] == "handler_failed"
        invalid = await page(browser, "ask", "quote", {"plan": 3})
        assert (invalid["failed"], invalid["code"]) == ("AgentRefusedError", "invalid_payload")
        assert invalid["issues"][0]["path"] == ["plan"]
        too_large = await page(browser, "send", "quote", {"plan": "x" * 16_000})
        assert (too_large["failed"], too_large["code"]) == ("AgentRefusedError", "payload_too_large")
        # A transport failure is LiveKit's own RpcError: here the agent answers too late.
        late = await page(browser, "ask", "slow", {}, 1000)
        assert (late["failed"], late["rpcCode"]) == ("RpcError", 1502), late

        # on() hears only the agent: another participant's curb.message stream is not delivered.
        async with livekit.peer("app", room) as app:
            forged = {"key": "show-form", "payload": {"forged": True}}
            await app.request(
                "send_text", text=json.dumps(forged), topic="curb.message", destinations=["caller"]
            )
        await page(browser, "send", "claim-submitted", {"claimId": "C-18"})
        assert (await browser.expect("agent_message", key="show-form"))["payload"]["claimId"] == "C-18"

        # A message with no handler is dropped with one console warning per key.
        await page(browser, "off", "show-form")
        await page(browser, "send", "claim-submitted", {"claimId": "C-19"})
        await page(browser, "send", "claim-submitted", {"claimId": "C-20"})
        await page(browser, "on", "show-form")
        await page(browser, "send", "claim-submitted", {"claimId": "C-21"})
        assert (await browser.expect("agent_message", key="show-form"))["payload"]["claimId"] == "C-21"
        assert len(warnings(browser, NO_HANDLER_WARNING)) == 1, [
            e for e in browser.seen if e["event"] == "console"
        ]

        # One client per room; close() frees the room for the next.
        second = await page(browser, "connectAgent")
        assert second["failed"] == "Error" and "one agent client per room" in second["message"], second
        await page(browser, "close")

        # The seed's example, line by line as written.
        example = await page(browser, "seedExample")
        assert example["value"] == {"quote": {"price": 17}, "voiceChangeable": True}, example
        assert (await browser.expect("form"))["form"] == {"claimId": "C-17", "fields": ["name", "date"]}
        await page(browser, "closeSeedExample")

        # And the same exchange with livekit-client alone.
        alone = await page(browser, "livekitClientAlone")
        assert alone["value"] == {"received": "C-1"}, alone
        form = await browser.expect("form", via="livekit-client")
        assert form["form"] == {"claimId": "C-1", "fields": ["name", "date"]}

        await host.stop_call(session_id, reason="done")
        records = await host.read_call(session_id)

    assert not [e for e in browser.seen if e.get("event") == "pageerror"]
    assert not [e for e in browser.seen if e.get("event") == "agent_message" and "forged" in e["payload"]]
    messages = [(m["key"], m["outcome"]) for m in outcomes(records, "curb.message")]
    assert messages[:2] == [("quote", "delivered"), ("claim-submitted", "delivered")]
    assert ("nobody-listens", "no_handler") in messages and ("boom", "handler_failed") in messages
    assert ("quote", "invalid_payload") in messages
    # payload_too_large was refused in the page: the agent never saw it.
    assert len([m for m in messages if m[0] == "quote"]) == 4, messages
    settings_outcomes = [(s["origin"], s["outcome"]) for s in outcomes(records, "curb.settings")]
    assert settings_outcomes == [
        ("client", "accepted"),
        ("client", "not_adjustable"),
        ("client", "invalid_settings"),
        ("client", "accepted"),
    ]


async def test_the_seed_example_when_the_voice_is_not_adjustable(
    livekit: LiveKitEnv, tmp_path: Path, client_build: Path
) -> None:
    room = livekit.unique_room("web")
    async with (
        open_runner(livekit, tmp_path / "journal.db", agent=agent_spec("web_fixed")) as host,
        livekit.peer("caller", room, program=BROWSER, ready_timeout=60) as browser,
    ):
        session_id = await start_call(host, room)
        example = await page(browser, "seedExample")
        assert example["value"] == {"quote": {"price": 17}, "voiceChangeable": False}, example
        assert (await browser.expect("form"))["form"]["claimId"] == "C-17"
        await page(browser, "closeSeedExample")

        # options.agentIdentity names the agent; a name nobody has is never found.
        assert (await page(browser, "connectAgent", AGENT_IDENTITY))["value"] is None
        assert (await page(browser, "ask", "quote", {"plan": "basic"}))["value"] == {"price": 17}
        await page(browser, "close")
        await page(browser, "connectAgent", "someone-else")
        missing = await page(browser, "ask", "quote", {"plan": "basic"}, 1000)
        assert missing["failed"] == "AgentUnavailableError", missing
        await page(browser, "close")
        await host.stop_call(session_id, reason="done")


async def test_with_no_agent_a_request_is_agent_unavailable_after_its_timeout(
    livekit: LiveKitEnv, client_build: Path
) -> None:
    room = livekit.unique_room("web")
    async with (
        livekit.peer("caller", room, program=BROWSER, ready_timeout=60) as browser,
        livekit.peer("someone", room) as someone,  # in the room, but not an AGENT
    ):
        await someone.request("wait_participant", identity="caller")
        await page(browser, "connectAgent")
        missing = await page(browser, "ask", "quote", {"plan": "basic"}, 1500)
        assert (missing["failed"], missing["name"]) == ("AgentUnavailableError", "AgentUnavailableError")
        # Chromium coarsens timers and performance.now() to 0.1 ms: allow for it.
        assert 1495 <= missing["elapsedMs"] < 3000, missing
        # The seed's default: 10 s for a request with no timeout of its own.
        missing = await page(browser, "send", "claim-submitted", {"claimId": "C-17"})
        assert missing["failed"] == "AgentUnavailableError", missing
        assert 9_995 <= missing["elapsedMs"] < 12_000, missing
