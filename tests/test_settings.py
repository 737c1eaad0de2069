"""Live session settings: the seed's "Live session settings", from the host (PATCH) and the client
(``curb.update`` over the loopback caller).

Refusals, answers and records from the host's side run against a real ``runner serve`` process
(``tests.agents:tunable``, with an OpenAI key in its environment that must never come out).
What needs the caller (a client's update, the voice a reply is spoken in) runs the runner
in-process (``tests/inprocess.py``), still over HTTP.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import trio

from runner.transports import ClientRefusal
from runner.transports.loopback import LoopbackCaller

from . import agents
from .inprocess import (
    HeldLoopback,
    answer,
    call_start,
    conforms,
    ended,
    events_named,
    follow,
    of,
    open_runner,
    refused,
    turns,
)
from .providers.fake_servers import open_fake_server, openai_events, openai_text_chunks, openai_usage
from .runner_process import RunnerProcess, start_runner

SECRET = "sk-test-secret"


@asynccontextmanager
async def tunable(tmp_path: Path) -> AsyncIterator[tuple[RunnerProcess, httpx.AsyncClient]]:
    """``runner serve tests.agents:tunable`` with an OpenAI key in its environment, and a host client."""
    async with (
        start_runner(
            tmp_path / "j.db", agent="tests.agents:tunable", env={"OPENAI_API_KEY": SECRET}
        ) as runner,
        runner.client() as client,
    ):
        yield runner, client


async def place(client: httpx.AsyncClient, session_id: str, url: str = "loopback://x") -> None:
    answer(await client.post("/v1/sessions", json=call_start(session_id, url)), 202, "StartCallResponse")


async def patch(client: httpx.AsyncClient, session_id: str, update: Any) -> httpx.Response:
    return await client.patch(f"/v1/sessions/{session_id}", json=update)


async def accepted(client: httpx.AsyncClient, session_id: str, update: Any) -> dict[str, Any]:
    """PATCH ``update``; assert 200 SessionSettingsResponse; return the settings."""
    body = answer(await patch(client, session_id, update), 200, "SessionSettingsResponse")
    assert body["sessionId"] == session_id
    return body["settings"]


def issue_paths(body: dict[str, Any]) -> list[list[Any]]:
    assert body["issues"] and all(isinstance(i["message"], str) and i["message"] for i in body["issues"]), (
        body
    )
    return [issue["path"] for issue in body["issues"]]


def settings_events(records: list[dict[str, Any]], producer: str) -> list[dict[str, Any]]:
    return events_named(records, producer, "curb.settings")


async def update(caller: LoopbackCaller, body: Any) -> dict[str, Any]:
    """A client's ``curb.update``: the effective settings it answers."""
    settings = json.loads(await caller.request("curb.update", json.dumps(body)))
    return conforms("EffectiveSettings", settings)


async def update_refused(caller: LoopbackCaller, body: Any) -> ClientRefusal:
    with pytest.raises(ClientRefusal) as refusal:
        await caller.request("curb.update", json.dumps(body))
    return refusal.value


# -- The host's PATCH: refusals ----------------------------------------------------------------------


@pytest.mark.slow
async def test_not_adjustable_names_the_first_path_and_changes_nothing(tmp_path: Path) -> None:
    async with tunable(tmp_path) as (runner, client), follow(runner) as follower:
        await place(client, "c1")
        # The host may change tts.voice but not tts.model: the whole update is refused.
        body = refused(
            await patch(client, "c1", {"tts": {"voice": "en+f3", "model": "m"}}), 403, "not_adjustable"
        )
        assert body["path"] == "tts.model"
        both = {"stt": {"language": "en"}, "tts": {"model": "m", "voice": "x"}}
        body = refused(await patch(client, "c1", both), 403, "not_adjustable")
        assert body["path"] == "tts.model"
        # Nothing changed: the voice is still the agent's own.
        settings = await accepted(client, "c1", {"stt": {"language": "en"}})
        assert settings["tts"]["voice"] == "en"
        await client.delete("/v1/sessions/c1")
        await follower.wait_for(lambda rs: ended(rs, "c1"))
    events = settings_events(follower.records, "c1")
    assert [(e["origin"], e["outcome"], e.get("path")) for e in events] == [
        ("host", "not_adjustable", "tts.model"),
        ("host", "not_adjustable", "tts.model"),
        ("host", "accepted", None),
    ]
    assert events[0]["update"] == {"tts": {"voice": "en+f3", "model": "m"}}


@pytest.mark.slow
async def test_nothing_is_adjustable_unless_declared(tmp_path: Path) -> None:
    async with start_runner(tmp_path / "j.db") as runner, runner.client() as client:  # tests.agents:quiet
        await place(client, "c1")
        for body, path in [
            ({"tts": {"voice": "en"}}, "tts.voice"),
            ({"stt": {"language": "en"}, "tts": {"voice": "en"}}, "stt.language"),
            ({"llm": {"provider": "openai", "model": "gpt-4o-mini"}}, "llm"),
        ]:
            assert refused(await patch(client, "c1", body), 403, "not_adjustable")["path"] == path


@pytest.mark.slow
async def test_invalid_settings_refuse_the_whole_update_with_issues(tmp_path: Path) -> None:
    async with tunable(tmp_path) as (runner, client), follow(runner) as follower:
        await place(client, "c1")
        cases: list[tuple[dict[str, Any], list[list[Any]]]] = [
            # pocketsphinx takes no language but English; the valid voice beside it changes nothing.
            ({"tts": {"voice": "en+f3"}, "stt": {"language": "de"}}, [["stt", "language"]]),
            ({"llm": {"provider": "acme", "model": "m1"}}, [["llm", "provider"]]),
            (
                {"llm": {"provider": "openai-compatible", "model": "m1", "baseURL": "ftp://example.net/v1"}},
                [["llm", "baseURL"]],
            ),
            ({"tts": {"voice": "en", "speed": 1.5}}, [["tts", "speed"]]),
            ({"vad": {"threshold": 0.5}}, [["vad"]]),
            ({"tts": {"voice": "no-such-voice"}}, [["tts", "voice"]]),
        ]
        # Not a settings update at all: a malformed request, refused before the agent and not recorded
        # (a curb.settings once recorded it: tests/fuzz/test_management.py).
        for not_an_object in ([], "en", 1):
            refused(await patch(client, "c1", not_an_object), 400, "invalid_request")
        for body, paths in cases:
            error = refused(await patch(client, "c1", body), 422, "invalid_settings")
            assert issue_paths(error) == paths, (body, error)
        # Refused updates changed nothing: the next accepted one shows the agent's own values.
        settings = await accepted(client, "c1", {"llm": {"provider": "openai", "model": "gpt-4o-mini"}})
        assert settings["tts"]["voice"] == "en" and settings["stt"].get("language") is None
        await client.delete("/v1/sessions/c1")
        await follower.wait_for(lambda rs: ended(rs, "c1"))
    events = settings_events(follower.records, "c1")
    assert [e["outcome"] for e in events] == ["invalid_settings"] * len(cases) + ["accepted"]
    assert [[i["path"] for i in e["issues"]] for e in events[:-1]] == [paths for _, paths in cases]
    assert all(e["origin"] == "host" for e in events)


@pytest.mark.slow
async def test_a_patch_to_an_unknown_call_or_with_a_malformed_body(tmp_path: Path) -> None:
    async with tunable(tmp_path) as (_, client):
        refused(await patch(client, "nobody", {"tts": {"voice": "en"}}), 404, "session_not_found")
        await place(client, "c1")
        for content in (b"{nope", b'{"llm":{"temperature":NaN}}'):
            not_json = await client.patch(
                "/v1/sessions/c1", content=content, headers={"content-type": "application/json"}
            )
            refused(not_json, 400, "invalid_request")
        refused(await patch(client, "c1", [{"tts": {"voice": "en"}}]), 400, "invalid_request")


# -- The host's PATCH: accepted ----------------------------------------------------------------------


@pytest.mark.slow
async def test_an_accepted_patch_answers_the_effective_settings_and_is_journaled(tmp_path: Path) -> None:
    async with tunable(tmp_path) as (runner, client), follow(runner) as follower:
        await place(client, "c1")
        settings = await accepted(client, "c1", {"tts": {"voice": "en+f3"}, "stt": {"language": "en-US"}})
        assert settings["tts"]["provider"] == "espeak" and settings["tts"]["voice"] == "en+f3"
        assert settings["tts"]["options"] == {"voice": "en+f3"}
        assert settings["stt"] == {"provider": "pocketsphinx", "language": "en-US"}
        assert settings["llm"] == {"provider": "local", "model": "local"}
        # The host may name any http(s) endpoint; later changes of other paths keep the voice.
        endpoint = {"provider": "openai-compatible", "model": "m1", "baseURL": "https://llm.example.net/v1"}
        settings = await accepted(client, "c1", {"llm": endpoint})
        assert settings["llm"] == endpoint and settings["tts"]["voice"] == "en+f3"
        await client.delete("/v1/sessions/c1")
        await follower.wait_for(lambda rs: ended(rs, "c1"))
    events = settings_events(follower.records, "c1")
    assert [(e["origin"], e["outcome"]) for e in events] == [("host", "accepted"), ("host", "accepted")]
    assert events[1]["update"] == {"llm": endpoint}
    assert events[1]["settings"]["llm"] == endpoint
    conforms("EffectiveSettings", events[1]["settings"])


@pytest.mark.slow
async def test_no_api_key_in_any_answer_or_record(tmp_path: Path) -> None:
    texts: list[str] = []
    async with tunable(tmp_path) as (runner, client), follow(runner) as follower:

        async def keep(response: httpx.Response) -> httpx.Response:
            texts.append(response.text)
            return response

        await keep(await client.post("/v1/sessions", json=call_start("c1")))
        for body in [
            {"llm": {"provider": "openai", "model": "gpt-4o-mini"}},
            {
                "llm": {
                    "provider": "openai-compatible",
                    "model": "m1",
                    "baseURL": "https://llm.example.net/v1",
                }
            },
            {"llm": {"provider": "anthropic", "model": "claude"}},
            {"llm": {"provider": "openai", "model": "gpt-4o-mini"}, "stt": {"language": "de"}},
            {"tts": {"model": "m"}},
            {"llm": {"provider": "openai"}},
        ]:
            await keep(await patch(client, "c1", body))
        await keep(await client.get("/v1/sessions/c1"))
        await keep(await client.get("/v1/runner"))
        await keep(await client.delete("/v1/sessions/c1"))
        await follower.wait_for(lambda rs: ended(rs, "c1"))
        lines = [json.dumps(r) for r in follower.records]
    assert len(settings_events(follower.records, "c1")) == 6
    everything = texts + lines + runner.stdout + runner.stderr
    assert [text for text in everything if SECRET in text] == []


# -- The client's curb.update ------------------------------------------------------------------------


async def test_a_client_update_is_accepted_only_where_listed_for_the_client(tmp_path: Path) -> None:
    async with (
        open_runner(agents.tunable, tmp_path) as runner,
        runner.client() as client,
        follow(runner) as follower,
    ):
        await place(client, "c1")
        caller = await runner.wait_caller("c1")
        settings = await update(caller, {"tts": {"voice": "en+f3"}})
        assert settings["tts"]["voice"] == "en+f3"
        # stt.language and llm are the host's to change, not the client's: the first is named.
        three = {
            "tts": {"voice": "en"},
            "stt": {"language": "en"},
            "llm": {"provider": "openai", "model": "m"},
        }
        refusal = await update_refused(caller, three)
        assert (refusal.code, refusal.data) == ("not_adjustable", {"path": "stt.language"})
        refusal = await update_refused(
            caller, {"llm": {"provider": "openai", "model": "m"}, "stt": {"language": "en"}}
        )
        assert (refusal.code, refusal.data) == ("not_adjustable", {"path": "llm"})
        refusal = await update_refused(caller, {"tts": {"voice": "no-such-voice"}})
        assert refusal.code == "invalid_settings" and refusal.data is not None
        assert [i["path"] for i in refusal.data["issues"]] == [["tts", "voice"]]
        # What the host sees: the client's voice, unchanged by the refusals.
        assert (await accepted(client, "c1", {}))["tts"]["voice"] == "en+f3"
        await client.delete("/v1/sessions/c1")
        await follower.wait_for(lambda rs: ended(rs, "c1"))
    events = settings_events(follower.records, "c1")
    assert [(e["origin"], e["outcome"], e.get("path")) for e in events] == [
        ("client", "accepted", None),
        ("client", "not_adjustable", "stt.language"),
        ("client", "not_adjustable", "llm"),
        ("client", "invalid_settings", None),
        ("host", "accepted", None),
    ]


async def test_the_endpoint_stays_the_authors(tmp_path: Path) -> None:
    foreign = {"provider": "openai-compatible", "model": "m2", "baseURL": "https://llm.example.net/v1"}
    own = {"provider": "openai-compatible", "model": "m2", "baseURL": "http://127.0.0.1:9/v1"}
    async with open_runner(agents.own_endpoint, tmp_path) as runner, runner.client() as client:
        await place(client, "c1")
        caller = await runner.wait_caller("c1")
        refusal = await update_refused(caller, {"llm": foreign})
        assert refusal.code == "invalid_settings" and refusal.data is not None
        assert [i["path"] for i in refusal.data["issues"]] == [["llm", "baseURL"]]
        assert (await update(caller, {"llm": own}))["llm"] == own
        assert (await update(caller, {"llm": {"provider": "openai", "model": "gpt-4o-mini"}}))["llm"] == {
            "provider": "openai",
            "model": "gpt-4o-mini",
        }
        # The host may point the model anywhere.
        assert (await accepted(client, "c1", {"llm": foreign}))["llm"] == foreign


async def test_a_kugelaudio_voice_is_numeric(tmp_path: Path) -> None:
    async with open_runner(agents.kugel, tmp_path) as runner, runner.client() as client:
        await place(client, "c1")
        error = refused(await patch(client, "c1", {"tts": {"voice": "calm"}}), 422, "invalid_settings")
        assert issue_paths(error) == [["tts", "voice"]]
        settings = await accepted(client, "c1", {"tts": {"voice": 17}})
        assert settings["tts"]["provider"] == "kugelaudio" and settings["tts"]["voice"] == 17
        assert settings["tts"]["options"] == {"voice": 17}
        caller = await runner.wait_caller("c1")
        refusal = await update_refused(caller, {"tts": {"voice": "calm"}})
        assert refusal.code == "invalid_settings"
        assert (await update(caller, {"tts": {"voice": 1072}}))["tts"]["voice"] == 1072


async def test_a_voice_override_outlives_a_skill_switch(tmp_path: Path) -> None:
    async with open_runner(agents.skilled, tmp_path) as runner, runner.client() as client:
        await place(client, "c1")
        assert (await accepted(client, "c1", {"tts": {"voice": "en+f3"}}))["tts"]["voice"] == "en+f3"
        response = await client.post(
            "/v1/sessions/c1/messages", json={"id": "m-1", "name": "formal", "payload": {}}
        )
        assert answer(response, 202, "HostMessageAccepted")["delivered"] is True
        # The skill's own voice (en-us) would apply now, but the outside change stays on top.
        assert (await accepted(client, "c1", {}))["tts"]["voice"] == "en+f3"


async def test_an_accepted_llm_change_never_fails_the_call(tmp_path: Path) -> None:
    seed_example = {"provider": "kugelaudio", "model": "qwen3.8-27b"}
    async with (
        open_runner(agents.tunable, tmp_path) as runner,
        runner.client() as client,
        follow(runner) as follower,
    ):
        await place(client, "c1")
        caller = await runner.wait_caller("c1")
        response = await patch(client, "c1", {"llm": seed_example})
        if response.status_code == 422:  # this runner cannot reach that provider: refused up front
            assert issue_paths(refused(response, 422, "invalid_settings")) == [["llm", "provider"]]
            return
        assert (await accepted(client, "c1", {}))["llm"] == seed_example
        caller.say("Hello there.")
        await follower.wait_for(lambda rs: turns(rs, "c1", "assistant") or ended(rs, "c1"))
        # The turn may fail; the call must not.
        assert not ended(follower.records, "c1"), events_named(follower.records, "c1", "curb.ended")
        assert answer(await client.get("/v1/sessions/c1"), 200, "LiveCall")["state"] == "connected"


# -- When a change takes effect: heard in the audio ---------------------------------------------------


def pitch_hz(pcm: bytes, rate: int) -> float:
    """The median fundamental frequency of the voiced 40 ms frames of ``pcm`` (autocorrelation)."""
    x = np.frombuffer(pcm, dtype=np.int16).astype(np.float64)
    size = int(rate * 0.04)
    found = []
    for start in range(0, len(x) - size, size // 2):
        frame = x[start : start + size] - x[start : start + size].mean()
        if np.sqrt((frame**2).mean()) < 500:
            continue  # quiet: no pitch to read
        correlation = np.correlate(frame, frame, "full")[size - 1 :]
        low, high = int(rate / 400), int(rate / 60)
        lag = low + int(np.argmax(correlation[low:high]))
        if correlation[lag] > 0.3 * correlation[0]:
            found.append(rate / lag)
    assert len(found) >= 10, "too little voiced audio to read a pitch from"
    return float(np.median(found))


LOW_VOICE_HZ = 140  # espeak "en" speaks near 97 Hz, "en+f3" near 197 Hz
RATE = 22_050  # espeak's PCM


def take_audio(caller: LoopbackCaller) -> bytes:
    """All the agent speech the caller has received and not read yet."""
    pcm = bytearray()
    while True:
        try:
            chunk = caller.audio.receive_nowait()
        except trio.WouldBlock:
            return bytes(pcm)
        if chunk is not None:
            pcm += chunk


async def receive_audio(caller: LoopbackCaller, seconds: float, rate: int, timeout: float = 10) -> bytes:
    """Wait until the caller received ``seconds`` of agent speech; return it."""
    pcm = bytearray()
    with trio.fail_after(timeout):
        while len(pcm) < seconds * rate * 2:
            pcm += await caller.audio.receive() or b""
    return bytes(pcm)


class GatedChat:
    """An OpenAI-compatible chat endpoint (the model service cannot run here) whose replies
    stream their pieces as the test lets them: each reply is a list of text pieces and
    :class:`trio.Event` gates to wait for in between.
    """

    def __init__(self, *replies: list[str | trio.Event]) -> None:
        self._replies = list(replies)
        self.models: list[str] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (message := await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.models.append(json.loads(body)["model"])
        reply = self._replies.pop(0)
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        texts = [piece for piece in reply if isinstance(piece, str)]
        events = iter(openai_events(openai_text_chunks(texts, usage=openai_usage(10, len(texts)))))
        await send({"type": "http.response.body", "body": next(events), "more_body": True})  # the role chunk
        for piece in reply:
            if isinstance(piece, trio.Event):
                await piece.wait()
            else:
                await send({"type": "http.response.body", "body": next(events), "more_body": True})
        for rest in events:
            await send({"type": "http.response.body", "body": rest, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def test_a_new_voice_is_heard_from_the_next_reply_not_the_current_one(tmp_path: Path) -> None:
    gate = trio.Event()
    chat = GatedChat(
        ["This is the first sentence of my reply. ", gate, "And this is the second sentence of it."],
        ["Now I speak in the voice you chose for me."],
    )
    async with open_fake_server(chat) as root:
        agent = agents.speaker(f"{root}/v1")
        async with (
            open_runner(agent, tmp_path) as runner,
            runner.client() as client,
            follow(runner) as follower,
        ):
            await place(client, "c1")
            caller = await runner.wait_caller("c1")
            caller.say("Tell me something.")
            before = await receive_audio(caller, 1.0, RATE)  # the first sentence is being spoken
            change = {
                "tts": {"voice": "en+f3"},
                "llm": {"provider": "openai-compatible", "model": "second-model"},
            }
            settings = await accepted(client, "c1", change)
            assert settings["tts"]["voice"] == "en+f3" and settings["llm"]["model"] == "second-model"
            gate.set()
            await follower.wait_for(lambda rs: len(turns(rs, "c1", "assistant")) == 1)
            after = take_audio(caller)  # the rest of the same reply
            caller.say("Go on.")
            await follower.wait_for(lambda rs: len(turns(rs, "c1", "assistant")) == 2)
            following = take_audio(caller)
            await client.delete("/v1/sessions/c1")
            await follower.wait_for(lambda rs: ended(rs, "c1"))
    assert pitch_hz(before, RATE) < LOW_VOICE_HZ
    assert pitch_hz(after, RATE) < LOW_VOICE_HZ  # the reply being spoken finishes in the old voice
    assert pitch_hz(following, RATE) > LOW_VOICE_HZ + 20  # the next reply speaks in the new one
    assert chat.models == ["house-model", "second-model"]  # the model changes from the next turn
    first, second = turns(follower.records, "c1", "assistant")
    assert first["text"] == "This is the first sentence of my reply. And this is the second sentence of it."
    assert first["interrupted"] is False and second["text"] == "Now I speak in the voice you chose for me."
    kinds = [
        r["body"].get("name") or r["body"].get("role")
        for r in of(follower.records, "c1")
        if r["class"] == "conversation"
    ]
    # The change is journaled while the first reply is still running.
    assert kinds.index("curb.settings") < kinds.index("assistant")


async def test_a_change_to_a_starting_call_is_applied_once_it_connects(tmp_path: Path) -> None:
    held = HeldLoopback()
    async with (
        open_runner(agents.tunable_greeter, tmp_path, transport=held) as runner,
        runner.client() as client,
        follow(runner) as follower,
    ):
        placed: list[httpx.Response] = []
        async with trio.open_nursery() as nursery:

            async def start_slow_call() -> None:
                placed.append(await client.post("/v1/sessions", json=call_start("slow", "loopback://x")))

            nursery.start_soon(start_slow_call)
            with trio.fail_after(5):
                await held.joining.wait()
            assert answer(await client.get("/v1/sessions/slow"), 200, "LiveCall")["state"] == "starting"
            settings = await accepted(client, "slow", {"tts": {"voice": "en+f3"}})
            assert settings["tts"]["voice"] == "en+f3"
            assert answer(await client.get("/v1/sessions/slow"), 200, "LiveCall")["state"] == "starting"
            held.release.set()  # now it connects
        answer(placed[0], 202, "StartCallResponse")
        await place(client, "plain")  # the same agent, no change: its own voice
        slow, plain = await runner.wait_caller("slow"), await runner.wait_caller("plain")
        await follower.wait_for(lambda rs: turns(rs, "slow", "assistant") and turns(rs, "plain", "assistant"))
        greeted_changed, greeted_plain = take_audio(slow), take_audio(plain)
    assert pitch_hz(greeted_plain, RATE) < LOW_VOICE_HZ
    assert pitch_hz(greeted_changed, RATE) > LOW_VOICE_HZ + 20
    events = settings_events(follower.records, "slow")
    assert [(e["origin"], e["outcome"]) for e in events] == [("host", "accepted")]
