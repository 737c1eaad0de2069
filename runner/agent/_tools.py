"""The tools a call's turns offer and run: the agent's, the app's and the platform's, and the
calls of a tool that asks first, waiting for the person's confirmation."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import attrs
import trio

from ..providers import ToolCall, ToolSpec
from ..voice.engine import ToolOutcome
from ..voice.events import ToolConfirmRequested, TurnEvent
from ._authoring import AppTool, Offer, call_maybe_async, log_tool_failure
from ._context import Context
from ._schema import ArgumentsRefused

# How long a tool that asks first waits for the person's answer (and at most one more turn).
CONFIRM_FOR_S = 10 * 60.0

# Runs an app tool's call on the caller's app: (turn id, the tool, the call) -> its outcome.
AppToolHandler = Callable[[str, AppTool, ToolCall], Awaitable[ToolOutcome]]


@attrs.frozen(kw_only=True)
class PlatformTool:
    """A tool of the platform itself (not the agent's, not the app's): ``run(turn_id, call)``."""

    spec: ToolSpec
    run: Callable[[str, ToolCall], Awaitable[ToolOutcome]]


@attrs.frozen(kw_only=True)
class PlatformSupport:
    """What the agent platform adds to a call's turns once one of its conversations holds the call.

    With it, a tool marked ``ask_first`` waits for the person's confirmation: the platform's
    people can give one.

    Attributes:
        run_app_tool: Runs an app tool's call on the person's app.
        instructions: More instructions (the conversation's summary, knowledge found), asked
            again for every model call; ``None`` or "" adds nothing.
        tools: The platform's own tools (knowledge search, relationship notes): offered beside
            the agent's, run by the platform.
    """

    run_app_tool: AppToolHandler
    instructions: Callable[[], str | None]
    tools: Mapping[str, PlatformTool] = attrs.field(factory=dict)


class ConfirmationNotWaiting(LookupError):
    """No call of a tool that asks first waits under that id (answered, expired or dropped)."""


@attrs.frozen(kw_only=True)
class PendingConfirmation:
    """A call of a tool marked ``ask_first`` that has not run: it waits for the person."""

    call_id: str
    name: str
    arguments: dict[str, Any]
    turn: str
    expires_at: float

    def call(self) -> ToolCall:
        return ToolCall(id=self.call_id, name=self.name, arguments=self.arguments)


class CallTools:
    """What a call's turns may call, and the calls waiting for a confirmation.

    Args:
        offer: What the agent offers now.
        ctx: The context the agent's tools get.
        emit: Reports a turn event (a confirmation asked for).
    """

    def __init__(
        self, offer: Callable[[], Offer], ctx: Context, emit: Callable[[TurnEvent], Awaitable[None]]
    ) -> None:
        self._offer = offer
        self._ctx = ctx
        self._emit = emit
        # What the platform adds, once a conversation of its holds the call. Without it app
        # tools fail, and tools marked ask_first run unasked: nobody could confirm them.
        self._platform: PlatformSupport | None = None
        # The running turn's id and the app tools it offers (set by the runtime per turn).
        self.turn_id: str | None = None
        self.turn_app_tools: tuple[AppTool, ...] = ()
        self._pending: dict[str, PendingConfirmation] = {}
        self._confirmed: set[str] = set()

    def attach_platform(self, platform: PlatformSupport) -> None:
        """Offer and run what the platform adds to the call's turns from now on."""
        self._platform = platform

    @property
    def platform_tools(self) -> Mapping[str, PlatformTool]:
        """The platform's own tools offered now (none before a conversation holds the call)."""
        return {} if self._platform is None else self._platform.tools

    @property
    def confirms_tools(self) -> bool:
        """Whether a tool marked ``ask_first`` waits for the person's confirmation."""
        return self._platform is not None

    def specs(self) -> list[ToolSpec]:
        """The tools a model call of the running turn is offered."""
        return [
            *(t.spec() for t in self._offer().tools),
            *(t.spec() for t in self.turn_app_tools),
            *(p.spec for p in self.platform_tools.values()),
        ]

    def filler(self, call: ToolCall) -> str | None:
        """The line the agent says while ``call`` runs: its tool's ``filler``.

        None for a tool that may first wait for the person's confirmation: it is not run yet.
        """
        tool = self._offer().tool(call.name)
        if tool is None or not tool.filler:
            return None
        if tool.ask_first and self.confirms_tools and call.id not in self._confirmed:
            return None
        return tool.filler

    async def run(self, call: ToolCall) -> ToolOutcome:
        """Run a call of the model's: a platform tool, an app tool, or one of the agent's."""
        platform = self.platform_tools.get(call.name)
        if platform is not None and self.turn_id is not None:
            return await platform.run(self.turn_id, call)
        app_tool = next((t for t in self.turn_app_tools if t.name == call.name), None)
        if app_tool is not None:
            if self._platform is None or self.turn_id is None:
                return ToolOutcome(ok=False, error=f"no app is connected to run {call.name!r}")
            return await self._platform.run_app_tool(self.turn_id, app_tool, call)
        tool = self._offer().tool(call.name)
        if tool is None:
            return ToolOutcome(ok=False, error=f"no tool {call.name!r} is offered now")
        if tool.ask_first and self.confirms_tools and not self._may_run_unasked(call):
            return await self._ask_first(call)
        try:
            arguments = tool.arguments.check(call.arguments) if tool.arguments else dict(call.arguments)
        except ArgumentsRefused as refused:
            # The model is told what was wrong and may call again; the tool does not run.
            return ToolOutcome(ok=False, error=str(refused))
        try:
            result = await call_maybe_async(tool.fn, self._ctx, **arguments)
        except Exception as exc:  # noqa: BLE001 - an author's tool may raise anything; the model reads it as a tool error
            log_tool_failure(call.name, exc)
            return ToolOutcome(ok=False, error=f"{type(exc).__name__}: {exc}")
        return ToolOutcome(ok=True, result=result)

    def _may_run_unasked(self, call: ToolCall) -> bool:
        # Confirmed by the person, or called again with the same arguments in their next turn.
        if call.id in self._confirmed:
            return True
        for call_id, pending in list(self._pending.items()):
            if (
                pending.turn != self.turn_id
                and pending.name == call.name
                and pending.arguments == dict(call.arguments)
            ):
                del self._pending[call_id]
                return True
        return False

    async def _ask_first(self, call: ToolCall) -> ToolOutcome:
        assert self.turn_id is not None
        pending = PendingConfirmation(
            call_id=call.id,
            name=call.name,
            arguments=dict(call.arguments),
            turn=self.turn_id,
            expires_at=trio.current_time() + CONFIRM_FOR_S,
        )
        self._pending[call.id] = pending
        await self._emit(
            ToolConfirmRequested(
                turn=self.turn_id, call_id=call.id, name=call.name, arguments=pending.arguments
            )
        )
        return ToolOutcome(
            ok=False,
            error="not run yet: it waits for the person's confirmation; ask them whether to go ahead",
        )

    def pending_confirmation(self, call_id: str) -> PendingConfirmation:
        """The call of a tool that asks first still waiting under ``call_id``.

        Raises:
            ConfirmationNotWaiting: It was answered, expired or dropped by a later turn.
        """
        pending = self._pending.get(call_id)
        if pending is None or trio.current_time() > pending.expires_at:
            self._pending.pop(call_id, None)
            raise ConfirmationNotWaiting(call_id)
        return pending

    def take_confirmation(self, call_id: str) -> PendingConfirmation:
        """Remove and return a waiting call (its answer is being given); see :meth:`pending_confirmation`."""
        pending = self.pending_confirmation(call_id)
        del self._pending[call_id]
        return pending

    def confirm(self, call_id: str, *, yes: bool = True) -> None:
        """The person said yes to ``call_id`` (it runs unasked this turn); ``yes=False``: the turn is over."""
        if yes:
            self._confirmed.add(call_id)
        else:
            self._confirmed.discard(call_id)

    def turn_finished(self, turn_id: str) -> None:
        """A call that asks first waits for the rest of its turn and one more."""
        for call_id, pending in list(self._pending.items()):
            if pending.turn != turn_id:
                del self._pending[call_id]
