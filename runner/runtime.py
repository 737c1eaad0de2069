"""One runner process: journal, calls, management listener, signals, lifecycle.

The order is the contract: the journal is open and crashed calls are closed
before anything listens; ``ready`` is printed only once the listener is bound;
``ended`` is written before the listener closes.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import logging
import os
import secrets
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AsyncExitStack
from pathlib import Path

import attrs
import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve as hypercorn_serve

from journal import JournalUnavailable, JournalWriteFailed, open_agent_store, open_journal

from .api import (
    HttpLimits,
    Listening,
    OriginGuard,
    OriginPolicy,
    Playground,
    create_management_app,
    create_metrics_app,
    create_public_app,
    listen,
    serve_http,
)
from .calls import ConversationFactory, Runner, close_open_calls
from .config import Config
from .errors import RunnerError
from .lifecycle import emit_lifecycle
from .logs import say
from .telemetry import Metrics
from .transports import Transport
from .transports.websocket import AgentSocketService, AgentSocketSetup, WebSocketTransport
from .wire import (
    PROTOCOL_VERSION,
    PROTOCOL_VERSIONS,
    Health,
    HealthState,
    LifecycleEnded,
    LifecycleReady,
    LifecycleRecovered,
    LiveKitState,
    StartCallRequest,
)
from .worker import AgentWorker, WorkerRejected, WorkerSetup

log = logging.getLogger("runner")

TOKEN_ENV = "CURB_MANAGEMENT_TOKEN"
API_KEY_ENV = "CURB_API_KEY"
PUBLIC_LINE = "runner: public listener on "
PLAYGROUND_LINE = "runner: playground on "
METRICS_LINE = "runner: metrics listener on "
_SHUTDOWN_GRACE_S = 5.0


def freeze_startup_heap() -> None:
    """Keep what start-up loaded out of the collector's full passes.

    Modules, the agent and its speech models live as long as the process. Frozen
    (``gc.freeze``), they are no longer walked by every full collection, a pause of tens
    of milliseconds otherwise, taken at random on the loop that carries every call's audio
    and every append (``python -m bench.journal`` measures it). Call it once, when warm.
    """
    gc.collect()
    gc.freeze()


class StartupRefused(Exception):
    """The runner cannot start as configured; the message is one line for the operator."""


def _listen(address: str, limits: HttpLimits, *, flag: str, named_by: str) -> Listening:
    """Bind and listen now, before the journal is touched: a taken port changes nothing.

    A taken port is refused with what to do: the flag that moves this listener, and port 0.
    """
    try:
        return listen(
            address, limits, errorlog=logging.getLogger("hypercorn.error"), graceful_s=_SHUTDOWN_GRACE_S
        )
    except OSError as exc:
        said = f"cannot listen on {address}: {exc.strerror or exc}"
        if exc.errno == errno.EADDRINUSE:
            said += (
                f" (another process listens there: stop it, or give this runner another port with"
                f" {flag} HOST:PORT; port 0 takes a free one, which {named_by} names)"
            )
        raise StartupRefused(said) from None


def resolve_token(config: Config, environ: dict[str, str] | os._Environ[str] = os.environ) -> str:
    """The management token: from the environment, else one made for this journal.

    A made token is kept in a file only this user can read, beside the journal,
    so a first run needs no set-up and a restart keeps the same token. The token
    itself is never printed.
    """
    token = environ.get(TOKEN_ENV)
    if token:
        return token
    path = config.token_file or Path(f"{config.journal_path}.token")
    if path.is_symlink():
        # Followed, it would be read from (and chmod'ed at) wherever it points.
        raise StartupRefused(f"the token file {path} is a symbolic link; remove it or set {TOKEN_ENV}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # O_NOFOLLOW: a link put there after the check is refused too.
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "r+", encoding="utf-8") as file:
            os.fchmod(fd, 0o600)
            token = file.read().strip()
            if not token:
                token = secrets.token_urlsafe(32)
                file.seek(0)
                file.truncate()
                file.write(token + "\n")
    except OSError as exc:
        raise StartupRefused(f"the token file {path}: {exc.strerror or exc}") from None
    log.info("%s is not set; the management token is in %s", TOKEN_ENV, path)
    return token


def _hypercorn_config(address: str) -> HypercornConfig:
    config = HypercornConfig()
    config.bind = [address]
    config.accesslog = None
    # Through our logging (stderr), not a second handler of hypercorn's own.
    config.errorlog = logging.getLogger("hypercorn.error")
    config.graceful_timeout = _SHUTDOWN_GRACE_S
    return config


@attrs.frozen(kw_only=True)
class Outcome:
    """How the runner ended: ``exit_code`` for the process."""

    exit_code: int
    reason: str


async def _watch_signals(
    runner: Runner, scope: trio.CancelScope, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    with scope, trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        task_status.started()
        async for signum in signals:
            name = signal.Signals(signum).name
            if runner.draining:
                # A second signal: the operator wants out now.
                say(f"second {name}; exiting at once")
                sys.stdout.flush()
                os._exit(128 + signum)
            if runner.calls:
                # Calls may run on for the drain's grace: say so, and how to leave sooner.
                count = len(runner.calls)
                say(
                    f"{name}: draining; waiting up to {runner.config.drain_grace_ms / 1000:g} s "
                    f"for {count} call{'s' if count != 1 else ''} to end ({name} again exits at once)"
                )
            runner.drain_nowait("SIGTERM" if signum == signal.SIGTERM else "SIGINT")


async def _serve_worker(worker: AgentWorker, *, task_status: trio.TaskStatus[None]) -> None:
    """The worker's service; a server that refuses its credentials ends the runner in one line."""
    try:
        await worker.serve(task_status=task_status)
    except WorkerRejected as exc:
        raise StartupRefused(exc.detail or str(exc)) from None


async def _registered_unless_drained(worker: AgentWorker, runner: Runner) -> bool:
    """Wait until the worker first registered (True) or the runner is asked to drain (False)."""
    registered = False
    async with trio.open_nursery() as nursery:

        async def wait_registered() -> None:
            nonlocal registered
            await worker.wait_registered()
            registered = True
            nursery.cancel_scope.cancel()

        async def wait_draining() -> None:
            await runner.wait_draining()
            nursery.cancel_scope.cancel()

        nursery.start_soon(wait_registered)
        nursery.start_soon(wait_draining)
    return registered


async def serve_runner(
    config: Config,
    *,
    token: str,
    transports: Sequence[Transport],
    conversation_factory: ConversationFactory | None,
    join: StartCallRequest | None = None,
    experiment_chooser: Callable[[StartCallRequest], Mapping[str, str]] | None = None,
    handle_signals: bool = True,
    started_at: float | None = None,
    agent_socket: AgentSocketSetup | None = None,
    worker: WorkerSetup | None = None,
    task_status: trio.TaskStatus[tuple[str, Runner]] = trio.TASK_STATUS_IGNORED,
) -> Outcome:
    """Run one runner until it drained; return how it ended.

    Args:
        config: Addresses, capacity, journal, retention.
        token: The management bearer token.
        transports: How calls reach their callers.
        conversation_factory: The agent's side of each call.
        join: A direct-join runner's one call, started once ready.
        experiment_chooser: Each call's experiment variants, from its start request.
        handle_signals: Drain on SIGTERM/SIGINT (off when embedded in tests).
        started_at: ``time.monotonic()`` when the process started, for ``warmupMs``.
        agent_socket: Serve the agent WebSocket on ``config.public_address`` (its bound
            address is written to stderr as ``runner: public listener on HOST:PORT``
            before the ready line); ``None``: no public listener.
        worker: Take calls from LiveKit's agent dispatch (``runner start``): the worker
            registers while the management listener already answers (``ready`` once it did),
            and a drain tells the server to send no new jobs.
        task_status: Started with the bound address and the runner, once ready.
    """
    started_at = time.monotonic() if started_at is None else started_at
    # The order is the contract: listen, own the journal, recover, then serve. Each step that
    # can be refused (a taken port, a journal in use, damaged or foreign) is refused before
    # the next one changes anything.
    limits = HttpLimits(
        keep_alive_s=config.http_keep_alive_s,
        body_s=config.http_body_timeout_s,
        send_s=config.http_send_timeout_s,
        max_connections=config.http_max_connections,
        shutdown_s=_SHUTDOWN_GRACE_S,
    )
    with contextlib.ExitStack() as listeners:
        management = _listen(config.address, limits, flag="--address", named_by="the ready line")
        listeners.callback(management.close)
        public: Listening | None = None
        if agent_socket is not None:
            public = _listen(
                config.public_address,
                limits,
                flag="--public-address",
                named_by="the line 'runner: public listener on HOST:PORT'",
            )
            listeners.callback(public.close)
        try:
            return await _serve_runner(
                config,
                management,
                public,
                token=token,
                transports=transports,
                conversation_factory=conversation_factory,
                join=join,
                experiment_chooser=experiment_chooser,
                handle_signals=handle_signals,
                started_at=started_at,
                agent_socket=agent_socket,
                worker=worker,
                task_status=task_status,
            )
        except JournalUnavailable as exc:
            raise StartupRefused(str(exc)) from None


def _origin_policy(config: Config, public: Listening) -> OriginPolicy:
    """Which Host and Origin the public listener answers (runner/api/_origins.py)."""
    if config.mode == "dev":
        (sock,) = public.sockets.insecure_sockets
        return OriginPolicy.for_dev(sock.getsockname()[0], config.allow_hosts, config.allow_origins)
    return OriginPolicy.for_public(config.allow_hosts, config.allow_origins)


async def _serve_runner(
    config: Config,
    management: Listening,
    public: Listening | None,
    *,
    token: str,
    transports: Sequence[Transport],
    conversation_factory: ConversationFactory | None,
    join: StartCallRequest | None,
    experiment_chooser: Callable[[StartCallRequest], Mapping[str, str]] | None,
    handle_signals: bool,
    started_at: float,
    agent_socket: AgentSocketSetup | None,
    worker: WorkerSetup | None,
    task_status: trio.TaskStatus[tuple[str, Runner]],
) -> Outcome:
    exit_code = 0
    # Every task of this runner counts into its own registry (see runner.telemetry).
    metrics = Metrics()
    metrics.use()
    async with AsyncExitStack() as stack:
        journal_path = config.journal_path
        if not config.keep_journal:
            # The calls still run through the one journal code path, on a file that lives
            # only as long as the process; nothing reads it, and the events stream says so.
            scratch = stack.enter_context(tempfile.TemporaryDirectory(prefix="curb-worker-"))
            journal_path = Path(scratch) / "journal.db"
        journal = await stack.enter_async_context(
            open_journal(journal_path, retention_records=config.retention_records)
        )
        try:
            closed = await close_open_calls(journal)
            if closed:
                await emit_lifecycle(journal, LifecycleRecovered(closed_sessions=closed))
        except JournalWriteFailed as exc:
            raise StartupRefused(f"journal {journal.path} cannot write: {exc}") from None
        socket_transport = WebSocketTransport() if agent_socket is not None else None
        runner = Runner(
            config,
            journal,
            transports=[*transports, *([socket_transport] if socket_transport else [])],
            conversation_factory=conversation_factory,
            experiment_chooser=experiment_chooser,
        )
        sockets: AgentSocketService | None = None
        if agent_socket is not None and socket_transport is not None:
            store = await stack.enter_async_context(open_agent_store(journal.path))
            sockets = AgentSocketService(runner, socket_transport, store, agent_socket)
        metrics.watch(
            journal=journal,
            calls=lambda: [(call.state, config.mode) for call in runner.calls.values()],
            agent_sockets=(lambda: len(sockets.connections)) if sockets is not None else None,
        )
        closing = trio.Event()
        shutdown = trio.Event()
        ready = False
        # Made before the listener: its webhook route belongs to the worker (docs/failover.md).
        agent_worker: AgentWorker | None = AgentWorker(runner, worker) if worker is not None else None

        def health() -> Health:
            # Answered in every state, from the moment the listener serves to its close.
            state: HealthState = "draining" if runner.draining else "ready" if ready else "starting"
            livekit: LiveKitState | None = None
            if agent_worker is not None:
                livekit = "registered" if agent_worker.registered else "connecting"
            return Health(
                ok=True,
                protocol_version=PROTOCOL_VERSION,
                versions=list(PROTOCOL_VERSIONS),
                state=state,
                livekit=livekit,
            )

        app = create_management_app(
            runner,
            journal,
            token=token,
            heartbeat_ms=config.heartbeat_ms,
            closing=closing,
            keeps_journal=config.keep_journal,
            metrics=metrics,
            health=health,
            livekit_webhook=agent_worker.on_webhook if agent_worker is not None else None,
        )
        joined_ok = True

        async def run_joined_call() -> None:
            # A direct-join runner's one call: when it ends, the runner ends.
            nonlocal joined_ok
            assert join is not None
            try:
                call, _ = await runner.start_call(join)
                await call.wait_ended()
            except RunnerError as exc:
                log.error("the joined call did not start: %s", exc.detail)
                joined_ok = False
            runner.drain_nowait("call_ended")

        async with trio.open_nursery() as nursery:
            await nursery.start(runner.serve)
            if agent_worker is not None:
                # Started at once: while the LiveKit server cannot be reached, the worker retries
                # and the runner answers /health (its state says so) and drains on a signal.
                await nursery.start(_serve_worker, agent_worker)
            http_done = trio.Event()

            async def serve(
                app: object, listening: Listening, done: trio.Event, *, task_status: trio.TaskStatus[str]
            ) -> None:
                try:
                    await serve_http(app, listening, shutdown, task_status=task_status)
                finally:
                    done.set()

            address = await nursery.start(serve, app, management, http_done)
            public_done = trio.Event()
            public_done.set()
            if sockets is not None and public is not None:
                public_done = trio.Event()
                await nursery.start(sockets.serve)
                # A dev runner also serves the playground page: the author's own listener.
                playground = (
                    Playground(
                        runner=runner, journal=journal, heartbeat_ms=config.heartbeat_ms, closing=closing
                    )
                    if config.mode == "dev"
                    else None
                )
                public_app = OriginGuard(
                    create_public_app(sockets, playground=playground), _origin_policy(config, public)
                )
                public_address = await nursery.start(serve, public_app, public, public_done)
                say(PUBLIC_LINE.removeprefix("runner: ") + public_address, address=public_address)
                if config.mode == "dev":
                    playground_url = "http://" + public_address + "/"
                    say(PLAYGROUND_LINE.removeprefix("runner: ") + playground_url, url=playground_url)
            signal_scope = trio.CancelScope()
            if handle_signals:
                # Before the ready line: a signal right after it is a drain, never a traceback.
                await nursery.start(_watch_signals, runner, signal_scope)
            metrics_done = trio.Event()
            metrics_done.set()
            if config.metrics_address is not None:
                metrics_done = trio.Event()
                # A name of its own, never None: the closure below reads it later.
                metrics_address: str = config.metrics_address

                async def serve_metrics(*, task_status: trio.TaskStatus[list[str]]) -> None:
                    await hypercorn_serve(
                        create_metrics_app(metrics),
                        _hypercorn_config(metrics_address),
                        shutdown_trigger=shutdown.wait,
                        task_status=task_status,
                    )
                    metrics_done.set()

                metrics_binds = await nursery.start(serve_metrics)
                metrics_at = metrics_binds[0].split("://", 1)[-1]
                say(METRICS_LINE.removeprefix("runner: ") + metrics_at, address=metrics_at)
            # A worker is ready once it is in LiveKit's pool; a drain before that skips `ready`.
            if agent_worker is None or await _registered_unless_drained(agent_worker, runner):
                warmup_ms = int((time.monotonic() - started_at) * 1000)
                try:
                    await emit_lifecycle(
                        journal,
                        LifecycleReady(
                            address=address, max_sessions=config.max_sessions, warmup_ms=warmup_ms
                        ),
                    )
                except JournalWriteFailed as exc:
                    raise StartupRefused(f"journal {journal.path} cannot write: {exc}") from None
                ready = True
            task_status.started((address, runner))
            if join is not None:
                nursery.start_soon(run_joined_call)
            await runner.wait_drained()
            reason = f"drained: {runner.drain_reason}"
            if not joined_ok:
                exit_code, reason = 1, "start_failed"
            if runner.unclosed:
                exit_code = 1
            try:
                await emit_lifecycle(journal, LifecycleEnded(reason=reason))
            except JournalWriteFailed as exc:
                log.error("the ended record was not written: %s", exc)
                exit_code = 1
            # Streams send what is left (ended included), then the listener closes.
            closing.set()
            shutdown.set()
            await http_done.wait()
            await public_done.wait()
            await metrics_done.wait()
            signal_scope.cancel()
    return Outcome(exit_code=exit_code, reason=reason)
