"""Logging set-up: every line has its time, level and logger; text for people, JSON for machines.

The runner logs through the standard library (``logging.getLogger("runner...")``), so
third-party loggers (hypercorn, httpx) come out the same way. Text lines use the standard
library's formatter; JSON lines are rendered by structlog's ``ProcessorFormatter`` (loaded
only then: it costs ~0.1 s of start-up, which ``runner replay`` does not pay). A call binds
its session id with :func:`bind_session`: every line its tasks log carries it, as the
``session_id`` field in JSON and as ``[session_id]`` in text.

A logged value can come from outside (a DELETE ``reason``, a realtime URL), so no value may
start a line of its own: text lines escape control characters in the message, logger and
session id (a newline becomes ``\\n``) and indent a traceback's lines, so a line that starts
without a space is always a record; JSON lines get the same from JSON's own string escapes.
In both, a URL's ``user:password@`` is shown as ``***@``.
"""

from __future__ import annotations

import contextvars
import logging
import re
import sys
import time
from collections.abc import MutableMapping
from typing import Any, TextIO

LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("text", "json")

# Loggers that say routine things at INFO: quieter unless the runner logs at DEBUG.
_CHATTY = ("hypercorn.error", "hypercorn.access", "httpx", "httpcore")

# C0, DEL, C1 and the two Unicode line separators: each would end or rewrite a line on a terminal.
_ESCAPES = {
    code: {0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r"}.get(
        code, f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
    )
    for code in (*range(0x20), *range(0x7F, 0xA0), 0x2028, 0x2029)
}

_json_lines = False

_USERINFO = re.compile(r"\b([A-Za-z][A-Za-z0-9+.-]*://)[^/?#\s]*@")

REDACTED_USERINFO = "***"
"""What a URL's ``user:password@`` becomes wherever the runner shows or stores it."""


def redact_userinfo(text: str) -> str:
    """``text`` with the userinfo of every URL in it replaced (``wss://***@host/``).

    A realtime URL may carry a password (``wss://user:secret@host``): the transport joins
    with it, but no record, log line or answer repeats it (docs/host-protocol.md).
    """
    if "@" not in text:
        return text
    return _USERINFO.sub(r"\1" + REDACTED_USERINFO + "@", text)


_session: contextvars.ContextVar[str | None] = contextvars.ContextVar("curb_session_id", default=None)


def bind_session(session_id: str) -> None:
    """Log ``session_id`` on every line of this task and the tasks it starts from now on."""
    _session.set(session_id)


class _SessionFilter(logging.Filter):
    """Puts the current call's session id on the record (``None`` outside a call)."""

    def __init__(self, json: bool) -> None:
        super().__init__()
        self._json = json

    def filter(self, record: logging.LogRecord) -> bool:
        session_id = _session.get()
        if self._json:
            if session_id is not None:
                record.session_id = session_id
        else:
            record.session = f" [{session_id}]" if session_id is not None else ""
        return True


def escape_controls(text: str) -> str:
    """``text`` with every control character written as its escape (``\\n``, ``\\x1b``)."""
    return text.translate(_ESCAPES)


def _shown(text: str) -> str:
    """What a text line shows of a logged value: escaped, and no URL's password."""
    return redact_userinfo(text.translate(_ESCAPES))


def _redact_event(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """structlog processor: no URL's password in a JSON line's message or traceback."""
    for key in ("event", "exception"):
        if isinstance(event.get(key), str):
            event[key] = redact_userinfo(event[key])
    return event


class _TextFormatter(logging.Formatter):
    """The standard formatter, with outside text unable to forge a line (see the module's doc)."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        fields = dict(record.__dict__)
        for name in ("message", "name", "session"):
            if isinstance(fields.get(name), str):
                fields[name] = _shown(fields[name])
        return self._fmt % fields if self._fmt is not None else fields["message"]

    def formatException(self, ei: Any) -> str:
        return _indent(super().formatException(ei))

    def formatStack(self, stack_info: str) -> str:
        return _indent(super().formatStack(stack_info))


def _indent(text: str) -> str:
    return "\n".join("    " + _shown(line) for line in text.splitlines())


def _json_formatter() -> logging.Formatter:
    import structlog

    return structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[
            structlog.stdlib.add_log_level,
            structlog.stdlib.add_logger_name,
            structlog.stdlib.ExtraAdder(allow=("session_id", "address", "url")),
            structlog.processors.TimeStamper(fmt="iso", utc=True),
        ],
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            _redact_event,
            structlog.processors.EventRenamer("message"),
            structlog.processors.JSONRenderer(),
        ],
    )


def configure_logging(level: str = "info", log_format: str = "text", *, stream: TextIO | None = None) -> None:
    """Send every log record to ``stream`` (stderr) as text or JSON lines, from ``level`` up.

    Raises:
        ValueError: An unknown level or format (the message names the accepted ones).
    """
    level = level.lower()
    if level not in LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LEVELS)}, got {level!r}")
    if log_format not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, got {log_format!r}")
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    if log_format == "json":
        handler.setFormatter(_json_formatter())
    else:
        formatter = _TextFormatter(
            "%(asctime)s.%(msecs)03dZ %(levelname)-7s %(name)s%(session)s: %(message)s",
            datefmt="%Y-%m-%dT%H:%M:%S",
        )
        formatter.converter = time.gmtime
        handler.setFormatter(formatter)
    handler.addFilter(_SessionFilter(json=log_format == "json"))
    global _json_lines
    _json_lines = log_format == "json"
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    quiet = logging.DEBUG if level == "debug" else logging.WARNING
    for name in _CHATTY:
        logging.getLogger(name).setLevel(quiet)


def say(message: str, *, level: int = logging.INFO, **fields: str) -> None:
    """One line for the operator on stderr: ``runner: message`` in text (tools read these lines
    by their prefix), a record of the ``runner`` logger at ``level`` with ``fields`` in JSON
    mode, so a log collector gets nothing but JSON objects."""
    if _json_lines:
        logging.getLogger("runner").log(level, "%s", message, extra=fields)
    else:
        print("runner: " + _shown(message), file=sys.stderr, flush=True)
