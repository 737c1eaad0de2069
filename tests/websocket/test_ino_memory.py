"""What lives behind the agent WebSocket (issue 9), through the socket of a real runner:
knowledge (searched first, and through the platform's tool), moods, relations, compaction,
usage rows and credits. Everything is stored in the runner's SQLite file and outlives restarts.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from journal import open_agent_store

from .ino_agents import KNOWLEDGE
from .ino_client import API_KEY, Addresses, InoSocket, agent_ref, connect, open_socket, start_ino_runner
from .test_ino_spoken import RATE, send_audio, speech

pytestmark = pytest.mark.slow

POOL = KNOWLEDGE[0]["text"]
CHECKOUT = "Checkout is at noon, and late checkout costs twenty euros."


async def _load_knowledge(tmp_path: Path, journal: Path, agent: str) -> None:
    source = tmp_path / "knowledge.jsonl"
    source.write_text("".join(json.dumps(entry) + "\n" for entry in KNOWLEDGE), encoding="utf-8")
    done = await trio.run_process(
        [
            sys.executable,
            "-m",
            "runner",
            "knowledge",
            "load",
            agent_ref(agent),
            str(source),
            "--journal",
            str(journal),
        ],
        capture_stdout=True,
        capture_stderr=True,
    )
    assert done.stdout.decode().strip() == f"loaded 2 knowledge entries for ino-{agent}"


def _one(frames: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [f for f in frames if f["type"] == kind]
    assert len(found) == 1, (kind, frames)
    return found[0]


def _without_seq(frame: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in frame.items() if k not in ("seq", "turn")}


async def _auth_close(addresses: Addresses, token: str, session_id: str) -> tuple[int | None, str | None]:
    async with open_socket(addresses, session_id) as sock:
        await sock.send("auth", key=token, session_id=session_id)
        return await sock.closed()


async def _after_turn(sock: InoSocket) -> list[dict[str, Any]]:
    """What arrives after the last turn.done, up to the answer to a ping."""
    await sock.send("ping")
    return (await sock.until_type("pong"))[:-1]


async def test_knowledge_searched_first_finds_an_entry_or_none_and_replies_report_moods(
    tmp_path: Path,
) -> None:
    journal = tmp_path / "j.db"
    await _load_knowledge(tmp_path, journal, "knowing")
    async with start_ino_runner(journal, "--max-sessions", "4", agent="knowing") as (_, addresses):
        token, session_id = await addresses.api().person("eu-knowing")
        async with connect(addresses, token, session_id) as sock:
            assert sock.ready["emotion"] is True
            assert sock.ready["greeting"] is False

            hit = await sock.say("When is the rooftop pool open?")
            knowledge = _one(hit, "knowledge")
            assert _without_seq(knowledge) == {
                "type": "knowledge",
                "via": "first",
                "outcome": "found",
                "entries": [{"entry_id": "pool", "title": "Rooftop pool", "score": 1.0}],
            }
            # Before the reply, and the reply knows what the entry says.
            assert hit.index(knowledge) < next(i for i, f in enumerate(hit) if f["type"] == "text.delta")
            assert hit[-1]["message"] == POOL
            assert _without_seq(_one(hit, "mood")) == {"type": "mood", "mood": "calm", "intensity": 0.2}
            assert (hit[-1]["mood"], hit[-1]["mood_intensity"]) == ("calm", 0.2)

            miss = await sock.say("Do you have a sauna?")
            assert _without_seq(_one(miss, "knowledge")) == {
                "type": "knowledge",
                "via": "first",
                "outcome": "none",
                "entries": [],
            }
            assert miss[-1]["message"] == "You said: Do you have a sauna?"

            # "late" and "costs" are the concerned mood's words: two of them, 0.6.
            worried = await sock.say("When is checkout?")
            assert worried[-1]["message"] == CHECKOUT
            assert _without_seq(_one(worried, "mood")) == {
                "type": "mood",
                "mood": "concerned",
                "intensity": 0.6,
            }
            assert (worried[-1]["mood"], worried[-1]["mood_intensity"]) == ("concerned", 0.6)
            sock.checker.finish()

        # A turn cancelled before it said anything reports no mood.
        async with connect(addresses, token, session_id, tools=["open_page"]) as sock:
            await sock.send("user_message", text="Open the page of the spa")
            await sock.until_type("tool.call")
            await sock.send("cancel")
            frames = await sock.turn_end()
            assert frames[-1]["type"] == "interrupted"
            assert (frames[-1]["mood"], frames[-1]["mood_intensity"]) == (None, None)
            assert [f for f in frames if f["type"] == "mood"] == []


async def test_knowledge_through_the_platform_search_tool(tmp_path: Path) -> None:
    journal = tmp_path / "j.db"
    await _load_knowledge(tmp_path, journal, "searching")
    async with start_ino_runner(journal, agent="searching") as (_, addresses):
        token, session_id = await addresses.api().person("eu-searching")
        async with connect(addresses, token, session_id) as sock:
            frames = await sock.say("Search knowledge for the rooftop pool")
            kinds = [f["type"] for f in frames]
            assert kinds.index("tool.start") < kinds.index("knowledge") < kinds.index("tool.end")
            assert _without_seq(_one(frames, "tool.start")) == {
                "type": "tool.start",
                "name": "search_knowledge",
                "kind": "platform",
                "call_id": None,
            }
            end = _one(frames, "tool.end")
            assert (end["kind"], end["call_id"], end["ok"]) == ("platform", None, True)
            assert _without_seq(_one(frames, "knowledge")) == {
                "type": "knowledge",
                "via": "tool",
                "outcome": "found",
                "entries": [{"entry_id": "pool", "title": "Rooftop pool", "score": 1.0}],
            }
            done = frames[-1]
            assert done["message"] == f"{POOL}"
            assert done["tool_calls"] == []  # the platform's own calls are not the app's tools

            miss = await sock.say("Search knowledge for a sauna")
            assert _without_seq(_one(miss, "knowledge")) == {
                "type": "knowledge",
                "via": "tool",
                "outcome": "none",
                "entries": [],
            }
            assert miss[-1]["message"] == "Nothing in the knowledge base about sauna."
            # An agent that keeps no relationship and reports no moods says so.
            assert sock.ready["relation"] is None and sock.ready["emotion"] is False
            assert miss[-1]["mood"] is None and [f for f in miss if f["type"] == "mood"] == []
            sock.checker.finish()


async def _relations(addresses: Addresses, bearer: str) -> list[dict[str, Any]]:
    answer = await addresses.api().request("GET", "/v1/agent/relations", bearer=bearer)
    assert answer.status_code == 200, answer.text
    return answer.json()["relations"]


async def test_relations_count_conversations_and_notes_across_a_restart_and_compaction_keeps_early_facts(
    tmp_path: Path,
) -> None:
    journal = tmp_path / "j.db"
    async with start_ino_runner(journal, "--max-sessions", "4", agent="knowing") as (_, addresses):
        api = addresses.api()
        token, first = await api.person("eu-ada")
        async with connect(addresses, token, first) as sock:
            relation = sock.ready["relation"]
            assert (relation["end_user_id"], relation["conversations"], relation["notes"]) == (
                "eu-ada",
                1,
                [],
            )
            assert relation["agent_id"] == sock.ready["agent_id"]
            frames = await sock.say("Please record relationship note guest prefers quiet rooms")
            start = _one(frames, "tool.start")
            assert (start["name"], start["kind"], start["call_id"]) == (
                "record_relationship",
                "platform",
                None,
            )
            assert frames[-1]["message"] == "Noted: guest prefers quiet rooms."
            moved = await _after_turn(sock)
            assert [f["type"] for f in moved] == ["relation"]
            assert moved[0]["turn"] == frames[-1]["turn"]
            assert moved[0]["conversations"] == 1
            assert [n["note"] for n in moved[0]["notes"]] == ["guest prefers quiet rooms"]
            # A turn that records nothing moves nothing.
            await sock.say("When is breakfast?")
            assert await _after_turn(sock) == []
            sock.checker.finish()

        second = (await api.session(token))["session_id"]
        async with connect(addresses, token, second) as sock:
            assert sock.ready["relation"]["conversations"] == 2
            assert [n["note"] for n in sock.ready["relation"]["notes"]] == ["guest prefers quiet rooms"]
            # An early fact, then turns until the conversation passes its 60 words.
            early = "My room number is 512 and my name is Ada."
            await sock.say(early)
            compacted: list[dict[str, Any]] = []
            for text in [
                "When is breakfast?",
                "When is checkout?",
                "When does the spa open?",
                "When is breakfast?",
            ]:
                await sock.say(text)
                compacted = [f for f in await _after_turn(sock) if f["type"] == "compacted"]
                if compacted:
                    break
            assert [_without_seq(f) for f in compacted] == [
                {"type": "compacted", "session_id": second, "after_seq": 6, "trigger": "automatic"}
            ]
            # The local model answers from its instructions only: the summary put the fact there.
            answer = await sock.say("What is my room number?")
            assert "512" in answer[-1]["message"]
            sock.checker.finish()

        mine = await _relations(addresses, token)
        assert [(r["end_user_id"], r["conversations"]) for r in mine] == [("eu-ada", 2)]

    # A restart: the relationship, the summary and the transcript are in the SQLite file.
    async with start_ino_runner(journal, "--max-sessions", "4", agent="knowing") as (_, addresses):
        api = addresses.api()
        third = (await api.session(token))["session_id"]
        async with connect(addresses, token, third) as sock:
            relation = sock.ready["relation"]
            assert relation["conversations"] == 3
            assert [n["note"] for n in relation["notes"]] == ["guest prefers quiet rooms"]
            assert relation["first_at"] <= relation["last_at"]
        async with connect(addresses, token, second) as sock:
            answer = await sock.say("What is my room number?")
            assert "512" in answer[-1]["message"]
        transcript = await api.messages(second, token)
        assert transcript[0]["text"] == early  # compaction changed nothing the app reads
        everyone = await _relations(addresses, API_KEY)
        assert [(r["end_user_id"], r["conversations"]) for r in everyone] == [("eu-ada", 3)]


async def test_usage_rows_and_a_token_that_spends_its_limit_mid_reply(tmp_path: Path) -> None:
    journal = tmp_path / "j.db"
    async with start_ino_runner(journal, "--max-sessions", "4") as (_, addresses):
        api = addresses.api()
        # An idle socket costs nothing: its greeting is charged (speech), its idle time is not.
        idle_token, idle_session = await api.person("eu-idle", credit_limit=1)
        async with connect(addresses, idle_token, idle_session) as sock:
            assert sock.ready["greeting"] is True
        async with open_agent_store(journal) as store:
            greeted = await store.usage_of(idle_session)
        assert [r.kind for r in greeted] == ["speech"]
        async with connect(addresses, idle_token, idle_session) as sock:
            assert sock.ready["greeting"] is False
            await trio.sleep(1)
            await _after_turn(sock)
        token, session_id = await api.person("eu-spender", credit_limit=0.05)
        async with connect(addresses, token, session_id, idle=False) as sock:
            greeting = await sock.turn_end()  # a scripted line: speech only, under the limit
            assert greeting[-1]["type"] == "turn.done"
            frames = await sock.say("When is checkout?")
            done = frames[-1]
            assert done["type"] == "turn.done" and done["message"] == CHECKOUT  # the reply finishes...
            assert await sock.closed() == (4004, "this token has spent its credit limit")  # ...then 4004
            sock.checker.finish()
        assert await _auth_close(addresses, token, session_id) == (
            4004,
            "this token has spent its credit limit",
        )

        async with open_agent_store(journal) as store:
            rows = await store.usage_of(session_id)
            idle_rows = await store.usage_of(idle_session)
        kinds = [r.kind for r in rows]
        assert kinds == ["speech", "model", "speech"]
        model = rows[1]
        assert (model.model, model.input_tokens, model.output_tokens) == (
            "local",
            done["input_tokens"],
            done["output_tokens"],
        )
        assert rows[0].seconds > 0 and rows[2].seconds > 0
        assert sum(r.credits for r in rows) >= 0.05
        assert idle_rows == greeted

        # A spoken turn adds its transcription seconds, as heard.
        talker, talk_session = await api.person("eu-talker")
        async with connect(addresses, talker, talk_session) as sock:
            await sock.send("user_audio.start", rate=RATE)
            await send_audio(sock, await speech(), pace=0)
            await sock.send("user_audio.end")
            spoken = (await sock.turn_end(timeout=30))[-1]
            assert spoken["type"] == "turn.done" and spoken["heard_seconds"] > 0
        async with open_agent_store(journal) as store:
            talk_rows = await store.usage_of(talk_session)
        assert [r.kind for r in talk_rows] == ["speech", "model", "transcription", "speech"]
        assert talk_rows[2].seconds == spoken["heard_seconds"]


async def test_the_runner_credit_pool_and_per_token_limits(tmp_path: Path) -> None:
    flags = ("--credit-pool", "0.15", "--agent-token-turns-per-minute", "2", "--agent-token-connections", "1")
    async with start_ino_runner(tmp_path / "j.db", "--max-sessions", "4", *flags, agent="text_only") as (
        _,
        addresses,
    ):
        api = addresses.api()
        token, session_id = await api.person("eu-busy")
        async with connect(addresses, token, session_id) as sock:
            # One connection per token.
            assert await _auth_close(addresses, token, session_id) == (
                4006,
                "this token already holds 1 connections",
            )
            await sock.say("When is checkout?")
            await sock.say("When is breakfast?")
            await sock.send("user_message", text="When is checkout?")
            assert await sock.closed() == (4006, "this token may take 2 turns a minute")
        # Another token: its reply finishes, then the runner's pool is spent (4005), for everyone.
        other, other_session = await api.person("eu-late")
        async with connect(addresses, other, other_session) as sock:
            frames = await sock.say("When is checkout?")
            assert frames[-1]["type"] == "turn.done"
            assert await sock.closed() == (4005, "the runner's credit pool is spent")
        assert await _auth_close(addresses, other, other_session) == (
            4005,
            "the runner's credit pool is spent",
        )


async def test_compaction_on_request_live_and_offline(tmp_path: Path) -> None:
    async with start_ino_runner(tmp_path / "j.db", "--max-sessions", "4", agent="text_only") as (
        _,
        addresses,
    ):
        api = addresses.api()
        token, session_id = await api.person("eu-manual")
        compact = f"/v1/agent/sessions/{session_id}/compact"
        early = "My room number is 512 and my name is Ada."
        async with connect(addresses, token, session_id) as sock:
            await sock.say(early)
            await sock.say("When is breakfast?")
            # Before any compaction the local model cannot know: it reads only its instructions.
            assert "512" not in (await sock.say("What is my room number?"))[-1]["message"]
            answer = await api.request("POST", compact, bearer=token)
            assert answer.status_code == 200, answer.text
            assert answer.json() == {"session_id": session_id, "compacted": True, "after_seq": 4}
            announced = await _after_turn(sock)
            assert [_without_seq(f) for f in announced] == [
                {"type": "compacted", "session_id": session_id, "after_seq": 4, "trigger": "manual"}
            ]
            assert "512" in (await sock.say("What is my room number?"))[-1]["message"]
            sock.checker.finish()
        # With no socket on it: folded from the stored messages, the summary kept growing.
        answer = await api.request("POST", compact, bearer=API_KEY)
        assert answer.json() == {"session_id": session_id, "compacted": True, "after_seq": 6}
        async with connect(addresses, token, session_id) as sock:
            assert "512" in (await sock.say("What is my room number?"))[-1]["message"]
        assert (await api.messages(session_id, token))[0]["text"] == early
        other_token, _ = await api.person("eu-other")
        assert (await api.request("POST", compact, bearer=other_token)).status_code == 404


async def test_compaction_on_request_waits_for_no_turn(speaking: Addresses) -> None:
    api = speaking.api()
    token, session_id = await api.person("eu-compact-busy")
    async with connect(speaking, token, session_id, tools=["open_page"]) as sock:
        await sock.send("user_message", text="Open the page for the spa", speech=False)
        await sock.until_type("tool.call")
        answer = await api.request("POST", f"/v1/agent/sessions/{session_id}/compact", bearer=token)
        assert answer.status_code == 409
        assert answer.json()["error"] == "conflict"
        await sock.send("cancel")
        await sock.turn_end()
        sock.checker.finish()
