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
    who = f"{record.producer}#{record.seq:<4}"
    return f"#{record.envelope:<6} {at.replace('+00:00', 'Z')}  {who} {record.cls:<12} {summarize(record)}"


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


def _compact(value: Any, limit: int = 100) -> str:
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _call_lines(record: Record) -> list[tuple[str, str]]:
    """What one record of a call says, as ``(who or what, text)`` lines of its timeline."""
    body: Mapping[str, Any] = record.body
    kind = body.get("type")
    if kind == "turn":
        if body.get("role") == "user":
            return [("caller", f"{'(spoken) ' if body.get('spoken') else ''}{body.get('text', '')}")]
        lines = []
        for call in body.get("toolCalls") or []:
            arguments = ", ".join(f"{k}={_compact(v, 40)}" for k, v in (call.get("arguments") or {}).items())
            ended = (
                f"-> {_compact(call.get('result'))} (ok, {call.get('ms')} ms)"
                if call.get("ok")
                else f"-> error: {call.get('error')} ({call.get('ms')} ms)"
            )
            lines.append(("tool", f"{call.get('name')}({arguments}) {ended}"))
        text = str(body.get("text", ""))
        if body.get("interrupted"):
            text += f"{' ' if text else ''}[interrupted: {body.get('reason') or 'no reason given'}]"
        lines.append(("agent", text))
        return lines
    if kind == "host":
        ask = " (asks; waits for a reply)" if body.get("expectsReply") else ""
        return [
            ("agent->host", f"{body.get('name')} id={body.get('id')} {_compact(body.get('payload'))}{ask}")
        ]
    if kind != "event":
        return [(record.cls, _compact(dict(body), 140))]
    name, payload = body.get("name"), body.get("payload") or {}
    if name == "curb.started":
        detail = f"{payload.get('transport')}, {payload.get('direction')}"
        if payload.get("experiments"):
            detail += f", experiments {_compact(payload['experiments'])}"
        return [("started", detail)]
    if name == "curb.ended":
        return [("ended", str(payload.get("reason")))]
    if name == "curb.message":
        sender, outcome = payload.get("from"), payload.get("outcome")
        said = f"{payload.get('key')} id={payload.get('id')} {_compact(payload.get('payload'))}: {outcome}"
        if outcome == "delivered" and payload.get("reply") is not None:
            said += f", reply {_compact(payload.get('reply'))}"
        if payload.get("error"):
            said += f" ({payload['error']})"
        return [(f"{sender}->agent", said)]
    if name == "curb.toClient":
        return [("agent->client", f"{payload.get('key')} {_compact(payload.get('payload'))}")]
    if name == "curb.settings":
        said = f"{payload.get('origin')}: {_compact(payload.get('update'))} {payload.get('outcome')}"
        return [("settings", said)]
    if name == "curb.messages":
        missed = {k: v for k, v in payload.items() if v}
        return [("undelivered", _compact(missed) if missed else "nothing")]
    return [(str(name), _compact(payload))]


def call_timeline(
    path: str, session_id: str, *, as_json: bool = False, out: TextIO = sys.stdout, err: TextIO = sys.stderr
) -> int:
    """``runner replay --call ID``: one call as a readable timeline, offsets from its start.

    Who said what, tool calls with their results, messages both ways, settings changes,
    errors and how it ended. ``--json`` prints the call's lines exactly as the stream has them.
    """
    try:
        journal = JournalFile(path)
    except FileNotFoundError as exc:
        print(f"runner replay: {exc}", file=err)
        return 2
    try:
        records: list[Record] = []
        lines: list[tuple[int, str]] = []
        cursor = 0
        while True:
            if as_json:
                batch_lines = journal.read_lines(cursor, 1024, producer=session_id)
                if not batch_lines:
                    break
                lines += batch_lines
                cursor = batch_lines[-1][0]
            else:
                batch = journal.read(cursor, 1024, producer=session_id)
                if not batch:
                    break
                records += batch
                cursor = batch[-1].envelope
    finally:
        journal.close()
    if not records and not lines:
        print(f"runner replay: no records of call {session_id!r} in {path} (never here, or pruned)", file=err)
        return 1
    if as_json:
        for _, line in lines:
            print(line, file=out)
        return 0
    began = records[0].at
    at = (
        datetime.fromtimestamp(began / 1000, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    )
    print(f"call {session_id}, first record at {at}", file=out)
    for record in records:
        offset = f"+{(record.at - began) / 1000:.3f}s"
        for who, text in _call_lines(record):
            print(f"{offset:>10}  {who:<13} {text}", file=out)
    if records[-1].body.get("name") != "curb.ended":
        print(f"{'':>10}  (the call has not ended, or its end was not written yet)", file=out)
    return 0
