"""A conversation's stored history as the model reads it: what is kept, and what a summary covers.

The model's history is the call's (``AgentRuntime.history``); this keeps it in step with the
journal: loaded when the conversation's call starts, each turn's new messages stored (and its
usage charged) when it ends, the older messages folded into a summary when they grow long.
"""

from __future__ import annotations

import logging
from typing import Literal

from journal import AgentStore, Spent, StoredMessage, StoredToolCall

from ..agent import AgentRuntime
from ..providers import ChatMessage, ToolCall
from ..voice.events import TurnResult
from ._events import Compacted
from ._rules import summarise, usage_rows
from ._turn import RunningTurn

log = logging.getLogger("runner.platform")


class StoredHistory:
    """The stored messages of one conversation behind its call's history."""

    def __init__(self, conversation_id: str, store: AgentStore) -> None:
        self.conversation_id = conversation_id
        self.store = store
        self.summary: str | None = None
        # The model's history (the runtime's list), once loaded.
        self.messages: list[ChatMessage] = []
        # How many of the messages are stored, and the stored position of messages[0]:
        # messages a summary covers leave the history.
        self._persisted = 0
        self._first_position = 1

    async def load(self, runtime: AgentRuntime) -> bool:
        """Put the stored messages (after the summary) before the call's; returns whether any were."""
        stored = await self.store.load_messages(self.conversation_id)
        summary = await self.store.latest_summary(self.conversation_id)
        after = 0
        if summary is not None:
            self.summary, after = summary.summary, summary.after_position
        runtime.load_history(chat_message(m) for m in stored if m.position > after)
        self.messages = runtime.history
        self._first_position = after + 1
        self._persisted = len(self.messages)
        return bool(stored)

    def forget_unstored(self) -> None:
        """A turn failed before it was stored (its record refused on a full disk, say).

        Its messages leave the model's history too, so a later turn does not store them
        with its own: a failed turn is neither kept nor charged, as the person was told.
        """
        del self.messages[self._persisted :]

    async def store_turn(self, state: RunningTurn, result: TurnResult) -> Spent | None:
        """Keep the turn's new messages and charge its usage, in one transaction.

        Stored and charged agree: a write that fails (a full disk) keeps neither, and says so.
        """
        _close_dangling_tool_calls(self.messages)
        new = self.messages[self._persisted :]
        self._persisted = len(self.messages)
        owner = state.owner
        try:
            return await self.store.store_turn(
                conversation_id=self.conversation_id,
                messages=[_stored_message(m, result.turn) for m in new],
                turn_id=state.id,
                token_id=owner.token_id,
                end_user_id=owner.end_user_id,
                rows=usage_rows(result, state.speech_seconds),
            )
        except Exception:
            log.exception(
                "turn %s of conversation %s was neither stored nor charged", state.id, self.conversation_id
            )
            return None

    async def compact_if_due(self, budget_words: int | None) -> Compacted | None:
        """After a reply: fold the messages before the last exchange into the summary, if over budget."""
        if budget_words is None or sum(len(m.content.split()) for m in self.messages) <= budget_words:
            return None
        return await self.compact("automatic")

    async def compact(self, trigger: Literal["automatic", "manual"]) -> Compacted | None:
        """Summarise every stored message before the last person's turn; the transcript is kept."""
        history = self.messages
        cut = max((i for i, m in enumerate(history[: self._persisted]) if m.role == "user"), default=0)
        if cut <= 0:
            return None
        after_position = self._first_position + cut - 1
        summary = summarise(self.summary, history[:cut])
        await self.store.add_summary(
            self.conversation_id, after_position=after_position, summary=summary, trigger=trigger
        )
        del history[:cut]
        self._persisted -= cut
        self._first_position += cut
        self.summary = summary
        return Compacted(conversation_id=self.conversation_id, after_position=after_position, trigger=trigger)


def chat_message(message: StoredMessage) -> ChatMessage:
    return ChatMessage(
        role=message.role,  # type: ignore[arg-type]  # stored roles are written only from ChatMessage roles; the column is a plain str
        content=message.content,
        tool_calls=tuple(ToolCall(id=c.id, name=c.name, arguments=c.arguments) for c in message.tool_calls),
        tool_call_id=message.tool_call_id,
    )


def _stored_message(message: ChatMessage, turn_id: str) -> StoredMessage:
    return StoredMessage(
        role=message.role,
        content=message.content,
        tool_calls=tuple(
            StoredToolCall(id=c.id, name=c.name, arguments=dict(c.arguments)) for c in message.tool_calls
        ),
        tool_call_id=message.tool_call_id,
        turn_id=turn_id,
    )


def _close_dangling_tool_calls(history: list[ChatMessage]) -> None:
    """A turn cancelled while its tools ran leaves calls with no answer: answer them as cancelled,
    so the next model call reads a well-formed conversation.
    """
    index = 0
    while index < len(history):
        message = history[index]
        index += 1
        if not message.tool_calls:
            continue
        answered = set()
        while index < len(history) and history[index].role == "tool":
            answered.add(history[index].tool_call_id)
            index += 1
        for call in message.tool_calls:
            if call.id not in answered:
                history.insert(
                    index, ChatMessage(role="tool", content='{"error": "cancelled"}', tool_call_id=call.id)
                )
                index += 1
