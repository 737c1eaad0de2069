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
        }
        for field, name in env.items():
            if environ.get(name):
                values[field] = environ[name]
        values.update({k: v for k, v in overrides.items() if v is not None})
        for field in (
            "retention_records",
            "max_sessions",
            "configuration_version",
            "heartbeat_ms",
            "agent_idle_seconds",
            "agent_token_turns_per_minute",
            "agent_token_connections",
        ):
            if field in values:
                values[field] = int(str(values[field]))
        if "credit_pool" in values:
            values["credit_pool"] = float(str(values["credit_pool"]))
        if "journal_path" in values:
            values["journal_path"] = Path(str(values["journal_path"]))
        config = cls(**values)  # type: ignore[arg-type]
        parse_address(config.address)
        parse_address(config.public_address)
        if config.retention_records < 1 or config.max_sessions < 1:
            raise ValueError("retention and max sessions must be at least 1")
        if config.agent_idle_seconds < 1:
            raise ValueError("agent idle seconds must be at least 1")
        if config.credit_pool is not None and config.credit_pool < 0:
            raise ValueError("the credit pool must not be negative")
        for limit in (config.agent_token_turns_per_minute, config.agent_token_connections):
            if limit is not None and limit < 1:
                raise ValueError("per-token limits must be at least 1")
        if config.configuration_version is not None and config.configuration_version < 1:
            raise ValueError("configuration version must be a positive integer")
        return config
