"""What an agent's call journals: its turns, messages and settings, in order, some without waiting."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import attrs
import trio

from ..calls import CallRecord, keep_json
from ..voice.events import TurnResult

log = logging.getLogger("runner.agent")


@attrs.define(eq=False)
class _Deferred:
    done: trio.Event = attrs.Factory(trio.Event)
    error: Exception | None = None


class CallRecords:
    """The call's records, kept in order (``record`` ``None``: a call that keeps none).

    A write may be deferred (:meth:`write_soon`): the next one waits for it and fails with its
    error, so the records keep their order and a failed write is not passed over.
    """

    def __init__(self, record: CallRecord | None, session_id: str) -> None:
        self.record = record
        self._session_id = session_id
        # The journal write a turn did not wait for (its person's words): later writes follow it.
        self._deferred: _Deferred | None = None
        # Where deferred writes run, while the call runs (else a write waits).
        self.nursery: trio.Nursery | None = None

    async def write(self, cls: str, body: dict[str, Any]) -> None:
        if self.record is not None:
            await self._after_deferred()
            await self.record.write(cls, body)

    async def event(self, name: str, payload: Mapping[str, Any]) -> None:
        if self.record is not None:
            await self._after_deferred()
            await self.record.event(name, payload)

    async def write_soon(self, cls: str, body: dict[str, Any]) -> None:
        """Journal a record without waiting for its commit (outside the call's run: waiting)."""
        if self.record is None or self.nursery is None:
            await self.write(cls, body)
            return
        record, before = self.record, self._deferred
        deferred = self._deferred = _Deferred()

        async def write() -> None:
            # Shielded: the person's words are journaled even when the call ends meanwhile
            # (the journal bounds an append: it commits, fails, or is closed).
            with trio.CancelScope(shield=True):
                try:
                    if before is not None:
                        await before.done.wait()
                    await record.write(cls, body)
                except Exception as exc:  # noqa: BLE001 - kept for the next write, which raises it
                    log.error("call %s: a %s record was not journaled: %r", self._session_id, cls, exc)
                    deferred.error = exc
                finally:
                    deferred.done.set()

        self.nursery.start_soon(write)
        await trio.lowlevel.checkpoint()

    async def _after_deferred(self) -> None:
        deferred = self._deferred
        if deferred is None:
            return
        await deferred.done.wait()
        if self._deferred is deferred:
            self._deferred = None
        error, deferred.error = deferred.error, None
        if error is not None:
            raise error

    async def turn(self, result: TurnResult) -> None:
        """The agent's side of a finished turn (a ``conversation`` record)."""
        text, truncated = keep_json(result.text)
        body: dict[str, Any] = {
            "type": "turn",
            "turn": result.turn,
            "role": "assistant",
            "text": text,
            "interrupted": result.interrupted,
            "toolCalls": [_tool_call_record(c) for c in result.tool_calls],
            "usage": [
                {
                    "model": u.model,
                    "inputTokens": u.input_tokens,
                    "outputTokens": u.output_tokens,
                    "cachedTokens": u.cached_tokens,
                }
                for u in result.usage
            ],
            "timings": {
                "modelFirstTextMs": result.timings.model_first_text_ms,
                "firstAudioMs": result.timings.first_audio_sent_ms,
                "totalMs": result.timings.total_ms,
            },
            "chunksSpoken": result.chunks_spoken,
        }
        if result.reason is not None:
            body["reason"] = result.reason
        if truncated:
            body["truncated"] = True
        await self.write("conversation", body)


def _tool_call_record(call: Any) -> dict[str, Any]:
    arguments, arguments_cut = keep_json(call.arguments)
    result, result_cut = keep_json(call.result)
    record = {
        "callId": call.call_id,
        "name": call.name,
        "arguments": arguments,
        "result": result,
        "ok": call.ok,
        "error": call.error,
        "ms": call.ms,
        "round": call.round,
    }
    if arguments_cut or result_cut:
        record["truncated"] = True
    return record
