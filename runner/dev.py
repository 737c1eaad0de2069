"""``runner dev``: a runner for the agent's author, in the terminal.

It is a whole runner (journal, management listener, events stream, the agent WebSocket on
the public listener) that also holds one call of its own over the loopback transport: the
terminal's. What that call says prints on stderr as it happens, greeting included; each
line typed on stdin is a turn. stdout keeps the lifecycle lines, as on every runner.

It also serves the playground page on its public listener (``runner/api/_playground.py``).
Saving the agent's file restarts the calls with the new code (watched with
``watchfiles``); a file that no longer loads prints its error and the old agent keeps
running. Ctrl-C ends the terminal's call at once and exits.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import sys
import traceback
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TextIO

import trio

from .agent import DEFAULT_AGENT, Agent, AgentRuntime, load_agent, warm_up
from .calls import CallContext, CallRecord, Runner
from .console import Transcript
from .errors import RunnerError
from .runtime import Outcome
from .transports.loopback import LoopbackCaller, LoopbackTransport
from .wire import StartCallRequest

log = logging.getLogger("runner.dev")

RELOAD_REASON = "agent_reloaded"
TERMINAL_SESSION = "dev"
_DEBOUNCE_MS = 150


def source_of(spec: str | None) -> Path | None:
    """The file an agent spec names: ``path.py[:attr]`` or the module's own file."""
    target = (spec or DEFAULT_AGENT).partition(":")[0]
    if target.endswith(".py"):
        return Path(target).resolve()
    try:
        found = importlib.util.find_spec(target)
    except (ImportError, ValueError):
        return None
    if found is None or found.origin is None or not found.origin.endswith(".py"):
        return None
    return Path(found.origin).resolve()


def reload_agent(spec: str | None) -> Agent:
    """Load the agent again from its source, as it is now on disk.

    Raises:
        Exception: Whatever loading it raises (a syntax error, an import error, an
            AuthoringError, ValueError when it holds no agent).
    """
    target = (spec or DEFAULT_AGENT).partition(":")[0]
    if not target.endswith(".py") and target in sys.modules:
        importlib.reload(sys.modules[target])
    return load_agent(spec)


class Dev:
    """The dev runner's own parts: the agent as last loaded, the terminal's call, reloads.

    Args:
        spec: The agent as the command named it.
        agent: The agent loaded from it.
        loopback: The loopback transport the runner was given.
        out: Where the conversation and the dev lines go (stderr).
    """

    def __init__(self, spec: str | None, agent: Agent, loopback: LoopbackTransport, out: TextIO) -> None:
        self.spec = spec
        self.agent = agent
        self.loopback = loopback
        self.out = out
        self.source = source_of(spec)
        self.transcript = Transcript(out, speech=False)
        self.terminal_session: str | None = None
        self.calls_started = 0
        self.reloads = 0
        self._reloaded = trio.Event()
        self.caller: LoopbackCaller | None = None

    async def run(self, serve: Callable[..., Awaitable[Outcome]], stdin: TextIO) -> Outcome:
        """Run the runner (``serve(task_status=...)``) with the terminal's call, typing and reloads."""
        outcome: Outcome | None = None
        with self.transcript.keeping_lines_whole():
            async with trio.open_nursery() as nursery:

                async def run_runner(*, task_status: trio.TaskStatus[tuple[str, Runner]]) -> None:
                    nonlocal outcome
                    outcome = await serve(task_status=task_status)
                    nursery.cancel_scope.cancel()

                _, runner = await nursery.start(run_runner)
                nursery.start_soon(self.serve_terminal_call, runner)
                nursery.start_soon(self.serve_typing, stdin)
                nursery.start_soon(self.serve_reloads, runner)
        assert outcome is not None
        return outcome

    def say(self, line: str) -> None:
        self.transcript.end_line()  # never in the middle of a conversation line
        print(f"runner: {line}", file=self.out, flush=True)

    def conversation_factory(self) -> Callable[[CallContext, CallRecord], AgentRuntime]:
        """Each call gets the agent as last loaded; the terminal's call also prints."""

        def make(call: CallContext, record: CallRecord) -> AgentRuntime:
            runtime = AgentRuntime(self.agent, call, record, host_connected=True)
            if call.session_id == self.terminal_session:
                runtime.add_listener(self.transcript.show)
            return runtime

        return make

    async def serve_terminal_call(self, runner: Runner) -> None:
        """Hold the terminal's call: start it, restart it on a reload, end it when the runner drains."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._end_on_drain, runner, nursery.cancel_scope)
            # One session id for every restart, so `runner replay --producer dev` finds them all.
            session_id = TERMINAL_SESSION
            self.terminal_session = session_id
            while not runner.draining:
                self.calls_started += 1
                try:
                    call, _ = await runner.start_call(
                        StartCallRequest(
                            session_id=session_id,
                            realtime_url=f"loopback://{session_id}",
                            realtime_token="dev",
                        )
                    )
                except RunnerError as exc:
                    self.say(f"the terminal's call did not start: {exc.detail}")
                    return
                caller = await self.loopback.wait_caller(session_id)
                self.caller = caller
                if self.calls_started == 1:
                    self.say(
                        f"talking to {self.agent.name} in call {session_id!r}: type a line and press "
                        "Enter to say it; Ctrl-C ends"
                    )
                async with trio.open_nursery() as call_nursery:
                    # Nobody plays the terminal call's speech: read it so it never piles up.
                    call_nursery.start_soon(_drain, caller)
                    await self._wait_reload_or_end(call)
                    call_nursery.cancel_scope.cancel()
                if call.state not in ("ending", "ended"):
                    await runner.stop_call(session_id, reason=RELOAD_REASON, grace_ms=0)
                # The runner lets go of the call in the step that sets its end, so the same
                # id starts again below as a new call, not as a repeat of this one.
                await call.wait_ended()

    async def _wait_reload_or_end(self, call: Any) -> None:
        async with trio.open_nursery() as nursery:

            async def ended() -> None:
                await call.wait_ended()
                nursery.cancel_scope.cancel()

            nursery.start_soon(ended)
            await self._reloaded.wait()
            self._reloaded = trio.Event()
            nursery.cancel_scope.cancel()

    async def _end_on_drain(self, runner: Runner, scope: trio.CancelScope) -> None:
        # The terminal's call is the author's own: a drain ends it at once, it never holds the exit.
        await runner.wait_draining()
        session_id = self.terminal_session
        if session_id is not None and session_id in runner.calls:
            runner.calls[session_id].stop_nowait("runner_draining", grace_ms=0)
        scope.cancel()

    async def serve_typing(self, stdin: TextIO) -> None:
        """Each line typed is a turn of the terminal's call; end of input just stops reading."""
        while True:
            line = await trio.to_thread.run_sync(stdin.readline, abandon_on_cancel=True)
            if not line:
                return
            text = line.strip()
            caller = self.caller
            if text and caller is not None and not caller.left:
                caller.say(text)

    async def serve_reloads(self, runner: Runner) -> None:
        """Reload the agent when its file is saved; restart every call with the new code."""
        if self.source is None:
            self.say(f"{self.spec} has no source file to watch: no reload")
            return
        import watchfiles

        logging.getLogger("watchfiles").setLevel(logging.WARNING)
        source = str(self.source)
        async for _ in watchfiles.awatch(
            self.source.parent,
            watch_filter=lambda change, path: path == source,
            debounce=_DEBOUNCE_MS,
            step=50,
        ):
            try:
                agent = reload_agent(self.spec)
                await warm_up(agent)
            except Exception as exc:  # noqa: BLE001 - any error in the author's file keeps the old agent
                where = "".join(traceback.format_exception_only(type(exc), exc)).rstrip()
                self.say(
                    f"{self.source.name} changed but does not load; the old agent keeps running:\n{where}"
                )
                continue
            self.agent = agent
            self.reloads += 1
            self.say(f"{self.source.name} changed: the calls restart with the new code")
            # The playground's sockets close (4013) and reconnect to a call of the new agent.
            for session_id in list(runner.calls):
                if session_id != self.terminal_session:
                    runner.calls[session_id].stop_nowait(RELOAD_REASON, grace_ms=0)
            self._reloaded.set()


async def _drain(caller: LoopbackCaller) -> None:
    async for _ in caller.audio:
        pass
