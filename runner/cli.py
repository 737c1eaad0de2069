"""The ``runner`` command: serve, join, dev, console, replay.

Each command imports what it needs when it runs, so ``runner replay`` starts without
loading agents, speech or transports.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import secrets
import sys
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import trio

from .config import DEFAULT_ADDRESS, DEFAULT_PUBLIC_ADDRESS, ENVIRONMENT, Config
from .logs import say

if TYPE_CHECKING:
    from .worker import WorkerSetup

_STARTED_AT = time.monotonic()

log = logging.getLogger("runner")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    from .wire import PROTOCOL_VERSION

    try:
        package = version("curb-runner")
    except PackageNotFoundError:  # pragma: no cover - run from a tree that was never installed
        package = "unknown"
    return f"runner {package} (host protocol {PROTOCOL_VERSION}, agent WebSocket ino.v2)"


def _add_logging(parser: argparse.ArgumentParser, default_level: str = "info") -> None:
    from .logs import FORMATS, LEVELS

    parser.add_argument(
        "--log-level",
        choices=LEVELS,
        type=str.lower,
        help=f"the least severe log lines written to stderr (default {default_level}; CURB_LOG_LEVEL)",
    )
    parser.add_argument(
        "--log-format",
        choices=FORMATS,
        help="text for people, json for a log collector: one object a line (default text; CURB_LOG_FORMAT)",
    )
    parser.set_defaults(default_log_level=default_level)


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "agent", nargs="?", help="the agent: a module or module:attr (default: the built-in example)"
    )
    _add_logging(parser)
    parser.add_argument(
        "--check",
        action="store_true",
        help="warm the agent up (build its providers, look up their keys), then exit",
    )
    parser.add_argument(
        "--metrics-address", help="also serve Prometheus metrics on HOST:PORT at /metrics, without auth"
    )
    parser.add_argument(
        "--address", help=f"management listener HOST:PORT (default {DEFAULT_ADDRESS}; port 0 picks one)"
    )
    parser.add_argument("--journal", help="the journal file (default ./runner-journal.db)")
    parser.add_argument("--retention", help="records the journal keeps (default 4096)")
    parser.add_argument("--heartbeat-ms", help="ping interval of an idle events stream (default 15000)")
    parser.add_argument("--drain-grace-ms", help="how long a drain lets calls run before it stops them")
    parser.add_argument(
        "--public-address",
        help=f"public listener HOST:PORT for the agent WebSocket (default {DEFAULT_PUBLIC_ADDRESS}; port 0 picks one)",
    )
    parser.add_argument("--agent-idle-seconds", help="an agent socket idle this long is closed (default 300)")
    parser.add_argument("--credit-pool", help="the runner's own credits for agent sockets (default: no pool)")
    parser.add_argument(
        "--agent-token-turns-per-minute",
        help="turns one token may take a minute (default: no limit)",
    )
    parser.add_argument(
        "--agent-token-connections", help="open sockets one token may hold (default: no limit)"
    )
    parser.add_argument(
        "--agent-max-unsent-bytes",
        help="an agent socket this far behind in reading is closed with 4006 (default 8388608)",
    )
    parser.add_argument(
        "--http-keep-alive-s",
        help="an idle connection, or one whose request head is incomplete, closes after this (default 5)",
    )
    parser.add_argument("--http-body-timeout-s", help="a request's body must arrive within this (default 30)")
    parser.add_argument(
        "--http-send-timeout-s",
        help="a client that reads nothing for this long is disconnected (default 30)",
    )
    parser.add_argument(
        "--http-max-connections", help="connections each listener holds at once (default 1024)"
    )
    parser.add_argument(
        "--allow-host",
        action="append",
        metavar="NAME",
        help="also answer a Host of this name on the public listener (repeat, or comma-separate; * for any)",
    )
    parser.add_argument(
        "--allow-origin",
        action="append",
        metavar="ORIGIN",
        help="also answer pages of this origin, scheme://host[:port], on the public listener (* for any)",
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="runner",
        description="A self-hosted runner for real-time voice agents.",
        epilog="environment (a flag wins over its variable):\n"
        + "\n".join(f"  {name:<34} {what}" for name, what in ENVIRONMENT.items()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="a managed runner: a host places calls over the management API")
    _add_common(serve)
    serve.add_argument("--max-sessions", help="calls held at once (default 1)")
    serve.add_argument("--deployment-id", help="refuse calls for another deployment")
    serve.add_argument("--configuration-version", help="refuse calls for another configuration")

    join = sub.add_parser("join", help="a direct-join runner: handed its one call at start")
    _add_common(join)
    join.add_argument("--url", required=True, help="the realtime URL of the call")
    join.add_argument("--token", required=True, help="the realtime token of the call")
    join.add_argument("--session-id", help="the call's session id (default: a random one)")

    start = sub.add_parser(
        "start", help="a worker: LiveKit's agent dispatch hands it calls (key and secret from LIVEKIT_API_*)"
    )
    _add_common(start)
    start.add_argument("--url", help="the LiveKit server (default $LIVEKIT_URL)")
    start.add_argument(
        "--agent-name", default="", help="take explicit dispatches for this name (default: automatic)"
    )
    start.add_argument("--max-sessions", help="calls held at once (default 1)")
    start.add_argument(
        "--no-journal", action="store_true", help="keep no journal: the events stream answers 404 no_journal"
    )

    dev = sub.add_parser(
        "dev", help="talk to the agent in the terminal and in the browser; reloads when its file is saved"
    )
    _add_common(dev)
    dev.add_argument("--max-sessions", help="calls held at once (default 4)")

    console = sub.add_parser("console", help="talk to an agent in the terminal (no transport, no server)")
    console.add_argument(
        "agent", nargs="?", help="the agent: a module or module:attr (default: the built-in example)"
    )
    console.add_argument("--text", action="store_true", help="text only: print replies, speak nothing")
    console.add_argument("--wav", help="also write the replies' speech to this WAV file")
    # The console's terminal is the conversation: only errors interrupt it unless asked.
    _add_logging(console, default_level="error")

    knowledge = sub.add_parser("knowledge", help="an agent's knowledge entries, for the agent WebSocket")
    knowledge_sub = knowledge.add_subparsers(dest="knowledge_command", required=True)
    load = knowledge_sub.add_parser(
        "load", help="add entries from a JSON Lines file: {title, text, entry_id?} a line"
    )
    load.add_argument("agent", help="the agent: a module or module:attr")
    load.add_argument("file", help="the JSON Lines file")
    load.add_argument(
        "--journal",
        default="runner-journal.db",
        help="the runner's journal file (default ./runner-journal.db)",
    )
    _add_logging(load, default_level="warning")

    replay = sub.add_parser("replay", help="print a journal's records, live or after the fact")
    replay.add_argument(
        "--from", dest="from_", type=int, default=0, help="exclusive cursor (default 0: all retained)"
    )
    replay.add_argument("--journal", default="runner-journal.db")
    replay.add_argument("--producer")
    replay.add_argument("--class", dest="cls")
    replay.add_argument("--follow", action="store_true", help="keep printing new records")
    replay.add_argument("--json", action="store_true", help="lines identical to the events stream's")
    replay.add_argument(
        "--call", metavar="ID", help="one call as a readable timeline, offsets from its start"
    )
    _add_logging(replay, default_level="warning")
    return parser


# A dev runner holds the terminal's call and the playground's, with room for a reload's overlap.
DEV_MAX_SESSIONS = 4


def _max_sessions(args: argparse.Namespace, mode: str) -> int | str | None:
    given: str | None = getattr(args, "max_sessions", None)
    if mode == "dev" and given is None and not os.environ.get("CURB_MAX_SESSIONS"):
        return DEV_MAX_SESSIONS
    return given


def _config(args: argparse.Namespace, mode: str) -> Config:
    return Config.from_env(
        mode=mode,
        address=args.address,
        journal_path=args.journal,
        retention_records=args.retention,
        heartbeat_ms=args.heartbeat_ms,
        drain_grace_ms=args.drain_grace_ms,
        public_address=args.public_address,
        agent_idle_seconds=args.agent_idle_seconds,
        credit_pool=args.credit_pool,
        agent_token_turns_per_minute=args.agent_token_turns_per_minute,
        agent_token_connections=args.agent_token_connections,
        agent_max_unsent_bytes=args.agent_max_unsent_bytes,
        http_keep_alive_s=args.http_keep_alive_s,
        http_body_timeout_s=args.http_body_timeout_s,
        http_send_timeout_s=args.http_send_timeout_s,
        http_max_connections=args.http_max_connections,
        max_sessions=_max_sessions(args, mode),
        deployment_id=getattr(args, "deployment_id", None),
        configuration_version=getattr(args, "configuration_version", None),
        keep_journal=False if getattr(args, "no_journal", False) else None,
        metrics_address=args.metrics_address,
        allow_hosts=args.allow_host,
        allow_origins=args.allow_origin,
    )


def _serve(args: argparse.Namespace) -> int:
    mode = {"serve": "managed", "join": "direct-join", "dev": "dev", "start": "worker"}[args.command]
    worker = None
    if mode == "worker" and args.address is None and not os.environ.get("CURB_ADDRESS"):
        # Many workers share a machine: each takes a free loopback port unless told one.
        args.address = "127.0.0.1:0"
    try:
        config = _config(args, mode)
        if mode == "worker":
            worker = _worker_setup(args)
    except ValueError as exc:
        say(str(exc), level=logging.ERROR)
        return 2
    # The runner's stack is imported only once the configuration holds (a second and more).
    from .agent import choose_experiments, conversation_factory, load_agent
    from .runtime import API_KEY_ENV, freeze_startup_heap, resolve_token, serve_runner
    from .telemetry import configure_tracing_from_env
    from .transports.livekit import LiveKitTransport
    from .transports.loopback import LoopbackTransport
    from .transports.websocket import AgentSocketSetup
    from .wire import StartCallRequest

    try:
        exporter = configure_tracing_from_env()
    except ValueError as exc:
        say(str(exc), level=logging.ERROR)
        return 2
    if exporter is not None:
        log.info("tracing: spans go to the %s exporter", exporter)
    agent = load_agent(args.agent)
    if not _warm_up(agent):
        return 1
    if args.check:
        log.info("agent %s is warm and its providers have their keys", agent.name)
        return 0
    token = resolve_token(config)
    loopback = LoopbackTransport()
    join = None
    if args.command == "join":
        join = StartCallRequest(
            session_id=args.session_id or f"join-{secrets.token_hex(6)}",
            realtime_url=args.url,
            realtime_token=args.token,
        )
    dev = None
    factory = conversation_factory(agent, host_connected=config.keep_journal)
    if args.command == "dev":
        from .dev import Dev

        # The dev runner holds its terminal's call itself, and restarts it on a reload.
        dev = Dev(args.agent, agent, loopback, sys.stderr)
        factory = dev.conversation_factory()
    freeze_startup_heap()
    serve = functools.partial(
        serve_runner,
        config,
        token=token,
        transports=[
            loopback,
            LiveKitTransport(
                api_key=os.environ.get("LIVEKIT_API_KEY"), api_secret=os.environ.get("LIVEKIT_API_SECRET")
            ),
        ],
        conversation_factory=factory,
        experiment_chooser=lambda start: choose_experiments(
            dev.agent if dev is not None else agent,
            start.session_id,
            start.client_context or {},
            start.experiments,
        ),
        join=join,
        worker=worker,
        started_at=_STARTED_AT,
        # A direct-join runner is handed its one call; the others also serve the agent WebSocket.
        agent_socket=None
        if mode in ("direct-join", "worker")
        else AgentSocketSetup(
            agent=agent,
            api_key=os.environ.get(API_KEY_ENV) or None,
            idle_seconds=config.agent_idle_seconds,
            credit_pool=config.credit_pool,
            token_turns_per_minute=config.agent_token_turns_per_minute,
            token_connections=config.agent_token_connections,
            max_unsent_bytes=config.agent_max_unsent_bytes,
        ),
    )
    if dev is not None:
        return trio.run(dev.run, serve, sys.stdin).exit_code
    return trio.run(serve).exit_code


def _worker_setup(args: argparse.Namespace) -> WorkerSetup:
    """Where ``runner start`` registers; raises ValueError for what is missing."""
    from .worker import WorkerSetup, agent_url

    url = args.url or os.environ.get("LIVEKIT_URL")
    key, secret = os.environ.get("LIVEKIT_API_KEY"), os.environ.get("LIVEKIT_API_SECRET")
    if not url:
        raise ValueError("runner start needs --url or LIVEKIT_URL")
    if not key or not secret:
        raise ValueError("runner start needs LIVEKIT_API_KEY and LIVEKIT_API_SECRET in the environment")
    agent_url(url)
    return WorkerSetup(url=url, api_key=key, api_secret=secret, agent_name=args.agent_name)


def _load_knowledge(args: argparse.Namespace) -> int:
    """``runner knowledge load AGENT FILE.jsonl``: add (or replace, by entry_id) the agent's entries."""
    import hashlib
    import json

    from journal import open_agent_store

    from .agent import load_agent
    from .platform import agent_id_of

    agent = load_agent(args.agent)
    entries: list[tuple[str, str, str]] = []
    try:
        with open(args.file, encoding="utf-8") as lines:
            for number, line in enumerate(lines, start=1):
                if not line.strip():
                    continue
                entry = json.loads(line)
                if not isinstance(entry, dict) or not all(
                    isinstance(entry.get(k), str) and entry[k].strip() for k in ("title", "text")
                ):
                    raise ValueError(f"line {number}: an entry needs a non-empty title and text")
                entry_id = (
                    entry.get("entry_id") or "kn_" + hashlib.sha256(entry["title"].encode()).hexdigest()[:16]
                )
                if not isinstance(entry_id, str):
                    raise ValueError(f"line {number}: entry_id must be a string")
                entries.append((entry_id, entry["title"].strip(), entry["text"].strip()))
    except (OSError, ValueError) as exc:
        say(str(exc), level=logging.ERROR)
        return 2

    async def load() -> int:
        async with open_agent_store(args.journal) as store:
            return await store.load_knowledge(agent_id_of(agent), entries)

    count = trio.run(load)
    print(f"loaded {count} knowledge entries for {agent.name}")
    return 0


def _configure_logging(args: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> None:
    """Flags first, then CURB_LOG_LEVEL / CURB_LOG_FORMAT; a bad variable is named (ValueError)."""
    from .logs import FORMATS, LEVELS, configure_logging

    log_format = args.log_format or environ.get("CURB_LOG_FORMAT", "").lower() or "text"
    if log_format not in FORMATS:
        raise ValueError(f"CURB_LOG_FORMAT must be one of {', '.join(FORMATS)}, got {log_format!r}")
    level = args.log_level or environ.get("CURB_LOG_LEVEL", "").lower() or args.default_log_level
    # The format holds, so even a bad level is reported in it.
    configure_logging(level if level in LEVELS else args.default_log_level, log_format)
    if level not in LEVELS:
        raise ValueError(f"CURB_LOG_LEVEL must be one of {', '.join(LEVELS)}, got {level!r}")


def _warm_up(agent: Any) -> bool:
    """Build every provider the agent names and look up its key; False (said once) if one fails."""
    from .agent import WarmUpFailed, warm_up

    try:
        trio.run(warm_up, agent)
    except WarmUpFailed as exc:
        # No ready line, a non-zero exit, and one line saying what to fix.
        log.error("warm-up failed: %s", exc)
        return False
    return True


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``runner`` console script."""
    args = _parser().parse_args(argv)
    try:
        _configure_logging(args)
    except ValueError as exc:
        say(str(exc), level=logging.ERROR)
        return 2
    if args.command == "replay":
        from .replay import call_timeline, replay

        if args.call is not None:
            return call_timeline(args.journal, args.call, as_json=args.json)
        return replay(
            args.journal,
            after=args.from_,
            producer=args.producer,
            cls=args.cls,
            follow=args.follow,
            as_json=args.json,
        )
    if args.command == "knowledge":
        return _load_knowledge(args)
    if args.command == "console":
        from pathlib import Path

        from .agent import load_agent
        from .console import run_console

        agent = load_agent(args.agent)
        if not _warm_up(agent):
            return 1
        return trio.run(
            lambda: run_console(agent, text_only=args.text, wav_path=Path(args.wav) if args.wav else None)
        )
    try:
        return _serve(args)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        from .runtime import StartupRefused

        refused = exc
        if isinstance(exc, BaseExceptionGroup):
            found, rest = exc.split(StartupRefused)
            if found is not None and rest is None:
                refused = found.exceptions[0]
        if isinstance(refused, StartupRefused):
            # Refused before anything changed (a taken port, a journal in use or unusable): one line.
            say(str(refused), level=logging.ERROR)
            return 1
        # A warmup failure: no ready line, a non-zero exit, and the cause on stderr.
        log.error("the runner failed: %s", exc, exc_info=exc)
        return 1


if __name__ == "__main__":
    sys.exit(main())
