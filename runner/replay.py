"""``runner replay``: read a journal file directly, while the runner runs or after it stopped."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, TextIO

from journal import JournalFile, Record

_POLL_S = 0.2


def summarize(record: Record) -> str:
    """A short human summary of a record's body."""
    body: Mapping[str, Any] = record.body
    if record.cls == "lifecycle":
        rest = {k: v for k, v in body.items() if k != "event"}
        return f"{body.get('event')} " + " ".join(f"{k}={json.dumps(v)}" for k, v in rest.items())
    kind = body.get("type")
    if kind == "event":
        payload = json.dumps(body.get("payload"), separators=(",", ":"))
        return f"{body.get('name')} {payload[:120]}"
    if kind == "host":
        arrow = "ask" if body.get("expectsReply") else "to host"
        return f"{arrow} {body.get('name')} id={body.get('id')}"
    if kind == "turn":
        line = f"{body.get('role')}: {str(body.get('text', ''))[:120]}"
        if body.get("interrupted"):
            line += f" [interrupted: {body.get('reason') or 'no reason given'}]"
        return line
    return json.dumps(dict(body), separators=(",", ":"))[:140]


def _timeline(record: Record) -> str:
    at = datetime.fromtimestamp(record.at / 1000, tz=UTC).isoformat(timespec="milliseconds")
    return f"#{record.envelope:<6} {at.replace('+00:00', 'Z')}  {record.producer}#{record.seq:<4} {record.cls:<12} {summarize(record)}"


def replay(
    path: str,
    *,
    after: int,
    producer: str | None = None,
    cls: str | None = None,
    follow: bool = False,
    as_json: bool = False,
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
    follow_for_s: float | None = None,
) -> int:
    """Print the records after ``after``; return the process exit code.

    A gap (records pruned before they were read) is said on its own line in the
    timeline, and on stderr with ``--json`` so stdout stays identical to the stream.
    """
    try:
        journal = JournalFile(path)
    except FileNotFoundError as exc:
        print(f"runner replay: {exc}", file=err)
        return 2

    def say_gap(first: int, last: int) -> None:
        note = f"-- envelopes {first}..{last} were pruned (outside the retention window) --"
        print(note, file=err if as_json else out)

    cursor = after
    deadline = None if follow_for_s is None else time.monotonic() + follow_for_s
    try:
        window = journal.window()
        if window.oldest is not None and cursor + 1 < window.oldest:
            say_gap(cursor + 1, window.oldest - 1)
            cursor = window.oldest - 1
        elif window.oldest is None and 0 < cursor < window.head:
            say_gap(cursor + 1, window.head)
        while True:
            # --json prints the lines exactly as the stream renders them.
            if as_json:
                items = journal.read_lines(cursor, 1024, producer=producer, cls=cls)
            else:
                items = [
                    (r.envelope, _timeline(r)) for r in journal.read(cursor, 1024, producer=producer, cls=cls)
                ]
            if not items:
                if not follow or (deadline is not None and time.monotonic() > deadline):
                    return 0
                # Another process writes: poll, outside any read transaction.
                window = journal.window()
                if window.oldest is not None and cursor + 1 < window.oldest:
                    say_gap(cursor + 1, window.oldest - 1)
                    cursor = window.oldest - 1
                time.sleep(_POLL_S)
                continue
            for envelope, text in items:
                if producer is None and cls is None and envelope != cursor + 1 and cursor >= after:
                    say_gap(cursor + 1, envelope - 1)
                print(text, file=out)
                cursor = envelope
            out.flush()
    except KeyboardInterrupt:
        return 0
    finally:
        journal.close()
