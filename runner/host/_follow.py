"""Following a runner's events stream so that no record is lost or seen twice.

The stream's resume cursor is the envelope: runner-wide, gapless, exclusive in ``?from=``.
The follower reconnects from the last envelope it yielded, drops anything at or before it,
drops a repeat of a producer's seq, and reports (in order, as items of the iteration) what
it can prove was lost: a producer's seq gap, an envelope hole, a cursor the runner no
longer covers (410).
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Collection
from types import TracebackType
from typing import Any, Literal, Protocol

import anyio
import attrs
import httpx

from ..errors import CursorTooOld
from ..wire import JournalRecord, decode, parse_json
from ._errors import error_from_answer


class _Client(Protocol):
    """What a follower uses of the :class:`~._client.RunnerClient` that made it."""

    http: httpx.AsyncClient


KNOWN_CLASSES = frozenset({"lifecycle", "conversation", "host"})
"""The record classes of host protocol 1.0: a follower yields these unless told others."""

MAX_PRODUCERS = 100_000
"""How many producers' last seqs a cursor keeps (the least recently seen are forgotten)."""

_FIRST_BACKOFF_S = 0.05


@attrs.frozen(kw_only=True)
class EventsCursor:
    """Where a follower stands: save it, and a restarted host resumes losing nothing.

    Save it with ``json.dumps(runner.wire.encode(cursor))`` and restore it with
    ``runner.wire.decode(EventsCursor, json.loads(text))``. It belongs to one runner's journal.

    Attributes:
        envelope: The last envelope yielded (the stream's exclusive ``from``).
        seqs: Each producer's last seq seen, to drop repeats and spot seq gaps; a producer is
            forgotten at its ``curb.ended`` (its id may start again at seq 1 for a new call).
    """

    envelope: int = attrs.field(validator=attrs.validators.ge(0))
    seqs: dict[str, int] = attrs.field(factory=dict)


@attrs.frozen(kw_only=True)
class SeqGap:
    """Records of one producer that never reached the stream: seqs ``after_seq + 1 .. seq - 1``.

    Attributes:
        producer: Whose records.
        after_seq: The last seq seen from it.
        seq: The seq that came next (its record follows this item).
        envelope: That record's envelope.
    """

    producer: str
    after_seq: int
    seq: int
    envelope: int

    @property
    def missing(self) -> int:
        return self.seq - self.after_seq - 1


@attrs.frozen(kw_only=True)
class Lost:
    """Envelopes ``after + 1 .. before - 1`` that this follower will never see.

    Attributes:
        after: The last envelope seen (the cursor that was refused, for a 410).
        before: The first envelope still there (``oldestRetained`` for a 410).
        reason: ``cursor_too_old`` (the runner answered 410 and the follower resynced) or
            ``envelope_gap`` (the stream skipped envelopes it promised are gapless).
    """

    after: int
    before: int
    reason: Literal["cursor_too_old", "envelope_gap"]


FollowItem = JournalRecord | SeqGap | Lost


@attrs.define(kw_only=True)
class FollowStats:
    """What a follower did, for a host's metrics.

    Attributes:
        connects: Streams opened (the first and every reconnect).
        silences: Reconnects because no line came within the silence deadline.
        duplicates: Records dropped as already seen (by envelope or by producer and seq).
        skipped: Records of classes not asked for (by default, classes the protocol does
            not name), by class.
        pings: Heartbeats read.
    """

    connects: int = 0
    silences: int = 0
    duplicates: int = 0
    skipped: dict[str, int] = attrs.field(factory=dict)
    pings: int = 0


class EventFollower:
    """An async iterator over one runner's events stream: records once, in order, across reconnects.

    Made by :meth:`RunnerClient.follow_events`. Use it with ``async with`` (which closes its
    connection) and iterate it; it never ends by itself: a runner that exits or restarts is
    reconnected to with backoff, and a silent stream is dropped and reconnected. Each item is
    a :class:`~runner.wire.JournalRecord`, or a :class:`SeqGap` / :class:`Lost` reported just
    before the record that showed it. :attr:`cursor` after an item includes that item.

    Following "from now" (``from_=None``) has no cursor until the first record: a reconnect
    before it follows from now again.
    """

    def __init__(
        self,
        client: _Client,
        from_: int | EventsCursor | None,
        *,
        on_cursor_too_old: Literal["raise", "resync"],
        silence_timeout_s: float,
        classes: Collection[str] | None,
        max_backoff_s: float,
    ) -> None:
        if on_cursor_too_old not in ("raise", "resync"):
            raise ValueError("on_cursor_too_old must be 'raise' or 'resync'")
        self._client = client
        self._from_now = from_ is None
        if isinstance(from_, EventsCursor):
            self._envelope = from_.envelope
            self._seqs = dict(from_.seqs)
        else:
            if from_ is not None and from_ < 0:
                raise ValueError("from_ must be a non-negative envelope")
            self._envelope = from_ or 0
            self._seqs = {}
        self._on_too_old = on_cursor_too_old
        self._classes = frozenset(classes) if classes is not None else KNOWN_CLASSES
        self._max_backoff_s = max_backoff_s
        self._timeout = httpx.Timeout(10.0, read=silence_timeout_s)
        self._pending: deque[FollowItem] = deque()
        self._response: httpx.Response | None = None
        self._chunks: Any = None
        self._values: deque[Any] = deque()
        self._partial = b""
        self._backoff_s = 0.0
        self._closed = False
        self.stats = FollowStats()

    @property
    def cursor(self) -> EventsCursor:
        """Where to resume: everything up to and including the last item yielded."""
        return EventsCursor(envelope=self._envelope, seqs=dict(self._seqs))

    async def __aenter__(self) -> EventFollower:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection; the follower ends."""
        self._closed = True
        await self._disconnect()

    def __aiter__(self) -> EventFollower:
        return self

    async def __anext__(self) -> FollowItem:
        values = self._values
        while True:
            if self._pending:
                return self._pending.popleft()
            if self._closed:
                raise StopAsyncIteration
            if not values:
                await self._fill()
                continue
            # The hot path of a catch-up: lines already read are handled without a checkpoint
            # each (reading the next chunk is one).
            value = values.popleft()
            if type(value) is not dict or "envelope" not in value:
                self.stats.pings += isinstance(value, dict) and "ping" in value
                continue
            item = self._accept(_record(value))
            if item is not None:
                return item

    def _accept(self, record: JournalRecord) -> FollowItem | None:
        """Advance the cursor past ``record``; what to yield first, or None to drop it."""
        envelope, previous = record.envelope, self._envelope
        if envelope <= previous:
            self.stats.duplicates += 1
            return None
        self._envelope = envelope
        self._from_now = False
        contiguous = previous == 0 or envelope == previous + 1
        producer, seq, seqs = record.producer, record.seq, self._seqs
        # Popped and set again, so the least recently seen producer is first to be forgotten.
        last = seqs.pop(producer, None)
        if last is not None and seq <= last:
            seqs[producer] = last
            self.stats.duplicates += 1
            return None if contiguous else Lost(after=previous, before=envelope, reason="envelope_gap")
        # Past its curb.ended the call is over and its seq forgotten: a later call under the
        # same id may start again at seq 1 (docs/journal.md).
        if record.cls != "conversation" or record.body.get("name") != "curb.ended":
            seqs[producer] = seq
            if len(seqs) > MAX_PRODUCERS:
                del seqs[next(iter(seqs))]
        wanted = record.cls in self._classes
        if not wanted:
            self.stats.skipped[record.cls] = self.stats.skipped.get(record.cls, 0) + 1
        if contiguous and (last is None or seq == last + 1):
            return record if wanted else None
        found: list[FollowItem] = []
        if not contiguous:
            found.append(Lost(after=previous, before=envelope, reason="envelope_gap"))
        if last is not None and seq != last + 1:
            found.append(SeqGap(producer=producer, after_seq=last, seq=seq, envelope=envelope))
        if wanted:
            found.append(record)
        self._pending.extend(found[1:])
        return found[0]

    async def _fill(self) -> None:
        """Read the next chunk of whole lines, (re)connecting as often as it takes.

        Returns early, with no lines, when connecting found something to report first
        (a 410 resync).
        """
        while not self._values:
            if self._chunks is None:
                await self._connect()
                if self._pending:
                    return
            try:
                chunk: bytes = await self._chunks.__anext__()
            except StopAsyncIteration:
                # The runner finished the stream (it ended, or this reader fell out of its
                # window: the reconnect then answers 410). A torn last line is dropped.
                await self._reconnect_later()
                continue
            except httpx.ReadTimeout:
                self.stats.silences += 1
                await self._disconnect()
                continue
            except httpx.TransportError:
                await self._reconnect_later()
                continue
            self._backoff_s = 0.0
            data = self._partial + chunk
            cut = data.rfind(b"\n")
            self._partial = data[cut + 1 :]
            if cut >= 0:
                self._values.extend(_parse_lines(data[:cut]))

    async def _reconnect_later(self) -> None:
        await self._disconnect()
        self._backoff_s = min(self._max_backoff_s, max(_FIRST_BACKOFF_S, self._backoff_s * 2))
        # Full jitter: many hosts that lost one runner do not come back in step.
        await anyio.sleep(random.uniform(self._backoff_s / 2, self._backoff_s))

    async def _disconnect(self) -> None:
        chunks, self._chunks = self._chunks, None
        self._values.clear()
        self._partial = b""
        response, self._response = self._response, None
        with anyio.CancelScope(shield=True):
            if response is not None:
                await response.aclose()
            if chunks is not None:
                await _finish(chunks)

    async def _connect(self) -> None:
        http = self._client.http
        while True:
            params = {} if self._from_now else {"from": str(self._envelope)}
            request = http.build_request("GET", "/v1/runner/events", params=params, timeout=self._timeout)
            try:
                response = await http.send(request, stream=True)
            except httpx.TransportError:
                await self._reconnect_later()
                continue
            self.stats.connects += 1
            if response.status_code == 200:
                self._response = response
                self._chunks = response.aiter_raw()
                return
            try:
                content = await response.aread()
            except httpx.TransportError:
                await self._reconnect_later()
                continue
            finally:
                await response.aclose()
            error = error_from_answer(response.status_code, content)
            if isinstance(error, CursorTooOld):
                if self._on_too_old == "raise":
                    raise error
                # Resume at the window's edge; what lies before it is reported, not skipped.
                self._pending.append(
                    Lost(after=error.requested, before=error.oldest_retained, reason="cursor_too_old")
                )
                self._envelope = max(error.oldest_retained - 1, 0)
                self._seqs.clear()
                continue
            if response.status_code < 500:
                raise error
            await self._reconnect_later()


def _parse_lines(block: bytes) -> list[Any]:
    """The JSON values of a block of whole NDJSON lines.

    Parsed as one JSON array (a raw newline only ever separates lines; inside a string it is
    escaped): one decoder call for a whole chunk instead of one per line. A block that does
    not parse that way (a blank line) is parsed line by line.
    """
    text = block.decode()
    try:
        values: list[Any] = parse_json("[" + text.replace("\n", ",") + "]")
    except ValueError:
        return [parse_json(line) for line in text.split("\n") if line.strip()]
    return values


_new = object.__new__
_set = object.__setattr__


def _record(value: dict[str, Any]) -> JournalRecord:
    """A stream line's record: what ``decode(JournalRecord, value)`` gives, made cheap.

    A follower catching up decodes hundreds of thousands of lines, and building the record
    costs as much as the rest of its work. When every field has its wire type and value
    (the checks of the converter and of the class's validators), the record is built
    directly; anything else goes through the converter, which raises the detailed WireError.
    tests/host/test_follow_unit.py holds this to ``decode`` over the protocol's fixtures.
    """
    try:
        envelope, producer, seq = value["envelope"], value["producer"], value["seq"]
        cls, at, body = value["class"], value["at"], value["body"]
    except KeyError:
        return decode(JournalRecord, value)
    if not (
        type(envelope) is int
        and type(seq) is int
        and type(at) is int
        and type(producer) is str
        and type(cls) is str
        and type(body) is dict
        and envelope >= 1
        and seq >= 1
        and at >= 0
        and producer
        and cls
    ):
        return decode(JournalRecord, value)
    record: JournalRecord = _new(JournalRecord)
    _set(record, "envelope", envelope)
    _set(record, "producer", producer)
    _set(record, "seq", seq)
    _set(record, "cls", cls)
    _set(record, "at", at)
    _set(record, "body", body)
    return record


async def _finish(chunks: Any) -> None:
    """Run a body iterator whose connection was closed to its end.

    httpx reads a body through a chain of async generators; closing the outermost leaves the
    inner ones to the garbage collector (which Trio reports). Reading on after the close ends
    every one of them at once, with an error or the end of the body.
    """
    for _ in range(1000):
        try:
            await chunks.__anext__()
        except (StopAsyncIteration, httpx.HTTPError, RuntimeError):
            return
    await chunks.aclose()
