"""Metrics and traces of real calls: scraped with prometheus-client's own parser, spans from the
OpenTelemetry SDK's in-memory exporter."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from journal import Record
from runner.telemetry import configure_tracing

from .agent.test_runtime import send_pcm, silence, speech
from .agents import observed
from .inprocess import InProcessRunner, open_runner
from .runner_process import open_events, start_runner
from .test_logs import refusing_url

pytestmark = pytest.mark.slow

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
METRICS_LINE = "runner: metrics listener on "


def parse(text: str) -> Samples:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def scrape(client: httpx.AsyncClient, path: str = "/v1/metrics") -> Samples:
    response = await client.get(path)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    return parse(response.text)


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


async def wait_records(
    runner: InProcessRunner, session_id: str, done: Callable[[list[Record]], bool]
) -> list[Record]:
    journal = runner.runner.journal
    with trio.fail_after(30):
        while True:
            head = (await journal.window()).head  # before the read: no commit slips between
            records = await journal.read(0, 10_000, producer=session_id)
            if done(records):
                return records
            await journal.wait_past(head)


def assistant_turns(records: list[Record]) -> list[dict[str, Any]]:
    return [
        dict(r.body) for r in records if r.body.get("type") == "turn" and r.body.get("role") == "assistant"
    ]


def start(session_id: str) -> dict[str, Any]:
    return {"sessionId": session_id, "realtimeUrl": "loopback://x", "realtimeToken": "t"}


async def test_a_scripted_call_moves_each_counter_by_what_it_did(tmp_path: Path) -> None:
    async with open_runner(observed, tmp_path, max_sessions=1) as runner, runner.client() as client:
        async with httpx.AsyncClient(base_url=runner.base_url) as anonymous:
            assert (await anonymous.get("/v1/metrics")).status_code == 401
        before = await scrape(client)
        assert (await client.post("/v1/sessions", json=start("m-1"))).status_code == 202
        caller = await runner.wait_caller("m-1")
        await wait_records(runner, "m-1", lambda rs: len(assistant_turns(rs)) == 1)  # the greeting
        caller.say("what is the weather in lisbon")
        await wait_records(runner, "m-1", lambda rs: len(assistant_turns(rs)) == 2)
        refused = await client.post(
            "/v1/sessions/m-1/messages", json={"id": "h-1", "name": "nobody", "payload": {}}
        )
        assert refused.json()["error"] == "no_handler"
        assert (await client.post("/v1/sessions", json=start("m-2"))).json()["error"] == "runner_at_capacity"
        during = await scrape(client)
        assert value(during, "curb_calls", state="connected", mode="managed") == 1
        assert (await client.delete("/v1/sessions/m-1", params={"reason": "done"})).status_code == 200
        records = await wait_records(
            runner, "m-1", lambda rs: any(r.body.get("name") == "curb.ended" for r in rs)
        )
        async with open_events(runner, "from=0") as events:
            await events.lines(until=lambda ls: ls[-1].get("envelope") == runner.runner.journal.head)
            after = await scrape(client)
            head, commits = runner.runner.journal.head, runner.runner.journal.commits

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    turns = assistant_turns(records)
    assert [t["interrupted"] for t in turns] == [False, False]
    assert moved("curb_calls_started_total", transport="loopback") == 1
    assert moved("curb_call_starts_refused_total", code="runner_at_capacity") == 1
    assert moved("curb_calls_ended_total", reason="done") == 1
    assert moved("curb_host_messages_total", outcome="no_handler") == 1
    assert moved("curb_turns_total", outcome="completed") == 2
    assert moved("curb_turn_first_audio_seconds_count") == 2
    assert moved("curb_tts_first_byte_seconds_count", provider="espeak") == sum(
        t["chunksSpoken"] for t in turns
    )
    # The greeting is scripted; the weather turn asked the model at least once for words.
    assert moved("curb_model_first_token_seconds_count", provider="local") >= 1
    assert not [k for k in after if k[0] == "curb_provider_errors_total"]
    # No call is held any more.
    assert not [k for k in after if k[0] == "curb_calls"]
    # The journal: every record counted once, one observation per commit.
    assert value(after, "curb_journal_head_envelope") == head
    assert value(after, "curb_journal_appends_total") == head
    assert value(after, "curb_journal_commit_seconds_count") == commits
    assert value(after, "curb_journal_oldest_envelope") == 1
    assert value(after, "curb_journal_wal_bytes") > 0
    # The one reader, having read everything, is not behind.
    assert value(after, "curb_stream_followers") == 1
    assert value(after, "curb_stream_max_lag_records") == 0
    assert value(before, "curb_stream_followers") == 0


async def test_the_metrics_listener_needs_no_token_and_counts_provider_errors(tmp_path: Path) -> None:
    with refusing_url() as url:
        async with (
            start_runner(
                tmp_path / "j.db",
                "--metrics-address",
                "127.0.0.1:0",
                agent="tests.agents:unreachable_model",
                env={"TEST_LLM_URL": url},
            ) as runner,
            runner.client() as client,
        ):
            (line,) = [line for line in runner.stderr if line.startswith(METRICS_LINE)]
            sidecar = "http://" + line.removeprefix(METRICS_LINE)
            assert (await client.post("/v1/sessions", json=start("p-1"))).status_code == 202
            async with httpx.AsyncClient(base_url=sidecar) as anonymous:
                # Another process: polled, a bounded number of times.
                for _ in range(400):
                    samples = await scrape(anonymous, "/metrics")
                    if value(samples, "curb_turns_total", outcome="failed") >= 1:
                        break
                    await trio.sleep(0.05)
                # Only /metrics is served there.
                assert (await anonymous.get("/v1/runner")).status_code == 404
            assert (
                value(samples, "curb_provider_errors_total", provider="openai-compatible", code="unavailable")
                == 1
            )
            assert value(samples, "curb_model_first_token_seconds_count", provider="openai-compatible") == 0
            assert value(samples, "curb_calls", state="connected", mode="managed") == 1
            # A managed runner serves the agent WebSocket: its gauge is there, and no socket is open.
            assert ("curb_agent_sockets_open", ()) in samples
            assert value(samples, "curb_agent_sockets_open") == 0
            # The same families behind the token on the management listener.
            assert (await client.get("/v1/metrics")).status_code == 200


@contextmanager
def in_memory_spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    configure_tracing(provider)
    try:
        yield exporter
    finally:
        configure_tracing(None)
        provider.shutdown()


async def test_spans_nest_call_turn_and_provider_requests(tmp_path: Path) -> None:
    with in_memory_spans() as exporter:
        async with open_runner(observed, tmp_path) as runner, runner.client() as client:
            assert (await client.post("/v1/sessions", json=start("t-1"))).status_code == 202
            caller = await runner.wait_caller("t-1")
            await wait_records(runner, "t-1", lambda rs: len(assistant_turns(rs)) == 1)
            caller.say("what is the weather in lisbon")
            await wait_records(runner, "t-1", lambda rs: len(assistant_turns(rs)) == 2)
            send_pcm(caller, await speech("what is the weather in berlin") + silence(2.5))
            await wait_records(runner, "t-1", lambda rs: len(assistant_turns(rs)) == 3)
            await client.delete("/v1/sessions/t-1", params={"reason": "done"})
        spans = exporter.get_finished_spans()

    def named(name: str) -> list[ReadableSpan]:
        return [s for s in spans if s.name == name]

    (call,) = named("call")
    assert call.parent is None
    assert call.attributes is not None
    assert dict(call.attributes) == {
        "curb.session_id": "t-1",
        "curb.transport": "loopback",
        "curb.direction": "inbound",
        "curb.end_reason": "done",
    }
    turns = named("turn")
    assert len(turns) == 3
    assert all(t.parent is not None and t.parent.span_id == call.context.span_id for t in turns)
    turn_ids = {t.context.span_id for t in turns}
    for kind, provider, model in (
        ("llm", "local", "local"),
        ("tts", "espeak", None),
        ("stt", "pocketsphinx", None),
    ):
        found = named(kind)
        assert found, kind
        # A transcription (or a model request) made speculatively at a pause in speech runs
        # before its turn exists: a child of the call. Everything else is a child of a turn.
        parents = turn_ids | ({call.context.span_id} if kind in ("stt", "llm") else set())
        for span in found:
            assert span.parent is not None and span.parent.span_id in parents, kind
            assert span.attributes is not None
            assert span.attributes["curb.provider"] == provider
            if model is not None:
                assert span.attributes["curb.model"] == model
    # Spoken or typed, every turn's model request is inside some turn or the call's trace.
    assert any(s.parent is not None and s.parent.span_id in turn_ids for s in named("llm"))
    assert all(s.context.trace_id == call.context.trace_id for s in spans)
