"""The runner's configuration: one attrs class of typed defaults, units in the names."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

import attrs

Mode = Literal["managed", "direct-join", "dev", "worker"]

DEFAULT_ADDRESS = "127.0.0.1:7071"
DEFAULT_PUBLIC_ADDRESS = "127.0.0.1:7080"

#: Every ``CURB_*`` variable the runner reads, with what it sets: ``runner --help`` prints this
#: table and docs/configuration.md repeats it (a test keeps the two and the code in step).
ENVIRONMENT: dict[str, str] = {
    "CURB_ADDRESS": f"management listener HOST:PORT (--address; default {DEFAULT_ADDRESS})",
    "CURB_PUBLIC_ADDRESS": f"public listener HOST:PORT (--public-address; default {DEFAULT_PUBLIC_ADDRESS})",
    "CURB_JOURNAL": "the journal file (--journal; default ./runner-journal.db)",
    "CURB_RETENTION": "records the journal keeps (--retention; default 4096)",
    "CURB_MAX_SESSIONS": "calls held at once (--max-sessions; default 1)",
    "CURB_DEPLOYMENT_ID": "refuse calls for another deployment (--deployment-id)",
    "CURB_CONFIGURATION_VERSION": "refuse calls for another configuration (--configuration-version)",
    "CURB_HEARTBEAT_MS": "ping interval of an idle events stream (--heartbeat-ms; default 15000)",
    "CURB_AGENT_IDLE_SECONDS": "an idle agent socket is closed (--agent-idle-seconds; default 300)",
    "CURB_CREDIT_POOL": "the runner's own credits for agent sockets (--credit-pool)",
    "CURB_AGENT_TOKEN_TURNS_PER_MINUTE": "turns one token may take a minute (--agent-token-turns-per-minute)",
    "CURB_AGENT_TOKEN_CONNECTIONS": "open sockets one token may hold (--agent-token-connections)",
    "CURB_METRICS_ADDRESS": "also serve /metrics, without auth, on HOST:PORT (--metrics-address)",
    "CURB_ALLOW_HOSTS": "more Host names the public listener answers, comma-separated (--allow-host)",
    "CURB_ALLOW_ORIGINS": "more page origins the public listener answers, comma-separated (--allow-origin)",
    "CURB_MANAGEMENT_TOKEN": "the management bearer token (default: one made and kept beside the journal)",
    "CURB_API_KEY": "the key agent-socket tokens are checked against (default: none)",
    "CURB_LOG_LEVEL": "debug, info, warning or error (--log-level; default info)",
    "CURB_LOG_FORMAT": "text or json (--log-format; default text)",
}


def parse_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` (or ``[::1]:PORT``) as a host and a port; raises ValueError."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"expected HOST:PORT, got {address!r}")
    return host.strip("[]"), int(port)


@attrs.frozen(kw_only=True)
class Config:
    """Everything a runner is started with. Secrets come from the environment only."""

    mode: Mode = "managed"
    address: str = DEFAULT_ADDRESS
    public_address: str = DEFAULT_PUBLIC_ADDRESS
    journal_path: Path = Path("runner-journal.db")
    retention_records: int = 4096
    max_sessions: int = 1
    deployment_id: str | None = None
    configuration_version: int | None = None
    heartbeat_ms: int = 15_000
    token_file: Path | None = None
    drain_grace_ms: int = 60_000
    agent_idle_seconds: int = 300
    credit_pool: float | None = None
    agent_token_turns_per_minute: int | None = None
    agent_token_connections: int | None = None
    keep_journal: bool = True  # a worker started with --no-journal keeps none
    metrics_address: str | None = None
    agent_max_unsent_bytes: int = 8 << 20
    http_keep_alive_s: float = 5.0
    http_body_timeout_s: float = 30.0
    http_send_timeout_s: float = 30.0
    http_max_connections: int = 1024
    allow_hosts: tuple[str, ...] = ()
    allow_origins: tuple[str, ...] = ()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ, **overrides: object) -> Config:
        """Defaults, then ``CURB_*`` environment variables, then explicit ``overrides``."""
        values: dict[str, object] = {}
        env = {
            "address": "CURB_ADDRESS",
            "public_address": "CURB_PUBLIC_ADDRESS",
            "journal_path": "CURB_JOURNAL",
            "retention_records": "CURB_RETENTION",
            "max_sessions": "CURB_MAX_SESSIONS",
            "deployment_id": "CURB_DEPLOYMENT_ID",
            "configuration_version": "CURB_CONFIGURATION_VERSION",
            "heartbeat_ms": "CURB_HEARTBEAT_MS",
            "agent_idle_seconds": "CURB_AGENT_IDLE_SECONDS",
            "credit_pool": "CURB_CREDIT_POOL",
            "agent_token_turns_per_minute": "CURB_AGENT_TOKEN_TURNS_PER_MINUTE",
            "agent_token_connections": "CURB_AGENT_TOKEN_CONNECTIONS",
            "metrics_address": "CURB_METRICS_ADDRESS",
            "allow_hosts": "CURB_ALLOW_HOSTS",
            "allow_origins": "CURB_ALLOW_ORIGINS",
        }
        # Where each value came from, so a bad one is reported by the name the user gave it.
        source: dict[str, str] = {}
        for field, name in env.items():
            if environ.get(name):
                values[field] = environ[name]
                source[field] = name
        for field, value in overrides.items():
            if value is not None:
                values[field] = value
                source[field] = _FLAGS.get(field, "--" + field.replace("_", "-"))
        for field in RANGES:
            if field in values:
                kind, what = (float, "a number") if field in _FLOATS else (int, "an integer")
                values[field] = _convert(kind, values[field], source[field], what)
        for field in ("allow_hosts", "allow_origins"):
            if field in values:
                values[field] = _names(values[field])
        if "journal_path" in values:
            values["journal_path"] = Path(str(values["journal_path"]))
        config = cls(**values)  # type: ignore[arg-type]  # values were converted field by field above; the dict cannot say so to mypy
        for field in ("address", "public_address", "metrics_address"):
            address = getattr(config, field)
            if address is not None:
                try:
                    parse_address(address)
                except ValueError as exc:
                    raise ValueError(f"{source.get(field, field)}: {exc}") from None

        for field, (low, high) in RANGES.items():
            value = getattr(config, field)
            if value is None:
                continue
            # NaN fails both comparisons, so it is refused too.
            if not (low <= value <= high):
                name = source.get(field, field)
                raise ValueError(f"{name} must be from {_show(low)} to {_show(high)}, got {value!r}")
        return config


#: Each numeric setting's accepted range, inclusive, checked at start (docs/configuration.md).
#: The bounds keep every value usable where it goes: a SQLite integer, a timer that is neither
#: a busy loop nor forever, a count the machine can hold.
RANGES: dict[str, tuple[int | float, int | float]] = {
    "retention_records": (1, 1_000_000_000),
    "max_sessions": (1, 10_000),
    "configuration_version": (1, 2**53 - 1),
    "heartbeat_ms": (100, 3_600_000),
    "drain_grace_ms": (0, 86_400_000),
    "agent_idle_seconds": (1, 86_400),
    "credit_pool": (0, 1e12),
    "agent_token_turns_per_minute": (1, 1_000_000),
    "agent_token_connections": (1, 100_000),
    "agent_max_unsent_bytes": (1, 1 << 30),
    "http_keep_alive_s": (0.001, 86_400),
    "http_body_timeout_s": (0.001, 86_400),
    "http_send_timeout_s": (0.001, 86_400),
    "http_max_connections": (1, 100_000),
}

_FLOATS = {"credit_pool", "http_keep_alive_s", "http_body_timeout_s", "http_send_timeout_s"}

_FLAGS = {"journal_path": "--journal", "retention_records": "--retention"}


def _names(value: object) -> tuple[str, ...]:
    """A comma-separated list (a variable) or a list of them (a repeated flag) as its names."""
    given = (
        [value] if isinstance(value, str) else list(value) if isinstance(value, (list, tuple)) else [value]
    )
    parts = [part.strip() for item in given for part in str(item).split(",")]
    return tuple(part for part in parts if part)


def _convert(kind: type[int] | type[float], value: object, name: str, what: str) -> int | float:
    try:
        return kind(str(value))
    except ValueError:
        raise ValueError(f"{name} must be {what}, got {str(value)!r}") from None


def _show(bound: int | float) -> str:
    return f"{int(bound):,}" if float(bound).is_integer() else f"{bound:g}"
