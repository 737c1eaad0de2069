"""Prometheus metrics: one registry per runner, rendered in the text format on a scrape.

What the runner counts as it happens (counters, histograms) is observed where it happens,
through :func:`current_metrics`, a context variable set once by the runner: every task of
the runner sees its own runner's metrics, and code run outside a runner (the console, a
unit test) sees ``None`` and skips the work. What is a state rather than an event (calls
by state, the journal's head, followers and their lag) is read when scraped, so it costs
nothing between scrapes. docs/observability.md lists every family.
"""

from __future__ import annotations

import contextvars
import os
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from journal import Journal

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Latencies a person notices: from 10 ms to 10 s.
_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.5, 5.0, 10.0)
# A commit is one fsync: from 100 us up.
_COMMIT_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
# Label values taken from free text (an end reason a host chose) are capped, so a scrape stays small.
_MAX_REASONS = 32

_current: contextvars.ContextVar[Metrics | None] = contextvars.ContextVar("curb_metrics", default=None)


def current_metrics() -> Metrics | None:
    """The metrics of the runner this task belongs to; ``None`` outside a runner."""
    return _current.get()


class Follower:
    """One events-stream reader: where it is, for its lag."""

    __slots__ = ("cursor",)

    def __init__(self, cursor: int) -> None:
        self.cursor = cursor


class Metrics:
    """One runner's metrics. Make it, :meth:`use` it in the runner's task, :meth:`watch` its parts."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.calls_started = Counter(
            "curb_calls_started", "Calls started, by transport.", ["transport"], registry=r
        )
        self.starts_refused = Counter(
            "curb_call_starts_refused", "Call starts refused, by error code.", ["code"], registry=r
        )
        self.calls_ended = Counter(
            "curb_calls_ended",
            "Calls ended, by reason (the part of curb.ended's reason before a colon).",
            ["reason"],
            registry=r,
        )
        self.journal_appends = Counter("curb_journal_appends", "Records appended to the journal.", registry=r)
        self.journal_commit_seconds = Histogram(
            "curb_journal_commit_seconds",
            "Time to write and commit one group of records (one transaction, one fsync).",
            buckets=_COMMIT_BUCKETS,
            registry=r,
        )
        self.host_messages = Counter(
            "curb_host_messages",
            "Host messages, by outcome: delivered, held (call starting), repeated, or the refusal code.",
            ["outcome"],
            registry=r,
        )
        self.turns = Counter(
            "curb_turns", "Agent turns, by outcome: completed, interrupted, failed.", ["outcome"], registry=r
        )
        self.turn_first_audio_seconds = Histogram(
            "curb_turn_first_audio_seconds",
            "From the end of the person's turn (end of speech, or text received) to the agent's first audio.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.model_first_token_seconds = Histogram(
            "curb_model_first_token_seconds",
            "From a model request to its first text, by provider.",
            ["provider"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.tts_first_byte_seconds = Histogram(
            "curb_tts_first_byte_seconds",
            "From a sentence sent to speech synthesis to its first audio, by provider.",
            ["provider"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.provider_errors = Counter(
            "curb_provider_errors", "Provider errors, by provider and code.", ["provider", "code"], registry=r
        )
        self.stt_decodes = Counter(
            "curb_stt_decodes",
            "Passes of an embedded recognizer's model over audio, by provider.",
            ["provider"],
            registry=r,
        )
        self._reasons: set[str] = set()
        # Labelled children, looked up once: ``labels()`` costs more than the observation.
        self._children: dict[tuple[str, str], Any] = {}
        self._state = _StateCollector()
        r.register(self._state)

    def use(self) -> contextvars.Token[Metrics | None]:
        """Make these the current task's metrics (and those of the tasks it starts from now on)."""
        return _current.set(self)

    def watch(
        self,
        *,
        journal: Journal | None = None,
        calls: Callable[[], Iterable[tuple[str, str]]] | None = None,
        agent_sockets: Callable[[], int] | None = None,
    ) -> None:
        """Read these when scraped: the journal, the calls (``(state, mode)`` each), open agent sockets."""
        if journal is not None:
            self._state.journal = journal
            journal.on_commit = self.committed
        if calls is not None:
            self._state.calls = calls
        if agent_sockets is not None:
            self._state.agent_sockets = agent_sockets

    async def render(self) -> bytes:
        """The text exposition of every metric, as of now."""
        await self._state.refresh()
        return generate_latest(self.registry)

    # -- What happens ----------------------------------------------------------------------

    def committed(self, records: int, seconds: float) -> None:
        """A journal commit (called by the journal once per transaction, not per record)."""
        self.journal_appends.inc(records)
        self.journal_commit_seconds.observe(seconds)

    def call_ended(self, reason: str) -> None:
        label = reason.split(":", 1)[0].strip() or "unknown"
        if label not in self._reasons:
            if len(self._reasons) >= _MAX_REASONS:
                label = "other"
            else:
                self._reasons.add(label)
        self.calls_ended.labels(label).inc()

    def _child(self, family: Any, name: str, value: str) -> Any:
        child = self._children.get((name, value))
        if child is None:
            child = self._children[(name, value)] = family.labels(value)
        return child

    def first_output(self, kind: str, provider: str, seconds: float) -> None:
        """A provider request's first output: ``llm`` (text) or ``tts`` (audio)."""
        if kind == "llm":
            self._child(self.model_first_token_seconds, kind, provider).observe(seconds)
        elif kind == "tts":
            self._child(self.tts_first_byte_seconds, kind, provider).observe(seconds)

    def turn_finished(self, *, error: bool, interrupted: bool, first_audio_s: float | None) -> None:
        outcome = "failed" if error else "interrupted" if interrupted else "completed"
        self._child(self.turns, "turn", outcome).inc()
        if first_audio_s is not None:
            self.turn_first_audio_seconds.observe(first_audio_s)

    def provider_error(self, provider: str, code: str) -> None:
        self.provider_errors.labels(provider, code).inc()

    def decoded(self, provider: str) -> None:
        """An embedded recognizer ran its model over audio (Whisper: once per decode)."""
        self._child(self.stt_decodes, "stt_decodes", provider).inc()


class _StateCollector(Collector):
    """Gauges read at scrape time from the runner's own state."""

    def __init__(self) -> None:
        self.journal: Journal | None = None
        self.calls: Callable[[], Iterable[tuple[str, str]]] | None = None
        self.agent_sockets: Callable[[], int] | None = None
        self.followers: set[Follower] = set()
        self._oldest: int | None = None

    async def refresh(self) -> None:
        # The one value that needs SQL, read before the synchronous collect.
        if self.journal is not None:
            window = await self.journal.window()
            self._oldest = window.oldest

    def collect(self) -> Iterable[Any]:
        if self.calls is not None:
            calls = GaugeMetricFamily(
                "curb_calls", "Calls held now, by state and mode.", labels=["state", "mode"]
            )
            counts: dict[tuple[str, str], int] = {}
            for key in self.calls():
                counts[key] = counts.get(key, 0) + 1
            for (state, mode), count in sorted(counts.items()):
                calls.add_metric([state, mode], count)
            yield calls
        journal = self.journal
        if journal is not None:
            head = journal.head
            yield GaugeMetricFamily(
                "curb_journal_head_envelope", "The envelope of the newest committed record.", value=head
            )
            yield GaugeMetricFamily(
                "curb_journal_oldest_envelope",
                "The oldest retained envelope (0 when the journal holds none).",
                value=self._oldest or 0,
            )
            try:
                wal = os.stat(f"{journal.path}-wal").st_size
            except FileNotFoundError:
                wal = 0
            yield GaugeMetricFamily(
                "curb_journal_wal_bytes", "Size of the journal's write-ahead log.", value=wal
            )
            lags = [max(0, head - f.cursor) for f in self.followers]
            yield GaugeMetricFamily(
                "curb_stream_followers", "Events-stream readers connected now.", value=len(lags)
            )
            yield GaugeMetricFamily(
                "curb_stream_max_lag_records",
                "Records the furthest-behind events-stream reader has yet to receive.",
                value=max(lags, default=0),
            )
        if self.agent_sockets is not None:
            yield GaugeMetricFamily(
                "curb_agent_sockets_open", "Agent WebSockets open now.", value=self.agent_sockets()
            )


def follow(cursor: int) -> Follower | None:
    """Count an events-stream reader until :func:`unfollow`; ``None`` outside a runner."""
    metrics = _current.get()
    if metrics is None:
        return None
    follower = Follower(cursor)
    metrics._state.followers.add(follower)
    return follower


def unfollow(follower: Follower | None) -> None:
    metrics = _current.get()
    if metrics is not None and follower is not None:
        metrics._state.followers.discard(follower)
