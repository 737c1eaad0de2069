"""Logging set-up: every line has its time, level and logger; text for people, JSON for machines.

The runner logs through the standard library (``logging.getLogger("runner...")``), so
third-party loggers (hypercorn, httpx) come out the same way. Text lines use the standard
library's formatter; JSON lines are rendered by structlog's ``ProcessorFormatter`` (loaded
only then: it costs ~0.1 s of start-up, which ``runner replay`` does not pay). A call binds
its session id with :func:`bind_session`: every line its tasks log carries it, as the
``session_id`` field in JSON and as ``[session_id]`` in text.
"""

from __future__ import annotations

import contextvars
import logging
import sys
import time
from typing import TextIO

LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("text", "json")

# Loggers that say routine things at INFO: quieter unless the runner logs at DEBUG.
_CHATTY = ("hypercorn.error", "hypercorn.access", "httpx", "httpcore")

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


def _json_formatter() -> logging.Formatter:
    import structlog

    return structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[
            structlog.stdlib.add_log_level,
            structlog.stdlib.add_logger_name,
            structlog.stdlib.ExtraAdder(allow=("session_id",)),
            structlog.processors.TimeStamper(fmt="iso", utc=True),
        ],
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
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
        formatter = logging.Formatter(
            "%(asctime)s.%(msecs)03dZ %(levelname)-7s %(name)s%(session)s: %(message)s",
            datefmt="%Y-%m-%dT%H:%M:%S",
        )
        formatter.converter = time.gmtime
        handler.setFormatter(formatter)
    handler.addFilter(_SessionFilter(json=log_format == "json"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    quiet = logging.DEBUG if level == "debug" else logging.WARNING
    for name in _CHATTY:
        logging.getLogger(name).setLevel(quiet)
