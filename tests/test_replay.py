"""``runner replay --call ID``: one call read back from the journal file as a timeline."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import trio

from . import agents
from .inprocess import open_runner
from .test_telemetry import assistant_turns, start, wait_records

pytestmark = pytest.mark.slow


async def replay(*args: str) -> tuple[int, str, str]:
    with trio.fail_after(30):
        done = await trio.run_process(
            [sys.executable, "-m", "runner", "replay", *args],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    return done.returncode, done.stdout.decode(), done.stderr.decode()


async def test_a_call_reads_as_a_timeline(tmp_path: Path) -> None:
    async with open_runner(agents.timeline, tmp_path) as runner, runner.client() as client:
        assert (await client.post("/v1/sessions", json=start("tl-1"))).status_code == 202
        caller = await runner.wait_caller("tl-1")
        await wait_records(runner, "tl-1", lambda rs: len(assistant_turns(rs)) == 1)
        caller.say("what is the weather in lisbon")
        await wait_records(runner, "tl-1", lambda rs: len(assistant_turns(rs)) == 2)
        caller.say("what is the weather in atlantis")
        await wait_records(runner, "tl-1", lambda rs: len(assistant_turns(rs)) == 3)
        note = {"id": "h-1", "name": "note", "payload": {"text": "vip"}}
        assert (await client.post("/v1/sessions/tl-1/messages", json=note)).status_code == 202
        nobody = {"id": "h-2", "name": "nobody", "payload": {}}
        assert (await client.post("/v1/sessions/tl-1/messages", json=nobody)).json()["error"] == "no_handler"
        await wait_records(runner, "tl-1", lambda rs: any(r.cls == "host" for r in rs))
        await client.delete("/v1/sessions/tl-1", params={"reason": "done"})
        # Another call in the same journal stays out of this one's timeline.
        assert (await client.post("/v1/sessions", json=start("tl-2"))).status_code == 202
        await wait_records(runner, "tl-2", lambda rs: len(assistant_turns(rs)) == 1)
    journal = str(tmp_path / "journal.db")

    code, out, _ = await replay("--call", "tl-1", "--journal", journal)
    assert code == 0
    lines = out.splitlines()
    assert re.fullmatch(r"call tl-1, first record at \d{4}-\d\d-\d\dT[\d:.]+Z", lines[0])
    offsets = [float(m.group(1)) for line in lines[1:] if (m := re.match(r" *\+(\d+\.\d{3})s  ", line))]
    assert len(offsets) == len(lines) - 1 and offsets == sorted(offsets) and offsets[0] == 0.0
    said = [re.sub(r"^ *\+\d+\.\d{3}s  ", "", line) for line in lines[1:]]
    assert said[0] == "started       loopback, inbound"
    assert said[1] == "agent         Hello, weather desk."
    assert said[2] == "caller        what is the weather in lisbon"
    assert (
        said[3]
        == 'tool          weather(city="lisbon") -> "In lisbon it is sunny." (ok, '
        + said[3].split("(ok, ")[1]
    )
    assert said[4].startswith("agent         ") and "sunny" in said[4]
    assert said[5] == "caller        what is the weather in atlantis"
    assert said[6].startswith(
        'tool          weather(city="atlantis") -> error: ValueError: no station in atlantis ('
    )
    assert said[7].startswith("agent         ")
    assert 'host->agent   note id=h-1 {"text":"vip"}: delivered, reply {"ok":true}' in said
    assert 'agent->host   note.seen id=h-1 {"text":"vip"}' in said
    assert "host->agent   nobody id=h-2 {}: no_handler" in said
    assert said[-1] == "ended         done"
    assert not [line for line in said if "tl-2" in line]

    # --json: the call's lines exactly as the events stream renders them.
    code, out, _ = await replay("--call", "tl-1", "--journal", journal, "--json")
    assert code == 0
    stream = [json.loads(line) for line in out.splitlines()]
    assert {line["producer"] for line in stream} == {"tl-1"}
    assert len(stream) == len([s for s in said if not s.startswith("tool")])
    code, _, err = await replay("--call", "nobody", "--journal", journal)
    assert code == 1
    assert err.strip() == f"runner replay: no records of call 'nobody' in {journal} (never here, or pruned)"
