"""What the agent sees over a real managed runner: client context, direction, experiments."""

from __future__ import annotations

from pathlib import Path

import pytest

from .runner_process import read_stream, start_runner

pytestmark = pytest.mark.slow


async def test_the_agent_reads_what_the_call_was_started_with(tmp_path: Path) -> None:
    async with (
        start_runner(tmp_path / "j.db", "--max-sessions", "2", agent="examples.concierge") as runner,
        runner.client() as client,
    ):
        for session_id, experiments in [("sent", {"greeting": "formal"}), ("assigned", None)]:
            body = {
                "sessionId": session_id,
                "realtimeUrl": "loopback:",
                "realtimeToken": "t",
                "clientContext": {"event": "the gala"},
                "direction": "outbound",
            }
            if experiments:
                body["experiments"] = experiments
            assert (await client.post("/v1/sessions", json=body)).status_code == 202
        lines = await read_stream(
            runner,
            "from=0",
            until=lambda ls: sum(line["body"].get("role") == "assistant" for line in ls) >= 2,
            timeout=20,
        )
    greetings = {
        line["producer"]: line["body"]["text"] for line in lines if line["body"].get("role") == "assistant"
    }
    started = {
        line["producer"]: line["body"]["payload"]
        for line in lines
        if line["body"].get("name") == "curb.started"
    }
    # Managed: the variant is applied as sent, and the greeting reads client.event.
    assert greetings["sent"] == "Good day, and welcome to Hotel Lumen. How may I help with the gala?"
    assert started["sent"]["experiments"] == {"greeting": "formal"}
    assert started["sent"]["direction"] == "outbound"
    # Not sent: assigned by the seed's rule (here the client context's "greeting" key is absent).
    from examples.concierge import GREETINGS, agent
    from runner.agent import assign_variant

    variant = assign_variant("assigned", "greeting", agent.experiments["greeting"])
    assert started["assigned"]["experiments"] == {"greeting": variant}
    assert greetings["assigned"] == GREETINGS[variant].format(event="the gala")
