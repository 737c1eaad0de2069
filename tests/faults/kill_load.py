"""kill -9 at a random moment of a mixed load, a restart on the same journal, and the check of what survived.

One trial: a real ``runner serve`` (the messenger agent) takes calls that start and stop,
host messages (some make the agent send records of its own to the host), agent-socket
conversations with a typed turn each, while followers read the events stream (some follow
across the kill and reconnect by themselves, others are closed at the kill and resumed
later from their saved cursor). At a random moment the runner gets SIGKILL; it is started
again on the same journal and address, and :meth:`KillTrials.check` holds the journal and
every follower to the promise of docs/operations.md: every request answered 2xx has its
record, nothing is duplicated, envelopes and every producer's seq are gapless, each
follower saw each record exactly once, and every call the kill left open was closed with
``curb.ended {"reason":"runner_crashed"}``.

Used by ``tests/faults/test_kill_trials.py`` (a few trials), ``python -m bench.kill``
(hundreds) and ``python -m bench.soak`` (a kill a minute for ten minutes).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio
from trio_websocket import ConnectionClosed, HandshakeError

from runner.host import EventFollower, EventsCursor, JournalRecord, RunnerClient
from runner.wire import encode

from ..host.helpers import free_port
from ..runner_process import TOKEN, RunnerProcess, read_stream, records, start_runner
from ..websocket.ino_client import API_KEY, Addresses, Api, Closed, connect

AGENT = "tests.agents:messenger"
CRASHED = "runner_crashed"


@attrs.define
class Tally:
    """What the trials so far acknowledged, and what broke a promise (each a sentence)."""

    trials: int = 0
    records: int = 0  # records written in the trials (the journal's envelopes)
    acknowledged: int = 0  # 2xx answers, each promising one record
    crashed_calls: int = 0  # calls a kill left open, closed by the restart
    followed: int = 0  # records delivered to followers, all together
    lost: list[str] = attrs.field(factory=list)
    duplicated: list[str] = attrs.field(factory=list)
    broken: list[str] = attrs.field(factory=list)  # gaps, followers, crashed calls not closed

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicated or self.broken)

    def summary(self) -> dict[str, Any]:
        return {
            "trials": self.trials,
            "records": self.records,
            "acknowledged": self.acknowledged,
            "lost": len(self.lost),
            "duplicated": len(self.duplicated),
            "broken": len(self.broken),
            "crashed_calls": self.crashed_calls,
            "followed": self.followed,
            "examples": (self.lost + self.duplicated + self.broken)[:20],
        }


@attrs.define
class _Acks:
    """The 2xx answers of one trial, each naming the record it promised."""

    started: list[str] = attrs.field(factory=list)
    messages: list[tuple[str, str]] = attrs.field(factory=list)  # (session, message id)
    stopped: list[str] = attrs.field(factory=list)

    def count(self) -> int:
        return len(self.started) + len(self.messages) + len(self.stopped)


class _Follower:
    """One follower and every record it yielded; ``resumes`` ones are closed at each kill."""

    def __init__(self, name: str, *, resumes: bool) -> None:
        self.name = name
        self.resumes = resumes
        self.cursor: EventsCursor | int = 0
        self.seen: list[JournalRecord] = []
        self.odd: list[str] = []  # anything but a record: a Lost or a SeqGap
        self._duplicates = 0  # of the followers closed so far
        self._reported = 0
        self._events: EventFollower | None = None
        self._scope: trio.CancelScope | None = None
        self._changed = trio.Event()

    async def run(self, client: RunnerClient, *, task_status: trio.TaskStatus[None]) -> None:
        with trio.CancelScope() as self._scope:
            task_status.started()
            async with client.follow_events(from_=self.cursor, max_backoff_s=0.2) as events:
                self._events = events
                try:
                    async for item in events:
                        if isinstance(item, JournalRecord):
                            self.seen.append(item)
                        else:
                            self.odd.append(repr(item))
                        self._changed.set()
                        self._changed = trio.Event()
                finally:
                    self.cursor = events.cursor
                    self._duplicates += events.stats.duplicates
                    self._events = None

    def sent_twice(self) -> int:
        """Records the runner sent this follower again (at or before its cursor) since last asked."""
        total = self._duplicates + (self._events.stats.duplicates if self._events is not None else 0)
        new, self._reported = total - self._reported, total
        return new

    def stop(self) -> None:
        if self._scope is not None:
            self._scope.cancel()

    async def wait_past(self, envelope: int, timeout: float) -> bool:
        with trio.move_on_after(timeout):
            while not (self.seen and self.seen[-1].envelope >= envelope):
                await self._changed.wait()
            return True
        return False


@attrs.frozen(kw_only=True)
class Load:
    """How much of each kind of traffic a trial makes."""

    hosts: int = 3  # tasks starting, messaging and stopping calls
    calls_per_host: int = 6  # live calls each host task keeps at most
    followers: int = 4  # half follow across the kill, half are resumed from a saved cursor
    sockets: int = 1  # tasks holding agent-socket conversations, a typed turn each
    pause_s: float = 0.005  # between a host task's requests
    slow_starts: float = 0.25  # of the calls started: those that take 300 ms to join (messages are held)


class KillTrials:
    """A runner on one journal and address, killed and restarted trial after trial."""

    def __init__(self, journal: Path, *, seed: int, load: Load = Load(), retention: int = 200_000) -> None:
        self.journal = journal
        self.seed = seed
        self.rng = random.Random(seed)
        self.load = load
        self.port, self.public_port = free_port(), free_port()
        self.retention = retention
        self.tally = Tally()
        self.runner: RunnerProcess | None = None
        self._base = 0  # the last envelope checked
        self._seqs: dict[str, int] = {}
        self._followers = [_Follower(f"follower-{i}", resumes=i % 2 == 1) for i in range(load.followers)]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @asynccontextmanager
    async def _started(self) -> AsyncIterator[RunnerProcess]:
        sessions = self.load.hosts * self.load.calls_per_host + self.load.sockets + 4
        async with start_runner(
            self.journal,
            "--address",
            f"127.0.0.1:{self.port}",
            "--public-address",
            f"127.0.0.1:{self.public_port}",
            "--max-sessions",
            str(sessions),
            "--retention",
            str(self.retention),
            agent=AGENT,
            env={"CURB_API_KEY": API_KEY},
            ready_timeout=120,  # hundreds of restarts meet the machine at its busiest
        ) as runner:
            self.runner = runner
            yield runner

    @asynccontextmanager
    async def open(self) -> AsyncIterator[KillTrials]:
        """Start the runner and the followers; stop both on exit."""
        async with (
            RunnerClient(self.base_url, token=TOKEN) as client,
            trio.open_nursery() as followers,
        ):
            self._client = client
            self._nursery = followers
            stack = self._started()
            await stack.__aenter__()
            try:
                # What the journal held before the first trial is not the trials' to check.
                assert self.runner is not None
                held = records(
                    await read_stream(
                        self.runner, "from=0", until=lambda ls: _has_ready(records(ls)), timeout=30
                    )
                )
                for line in held:
                    self._seqs[line["producer"]] = line["seq"]
                self._base = held[-1]["envelope"]
                for follower in self._followers:
                    follower.cursor = self._base
                    await followers.start(follower.run, client)
                self._stack = stack
                yield self
            finally:
                # The runner first: stopped inside a cancelled scope, its Cancelled would
                # replace (and so hide) whatever ended the trials.
                await self._stack.__aexit__(None, None, None)
                followers.cancel_scope.cancel()

    async def trial(
        self, kill_after_s: float, *, beside: Callable[[RunnerProcess], Awaitable[None]] | None = None
    ) -> None:
        """Load the runner, kill it ``kill_after_s`` in, restart it, and check what survived.

        ``beside(runner)`` runs along with the load (a sampler, say) and must return once the
        runner is gone.
        """
        runner = self.runner
        assert runner is not None
        acks = _Acks()
        number = self.tally.trials
        async with (
            httpx.AsyncClient(
                base_url=self.base_url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10
            ) as http,
            trio.open_nursery() as load,
        ):
            for worker in range(self.load.hosts):
                load.start_soon(
                    self._host, http, acks, f"t{number}h{worker}", random.Random(self.rng.random())
                )
            for _ in range(self.load.sockets):
                load.start_soon(self._socket)
            if beside is not None:
                load.start_soon(beside, runner)
            await trio.sleep(kill_after_s)
            runner.kill()
            for follower in self._followers:
                if follower.resumes:
                    follower.stop()
            await runner.wait_exit(timeout=30)
            # The load ends by itself as its requests fail: a request cancelled while it sends
            # would leave httpx's body iterator to the garbage collector.
            load.cancel_scope.deadline = trio.current_time() + 30
        await self._stack.__aexit__(None, None, None)
        self._stack = self._started()
        await self._stack.__aenter__()
        for follower in self._followers:
            if follower.resumes:
                await self._nursery.start(follower.run, self._client)
        await self.check(acks)

    async def _host(self, http: httpx.AsyncClient, acks: _Acks, prefix: str, rng: random.Random) -> None:
        """Start, message and stop calls at random until cancelled; note every 2xx.

        Some calls take a while to join: they are messaged (so their messages are held) and
        stopped while they start.
        """
        async with trio.open_nursery() as slow_starts:
            await self._host_load(http, acks, prefix, rng, slow_starts)
            slow_starts.cancel_scope.cancel()

    async def _host_load(
        self, http: httpx.AsyncClient, acks: _Acks, prefix: str, rng: random.Random, slow_starts: trio.Nursery
    ) -> None:
        live: list[str] = []
        made = 0

        async def start(session: str, url: str) -> None:
            try:
                answer = await http.post(
                    "/v1/sessions", json={"sessionId": session, "realtimeUrl": url, "realtimeToken": "t"}
                )
            except httpx.TransportError:
                return  # the runner is gone
            if answer.status_code == 202:
                acks.started.append(session)

        while True:
            await trio.sleep(self.load.pause_s)
            roll = rng.random()
            try:
                if not live or (roll < 0.3 and len(live) < self.load.calls_per_host):
                    session = f"{prefix}-{made}"
                    made += 1
                    if rng.random() < self.load.slow_starts:
                        slow_starts.start_soon(start, session, "loopback://x?connect_ms=300")
                        live.append(session)
                        continue
                    answer = await http.post(
                        "/v1/sessions",
                        json={"sessionId": session, "realtimeUrl": "loopback:", "realtimeToken": "t"},
                    )
                    if answer.status_code == 202:
                        acks.started.append(session)
                        live.append(session)
                elif roll < 0.85:
                    session = rng.choice(live)
                    message = f"{session}-m{made}"
                    made += 1
                    # Some make the agent send records of its own to the host.
                    to_host = ["app.note"] if rng.random() < 0.3 else []
                    answer = await http.post(
                        f"/v1/sessions/{session}/messages",
                        json={"id": message, "name": "relay", "payload": {"toHost": to_host, "data": {}}},
                    )
                    if answer.status_code == 202:
                        acks.messages.append((session, message))
                else:
                    session = live.pop(rng.randrange(len(live)))
                    answer = await http.delete(f"/v1/sessions/{session}")
                    # stopped: false is a call not registered yet (a slow start still on its way).
                    if answer.status_code == 200 and answer.json()["stopped"]:
                        acks.stopped.append(session)
            except httpx.TransportError:
                return  # the runner is gone

    async def _socket(self) -> None:
        """Agent-socket conversations, one typed turn each, until cancelled."""
        addresses = Addresses(management=f"127.0.0.1:{self.port}", public=f"127.0.0.1:{self.public_port}")
        api = Api(addresses)
        try:
            while True:
                token, session = await api.person()
                async with connect(addresses, token, session) as sock:
                    await sock.say("When is breakfast?")
        except (httpx.TransportError, ConnectionClosed, HandshakeError, Closed, OSError, trio.TooSlowError):
            return  # the runner is gone

    async def check(self, acks: _Acks) -> None:
        """Hold the restarted runner's journal and the followers to the promises."""
        tally, runner = self.tally, self.runner
        assert runner is not None
        tally.trials += 1
        tally.acknowledged += acks.count()
        where = f"trial {tally.trials} (seed {self.seed})"
        base = self._base
        lines = records(
            await read_stream(runner, f"from={base}", until=lambda ls: _has_ready(records(ls)), timeout=30)
        )
        self._base = lines[-1]["envelope"]
        tally.records += len(lines)
        envelopes = [line["envelope"] for line in lines]
        if envelopes != list(range(base + 1, base + len(lines) + 1)):
            tally.broken.append(f"{where}: envelopes not gapless after {base}: {_runs(envelopes)}")
        counts = Counter(envelopes)
        tally.duplicated += [f"{where}: envelope {e} {n} times" for e, n in counts.items() if n > 1]
        for line in lines:
            producer, seq = line["producer"], line["seq"]
            last = self._seqs.get(producer, 0)
            if seq <= last:
                tally.duplicated.append(f"{where}: {producer} seq {seq} again (after {last})")
            elif seq != last + 1:
                tally.broken.append(f"{where}: {producer} seq {last} then {seq}")
            self._seqs[producer] = max(last, seq)
        self._check_calls(lines, acks, where)
        for follower in self._followers:
            await follower.wait_past(self._base, timeout=30)
        self._check_followers(lines, where)

    def _check_calls(self, lines: list[dict[str, Any]], acks: _Acks, where: str) -> None:
        tally = self.tally
        named: Counter[tuple[str, str]] = Counter()
        ends: dict[str, list[str]] = {}
        # A message taken while its call started has a `held` record, then (unless a kill came
        # first) its outcome: each at most once.
        message_ids: Counter[tuple[str, str]] = Counter()
        last_of: dict[str, str] = {}
        for line in lines:
            body, producer = line["body"], line["producer"]
            last_of[producer] = body.get("name") or body.get("event") or ""
            if body.get("name") in ("curb.started", "curb.ended"):
                named[(producer, body["name"])] += 1
            if body.get("name") == "curb.ended":
                ends.setdefault(producer, []).append(body["payload"]["reason"])
            if body.get("name") == "curb.message" and body["payload"].get("from") == "host":
                held = body["payload"]["outcome"] == "held"
                message_ids[(body["payload"]["id"], "held" if held else "outcome")] += 1
        for session in acks.started:
            if not named[(session, "curb.started")]:
                tally.lost.append(f"{where}: the start of {session} was answered 202 but not journaled")
        for session, message in acks.messages:
            if not (message_ids[(message, "held")] or message_ids[(message, "outcome")]):
                tally.lost.append(
                    f"{where}: message {message} to {session} was answered 202 but not journaled"
                )
        for session in acks.stopped:
            if ends.get(session, [None])[0] != "stopped_by_host":
                tally.lost.append(
                    f"{where}: the stop of {session} was answered 200, its end is {ends.get(session)}"
                )
        tally.duplicated += [f"{where}: {p} has {n} {name}" for (p, name), n in named.items() if n > 1]
        tally.duplicated += [
            f"{where}: message {m} journaled {n} times ({kind})"
            for (m, kind), n in message_ids.items()
            if n > 1
        ]
        recovered = [line["body"] for line in lines if line["body"].get("event") == "recovered"]
        closed = set(recovered[0]["closedSessions"]) if recovered else set()
        crashed = {p for p, reasons in ends.items() if CRASHED in reasons}
        tally.crashed_calls += len(crashed)
        if closed != crashed:
            tally.broken.append(
                f"{where}: recovered {sorted(closed)} but runner_crashed ends {sorted(crashed)}"
            )
        calls = {p for p, _ in named} | {p for p in last_of if p != "runner"}
        for producer in sorted(calls):
            if producer not in ends:
                tally.broken.append(f"{where}: {producer} was left open across the kill")
            elif last_of[producer] != "curb.ended":
                tally.broken.append(f"{where}: {producer} wrote {last_of[producer]} after its curb.ended")

    def _check_followers(self, lines: list[dict[str, Any]], where: str) -> None:
        tally, head = self.tally, lines[-1]["envelope"]
        first = lines[0]["envelope"]
        for follower in self._followers:
            if follower.odd:
                tally.broken.append(f"{where}: {follower.name} reported {follower.odd[:3]}")
                follower.odd.clear()
            twice = follower.sent_twice()
            if twice:
                tally.duplicated.append(f"{where}: {follower.name} was sent {twice} records twice")
            seen = [encode(r) for r in follower.seen if r.envelope >= first]
            follower.seen = [r for r in follower.seen if r.envelope > head]
            tally.followed += len(seen)
            if seen != lines:
                got = [r["envelope"] for r in seen]
                tally.broken.append(
                    f"{where}: {follower.name} saw {_runs(got)} of {first}..{head}"
                    + (" (content differs)" if got == [line["envelope"] for line in lines] else "")
                )


def _has_ready(lines: list[dict[str, Any]]) -> bool:
    return bool(lines) and lines[-1]["body"].get("event") == "ready"


def _runs(envelopes: list[int]) -> str:
    """``1-4, 6, 8-9``: a list of envelopes, short."""
    out: list[str] = []
    for e in envelopes:
        if out and e == int(out[-1].split("-")[-1]) + 1:
            out[-1] = f"{out[-1].split('-')[0]}-{e}"
        else:
            out.append(str(e))
    return ", ".join(out[:12]) + (" ..." if len(out) > 12 else "")


async def run_trials(
    journal: Path,
    *,
    trials: int,
    seed: int,
    load: Load = Load(),
    kill_within_s: tuple[float, float] = (0.3, 1.5),
    on_trial: Callable[[KillTrials], None] = lambda _: None,
) -> Tally:
    """``trials`` kill -9s at random moments of ``load``; what they acknowledged and broke."""
    async with KillTrials(journal, seed=seed, load=load).open() as harness:
        for _ in range(trials):
            await harness.trial(harness.rng.uniform(*kill_within_s))
            on_trial(harness)
        return harness.tally
