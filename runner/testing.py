"""Testing an agent: run its turns, then check what it said, which tools it called, what it sent.

In the spirit of livekit-agents' ``AgentSession.run(...).expect``: the agent runs in a real
call of its own (the loopback transport, a journal in a temporary directory, the agent's own
runtime), with its own model or a scripted one, and each turn hands back what it did::

    from runner.testing import ScriptedModel, call, open_agent_test

    async def test_weather() -> None:
        async with open_agent_test(agent) as test:
            turn = await test.say("What is the weather in Lisbon?")
            turn.called("weather", city="Lisbon")
            turn.said("sunny")

    async def test_a_model_that_calls_a_tool() -> None:
        model = ScriptedModel([call("weather", city="Oslo")], "Snow in Oslo.")
        async with open_agent_test(agent, model=model) as test:
            (await test.say("Oslo?")).called("weather", city="Oslo").said("Snow")

Tests are Trio tests (``pytest-trio``). Nothing here is mocked but the model you script.
"""

from __future__ import annotations

import itertools
import tempfile
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal

import attrs
import trio

from journal import open_journal

from .agent import Agent
from .agent._runtime import AgentRuntime, choose_experiments, without_voice
from .calls import CallContext, CallRecord
from .providers import ChatMessage, ToolCall, ToolSpec
from .providers._types import LLMEvent, TextDelta, Usage
from .transports.loopback import LoopbackCaller, LoopbackSession
from .voice.engine import ToolRecord, TurnResult

__all__ = ["AgentTest", "ScriptedModel", "TurnCheck", "call", "open_agent_test"]

_ids = itertools.count(1)


def call(name: str, /, **arguments: Any) -> ToolCall:
    """A tool call for a :class:`ScriptedModel` to make: ``call("weather", city="Oslo")``."""
    return ToolCall(id=f"call_{next(_ids)}", name=name, arguments=arguments)


class ScriptedModel:
    """A chat model that plays a script: each model call takes the next reply.

    A reply is text, or a list of text pieces and :func:`call` s (a round that calls tools;
    the tool results go into the next model call, which plays the next reply). When the
    script runs out the model says ``"(the script has no more replies)"``.

    Attributes:
        requests: What each model call was sent: its messages and the tools it was offered.
    """

    provider = "scripted"
    model = "scripted"

    def __init__(self, *replies: str | Sequence[str | ToolCall]) -> None:
        self._replies = [[r] if isinstance(r, str) else list(r) for r in replies]
        self.requests: list[tuple[list[ChatMessage], list[ToolSpec]]] = []

    async def stream(
        self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec] = ()
    ) -> AsyncGenerator[LLMEvent, None]:
        self.requests.append((list(messages), list(tools)))
        steps = self._replies.pop(0) if self._replies else ["(the script has no more replies)"]
        for step in steps:
            await trio.lowlevel.checkpoint()
            yield TextDelta(text=step) if isinstance(step, str) else step
        yield Usage(model=self.model, input_tokens=sum(len(m.content) for m in messages), output_tokens=1)


def _matches(expected: Mapping[str, Any], given: Mapping[str, Any]) -> bool:
    return all(key in given and given[key] == value for key, value in expected.items())


@attrs.frozen
class TurnCheck:
    """One turn as the agent took it, with checks that raise ``AssertionError`` saying why.

    Each check returns the turn (or the tool call it found), so checks chain.
    """

    result: TurnResult

    @property
    def text(self) -> str:
        """The whole reply, as the caller heard or read it."""
        return self.result.text

    @property
    def tool_calls(self) -> tuple[ToolRecord, ...]:
        """Every tool call of the turn, in order, with its arguments, result and outcome."""
        return tuple(self.result.tool_calls)

    def said(self, *fragments: str) -> TurnCheck:
        """The reply contains each fragment (ignoring case)."""
        for fragment in fragments:
            if fragment.lower() not in self.text.lower():
                raise AssertionError(f"the reply does not say {fragment!r}: {self.text!r}")
        return self

    def called(self, name: str, /, **arguments: Any) -> ToolRecord:
        """A call of tool ``name`` that ran, with at least these arguments; returns it.

        Arguments are compared as the model sent them (JSON values: an enum as its value, a
        date as its ISO text).
        """
        calls = [c for c in self.tool_calls if c.name == name]
        found = next((c for c in calls if _matches(arguments, c.arguments)), None)
        if found is None:
            made = [f"{c.name}({dict(c.arguments)})" for c in self.tool_calls] or ["none"]
            raise AssertionError(f"no call of {name}({arguments}); the calls were: {', '.join(made)}")
        if not found.ok:
            raise AssertionError(f"{name} was called but failed: {found.error}")
        return found

    def refused(self, name: str, /) -> ToolRecord:
        """A call of tool ``name`` that failed (bad arguments, or the tool raised); returns it."""
        found = next((c for c in self.tool_calls if c.name == name and not c.ok), None)
        if found is None:
            raise AssertionError(f"no failed call of {name}: {[c.name for c in self.tool_calls]}")
        return found

    def called_nothing(self) -> TurnCheck:
        """The turn called no tool."""
        if self.tool_calls:
            raise AssertionError(f"the turn called {[c.name for c in self.tool_calls]}")
        return self


@attrs.define
class AgentTest:
    """An agent in a call of its own; see :func:`open_agent_test`.

    Attributes:
        runtime: The agent's side of the call (``runtime.ctx.state`` is the call's state).
        greeting: The opening turn, when the agent greets; ``None`` when it waits.
        to_client: Every ``ctx.send.to_client`` so far, as ``(key, payload)``.
    """

    runtime: AgentRuntime
    caller: LoopbackCaller
    journal: Any
    session_id: str
    timeout_s: float
    greeting: TurnCheck | None = None
    to_client: list[tuple[str, Any]] = attrs.Factory(list)

    async def say(self, text: str) -> TurnCheck:
        """Take a turn with the person's words; return it once the reply ended."""
        with trio.fail_after(self.timeout_s):
            result = await self.runtime.take_turn(text)
            # Messages the turn queued leave in order, after it.
            await self.runtime.wait_sent()
        self._collect()
        if result is None:
            raise AssertionError("the call takes no more turns")
        return TurnCheck(result)

    async def message(
        self, key: str, payload: Any = None, *, sender: Literal["client", "host"] = "client"
    ) -> Any:
        """Send a keyed message as the caller's app (or the host); return the handlers' reply.

        Raises:
            RunnerError: The refusal a real sender would get (``NoHandler``, ``InvalidPayload``,
                ``HandlerFailed``).
        """
        with trio.fail_after(self.timeout_s):
            reply = await self.runtime.deliver(sender, key, payload)
            await self.runtime.wait_sent()
        self._collect()
        return reply

    async def to_host(self) -> list[tuple[str, Any]]:
        """Every ``ctx.send.to_host`` and ``ctx.ask_host`` so far, as ``(key, payload)``."""
        records = await self.journal.read(0, producer=self.session_id)
        return [(r.body["name"], r.body.get("payload")) for r in records if r.cls == "host"]

    async def records(self) -> list[dict[str, Any]]:
        """The call's journal records so far, as a host reads them (bodies, in order)."""
        return [dict(r.body) for r in await self.journal.read(0, producer=self.session_id)]

    def _collect(self) -> None:
        while True:
            try:
                sent = self.caller.to_client.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel):
                return
            self.to_client.append((sent["key"], sent["payload"]))


@asynccontextmanager
async def open_agent_test(
    agent: Agent,
    *,
    model: Any = None,
    client: Mapping[str, str] | None = None,
    session_id: str = "test",
    speech: bool = False,
    timeout_s: float = 30.0,
) -> AsyncIterator[AgentTest]:
    """Start ``agent`` in a call of its own; the call ends when the block does.

    Args:
        agent: The agent under test.
        model: A chat model to use instead of the agent's (a :class:`ScriptedModel`);
            ``None``: the agent's own.
        client: The call's client context (``ctx.client``).
        session_id: The call's id (experiment variants follow from it).
        speech: Synthesize the replies' speech too (slower); by default the call is text only.
        timeout_s: How long a turn or a message may take before the test fails.
    """
    try:
        async with _open_call(
            agent, model=model, client=client, session_id=session_id, speech=speech, timeout_s=timeout_s
        ) as test:
            yield test
    except BaseExceptionGroup as group:
        # The call's nurseries wrap what the test's own block raised: a failed check reads
        # as itself, not as a group of one. A group of several stays a group.
        raise _only(group) from None


def _only(group: BaseExceptionGroup[BaseException]) -> BaseException:
    error: BaseException = group
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return error


@asynccontextmanager
async def _open_call(
    agent: Agent,
    *,
    model: Any,
    client: Mapping[str, str] | None,
    session_id: str,
    speech: bool,
    timeout_s: float,
) -> AsyncIterator[AgentTest]:
    if not speech:
        agent = without_voice(agent)
    context = dict(client or {})
    call_context = CallContext(
        session_id=session_id,
        direction="inbound",
        client=context,
        experiments=choose_experiments(agent, session_id, context, None),
    )
    with tempfile.TemporaryDirectory(prefix="agent-test-") as directory:
        async with open_journal(Path(directory) / "journal.db") as journal:
            runtime = AgentRuntime(agent, call_context, CallRecord(journal, session_id), host_connected=True)
            runtime.model = model
            finished: list[TurnResult] = []

            async def keep(event: Any) -> None:
                if hasattr(event, "result") and isinstance(event.result, TurnResult):
                    finished.append(event.result)

            runtime.add_listener(keep)
            session = LoopbackSession("app")
            test = AgentTest(
                runtime=runtime,
                caller=LoopbackCaller(session),
                journal=journal,
                session_id=session_id,
                timeout_s=timeout_s,
            )
            async with trio.open_nursery() as nursery:
                nursery.start_soon(runtime.run, session, session.events)
                nursery.start_soon(_drain_audio, test.caller)
                with trio.fail_after(timeout_s):
                    await runtime.ready.wait()
                    await runtime.wait_idle()  # the greeting, if any
                    await runtime.wait_sent()
                test.greeting = TurnCheck(finished[0]) if finished else None
                test._collect()
                try:
                    yield test
                finally:
                    nursery.cancel_scope.cancel()


async def _drain_audio(caller: LoopbackCaller) -> None:
    async for _ in caller.audio:
        pass
