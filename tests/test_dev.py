"""``runner dev``: the conversation in the terminal, typed turns, reload on save, Ctrl-C."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import httpx
import trio

from tests.runner_process import RunnerProcess, start_runner
from tests.websocket.ino_client import Addresses, connect

SHOP = """\
from runner.agent import Agent

shop = Agent("shop", instructions="We sell bicycles. We open at {hour}.", greeting="Hello from the shop.")
"""


def _said(runner: RunnerProcess, text: str) -> int:
    return sum(text in line for line in runner.stderr)


async def test_dev_shows_the_conversation_takes_typed_turns_and_reloads_on_save(tmp_path: Path) -> None:
    agent = tmp_path / "shop.py"
    agent.write_text(SHOP.format(hour="nine"), encoding="utf-8")
    async with start_runner(tmp_path / "j.db", command="dev", agent=str(agent), stdin=True) as runner:
        # The greeting shows without anyone typing.
        await runner.wait_for(lambda: _said(runner, "Hello from the shop.") == 1, timeout=30)
        await runner.type("when do you open")
        await runner.wait_for(lambda: _said(runner, "We open at nine.") == 1)

        agent.write_text(SHOP.format(hour="ten"), encoding="utf-8")
        await runner.wait_for(
            lambda: _said(runner, "shop.py changed: the calls restart with the new code") == 1
        )
        await runner.wait_for(lambda: _said(runner, "Hello from the shop.") == 2)
        await runner.type("when do you open")
        await runner.wait_for(lambda: _said(runner, "We open at ten.") == 1)

        # A file that no longer loads: its error is shown and the agent before it keeps answering.
        agent.write_text(SHOP.format(hour="eleven") + "oops = (\n", encoding="utf-8")
        await runner.wait_for(lambda: _said(runner, "shop.py changed but does not load") == 1)
        await runner.wait_for(lambda: _said(runner, "SyntaxError") == 1)
        await runner.type("when do you open")
        await runner.wait_for(lambda: _said(runner, "We open at ten.") == 2)
        assert _said(runner, "eleven") == 0

        # Ctrl-C: the terminal's call is the author's own, so the runner exits at once.
        runner.signal(signal.SIGINT)
        assert await runner.wait_exit(timeout=10) == 0
    assert [e["event"] for e in runner.lifecycle] == ["ready", "draining", "ended"]
    # The terminal's call keeps its session id across reloads: replay finds every start of it.
    replayed = await trio.run_process(
        [sys.executable, "-m", "runner", "replay", "--journal", str(tmp_path / "j.db"), "--producer", "dev"],
        capture_stdout=True,
    )
    started = [line for line in replayed.stdout.decode().splitlines() if "curb.started" in line]
    ended = [line for line in replayed.stdout.decode().splitlines() if "curb.ended" in line]
    assert len(started) == 2, replayed.stdout.decode()
    assert len(ended) == 2 and "agent_reloaded" in ended[0], ended
    assert _said(runner, "Traceback") == 0
    # The conversation is on stderr: stdout holds only the lifecycle lines, as on every runner.
    assert all(line.startswith("curb-hosted ") for line in runner.stdout if line)


async def test_the_playground_is_served_by_dev_only(tmp_path: Path) -> None:
    public = "runner: public listener on "
    for command, status in (("serve", 404), ("dev", 200)):
        async with start_runner(tmp_path / f"{command}.db", command=command) as runner:
            await runner.wait_for(lambda: any(line.startswith(public) for line in runner.stderr))
            (address,) = [line.removeprefix(public) for line in runner.stderr if line.startswith(public)]
            async with httpx.AsyncClient(base_url=f"http://{address}", timeout=10) as client:
                page = await client.get("/")
                minted = await client.post("/dev/session")
            assert (page.status_code, minted.status_code) == (status, 201 if status == 200 else 404), command
            if command == "dev":
                assert "<title>curb-runner playground</title>" in page.text
                assert set(minted.json()) == {"token", "session_id", "agent"}
                assert any(line == f"runner: playground on http://{address}/" for line in runner.stderr)
            runner.signal(signal.SIGINT)
            assert await runner.wait_exit() == 0


async def test_a_reload_restarts_the_playgrounds_call_too(tmp_path: Path) -> None:
    public = "runner: public listener on "
    agent = tmp_path / "shop.py"
    agent.write_text(SHOP.format(hour="nine"), encoding="utf-8")
    async with start_runner(tmp_path / "j.db", command="dev", agent=str(agent), stdin=True) as runner:
        await runner.wait_for(lambda: any(line.startswith(public) for line in runner.stderr))
        (address,) = [line.removeprefix(public) for line in runner.stderr if line.startswith(public)]
        addresses = Addresses(management=runner.address, public=address)
        async with httpx.AsyncClient(base_url=f"http://{address}", timeout=10) as client:
            minted = (await client.post("/dev/session")).json()
        token, session_id = minted["token"], minted["session_id"]

        async with connect(addresses, token, session_id) as sock:
            assert (await sock.say("when do you open"))[-1]["message"] == "We open at nine."
            agent.write_text(SHOP.format(hour="ten"), encoding="utf-8")
            # The socket's call ends with the old code: the page is told to reconnect.
            code, _ = await sock.closed(timeout=30)
        assert code == 4013
        async with connect(addresses, token, session_id) as sock:
            assert (await sock.say("when do you open"))[-1]["message"] == "We open at ten."
        runner.signal(signal.SIGINT)
        assert await runner.wait_exit() == 0


OVEN = """\
from runner.agent import Agent, Context

oven = Agent("oven", instructions="We bake.", greeting="Oven here.")


@oven.tool
def bake(ctx: Context, kind: str) -> str:
    \"\"\"Bake a pizza.\"\"\"
    raise RuntimeError("the oven is cold")
"""


async def test_a_tool_that_raises_shows_where_and_never_cuts_a_conversation_line(tmp_path: Path) -> None:
    agent = tmp_path / "oven.py"
    agent.write_text(OVEN, encoding="utf-8")
    for level, traceback in (("info", False), ("debug", True)):
        async with start_runner(
            tmp_path / f"{level}.db", "--log-level", level, command="dev", agent=str(agent), stdin=True
        ) as runner:
            await runner.wait_for(lambda: _said(runner, "Oven here.") == 1, timeout=30)
            await runner.type("bake a margherita")
            await runner.wait_for(lambda: _said(runner, "Sorry, I could not bake: the oven is cold.") == 1)
            runner.signal(signal.SIGINT)
            assert await runner.wait_exit(timeout=10) == 0
        # The warning says where the tool raised, at every level; the traceback at debug.
        (warning,) = [line for line in runner.stderr if "tool bake failed" in line]
        assert f"RuntimeError: the oven is cold (at {agent}:9 in bake)" in warning, warning
        assert (_said(runner, "Traceback (most recent call last)") == 1) is traceback, level
        assert (_said(runner, 'raise RuntimeError("the oven is cold")') == 1) is traceback, level
        # No line holds both the log and the conversation: a log line ends the conversation
        # line it would cut, which is then shown again, whole, as it goes on.
        lines = [line for line in runner.stderr if "[bake(" in line]
        assert all(line.startswith("[bake(kind='margherita')] ") for line in lines), lines
        assert lines[-1].startswith(
            "[bake(kind='margherita')] [bake: failed: RuntimeError: the oven is cold in "
        )
        assert (
            lines[-1].rstrip().endswith(" ms)") and "Sorry, I could not bake: the oven is cold." in lines[-1]
        )
        assert not any("tool bake failed" in line for line in lines), lines
