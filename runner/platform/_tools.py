"""The tools a conversation adds to its agent's: the platform's own, and the ones the app runs.

The platform's own search the agent's knowledge and keep notes on the person (each where the
agent asks for it); the app's run on the person's side: the call goes to the turn's owner
and waits (bounded) for its answer.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

import trio

from journal import KnowledgeHit

from ..agent import PlatformTool
from ..providers import ToolCall, ToolSpec
from ..voice.engine import ToolOutcome
from ..voice.events import AppToolCalled
from ._events import KnowledgeSearched
from ._rules import KNOWLEDGE_HITS, KNOWLEDGE_TOOL, MAX_NOTE_CHARS, RELATION_TOOL, with_stop
from ._turn import ConversationHost, RunningTurn

if TYPE_CHECKING:
    from ..agent import AppTool

log = logging.getLogger("runner.platform")

# An app tool's result (or error) past this much JSON text reaches the model, the stored
# conversation and the turn's frames as its first this-many bytes and a note that it was cut.
APP_TOOL_RESULT_MAX_BYTES = 16 * 1024

_SEARCH = ToolSpec(
    name=KNOWLEDGE_TOOL,
    description="Search the knowledge base for facts on a topic.",
    parameters={"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
)
_NOTE = ToolSpec(
    name=RELATION_TOOL,
    description="Record a change in the relationship with this person: a note to keep about them.",
    parameters={"type": "object", "properties": {"note": {"type": "string"}}, "required": ["note"]},
)


def cut_app_result(value: Any) -> Any:
    """An app tool's result as the model gets it: as sent, or (past the limit) cut, and said so.

    A cut result is text: the first :data:`APP_TOOL_RESULT_MAX_BYTES` bytes of the result's
    JSON (or of the text itself), then a line telling the model it was cut and how long it was.
    """
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    data = text.encode(errors="replace")
    if len(data) <= APP_TOOL_RESULT_MAX_BYTES:
        return value
    head = data[:APP_TOOL_RESULT_MAX_BYTES].decode(errors="ignore")
    return (
        f"{head}\n[The app's result was cut here: it was {len(data):,} bytes, and only the first"
        f" {APP_TOOL_RESULT_MAX_BYTES:,} are shown. Say only what this part shows.]"
    )


class ConversationTools:
    """One conversation's tools; ``running(turn_id)`` is its turn of that id while it runs."""

    def __init__(
        self, conversation_id: str, host: ConversationHost, running: Callable[[str], RunningTurn | None]
    ) -> None:
        self.conversation_id = conversation_id
        self.host = host
        self._running = running
        self._app_calls: dict[str, trio.MemorySendChannel[ToolOutcome]] = {}

    # -- The platform's own ------------------------------------------------------------------

    def platform_tools(self) -> dict[str, PlatformTool]:
        """The platform's tools this conversation's agent is given, by name."""
        agent = self.host.agent
        tools: dict[str, PlatformTool] = {}
        if agent.knowledge == "tool":
            tools[KNOWLEDGE_TOOL] = PlatformTool(spec=_SEARCH, run=self._knowledge_tool)
        if agent.relations:
            tools[RELATION_TOOL] = PlatformTool(spec=_NOTE, run=self._relation_tool)
        return tools

    async def search_first(self, state: RunningTurn, text: str) -> None:
        """For an agent that searches before it answers: what its knowledge says of ``text``."""
        if self.host.agent.knowledge != "first" or state.finished:
            return
        hits = await self._search(state, "first", text)
        if hits:
            state.knowledge = "\n".join(with_stop(h.text) for h in hits)

    async def _search(
        self, state: RunningTurn, via: Literal["first", "tool"], query: str
    ) -> list[KnowledgeHit] | None:
        try:
            hits = await self.host.store.search_knowledge(self.host.agent_id, query, limit=KNOWLEDGE_HITS)
        except Exception:
            log.exception("a knowledge search of conversation %s failed", self.conversation_id)
            state.owner.deliver(KnowledgeSearched(turn=state.id, via=via, outcome="failed", hits=()))
            return None
        state.owner.deliver(
            KnowledgeSearched(turn=state.id, via=via, outcome="found" if hits else "none", hits=tuple(hits))
        )
        return hits

    async def _knowledge_tool(self, turn_id: str, call: ToolCall) -> ToolOutcome:
        state = self._running(turn_id)
        if state is None:
            return ToolOutcome(ok=False, error="the turn is over")
        query = str(call.arguments.get("query") or "")
        hits = await self._search(state, "tool", query)
        if hits is None:
            return ToolOutcome(ok=False, error="the knowledge search failed")
        if not hits:
            return ToolOutcome(ok=True, result=f"Nothing in the knowledge base about {query}.")
        return ToolOutcome(ok=True, result=" ".join(with_stop(h.text) for h in hits))

    async def _relation_tool(self, turn_id: str, call: ToolCall) -> ToolOutcome:
        state = self._running(turn_id)
        if state is None:
            return ToolOutcome(ok=False, error="the turn is over")
        note = str(call.arguments.get("note") or "").strip()[:MAX_NOTE_CHARS]
        if not note:
            return ToolOutcome(ok=False, error="a note is needed")
        row = await self.host.store.record_relation(
            self.host.agent_id, state.owner.end_user_id, note, turn_id=turn_id
        )
        state.relation = row
        return ToolOutcome(ok=True, result=f"Noted: {note}")

    # -- The app's -----------------------------------------------------------------------------

    async def call_app_tool(self, turn_id: str, tool: AppTool, call: ToolCall) -> ToolOutcome:
        """Send the call to the turn's owner, whose app runs it; wait for its answer (bounded)."""
        state = self._running(turn_id)
        if state is None:
            return ToolOutcome(ok=False, error="the turn is over")
        state.owner.deliver(
            AppToolCalled(
                turn=turn_id,
                call_id=call.id,
                name=call.name,
                arguments=dict(call.arguments),
                action_only=tool.action_only,
                timeout_ms=tool.timeout_ms,
            )
        )
        if tool.action_only:
            return ToolOutcome(ok=True, result="sent to the app")
        send, receive = trio.open_memory_channel[ToolOutcome](1)
        self._app_calls[call.id] = send
        try:
            with trio.move_on_after(tool.timeout_ms / 1000):
                return await receive.receive()
            return ToolOutcome(ok=False, error=f"the app did not answer within {tool.timeout_ms} ms")
        finally:
            self._app_calls.pop(call.id, None)

    def app_result(self, call_id: str, result: Any, error: str | None) -> None:
        """The app's answer to an :class:`AppToolCalled`; one for a call that is over is ignored."""
        waiter = self._app_calls.pop(call_id, None)
        if waiter is None:
            return
        if error is not None:
            waiter.send_nowait(ToolOutcome(ok=False, error=cut_app_result(error)))
        else:
            waiter.send_nowait(ToolOutcome(ok=True, result=cut_app_result(result)))
