"""The socket's send path: what waits while a write is in flight is joined, never reordered.

The driver (:class:`~runner.transports.websocket.Connection`) runs for real over
a real Runner, journal, agent store and platform in this process; only the server's
WebSocket under it is a stand-in (``StalledWire``) whose writes hang until the test lets
them go, as a client that reads nothing for a while makes them hang.
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager, nullcontext
from pathlib import Path

import attrs
import trio

from journal import open_agent_store, open_journal
from runner.agent import LLM, TTS, Agent, choose_experiments, conversation_factory
from runner.calls import Runner
from runner.config import Config
from runner.transports.websocket import AgentSocketService, AgentSocketSetup, Connection, WebSocketTransport
from runner.voice.events import AudioData, ReplyDelta, TurnEvent, TurnFinished

from .ino_checker import FrameChecker

AGENT = Agent(
    "ino-outbox",
    instructions="You are the concierge of Hotel Lumen. Breakfast is served from seven to eleven in the garden room.",
    llm=LLM(provider="local", model="local"),
    tts=TTS(provider="espeak", voice="en-us+f2"),
)


@attrs.define(eq=False)
class StalledWire:
    """The server's WebSocket under the driver: frames in from the test, writes held until ``flowing``."""

    incoming: trio.MemoryReceiveChannel[str | bytes]
    flowing: trio.Event = attrs.Factory(trio.Event)
    sent: list[str | bytes] = attrs.Factory(list)
    closed: tuple[int, str] | None = None
    _more: trio.Event = attrs.Factory(trio.Event)

    @property
    def requested_subprotocols(self) -> list[str]:
        return ["ino.v2"]

    async def accept(self, subprotocol: str | None) -> None:
        await trio.lowlevel.checkpoint()

    async def receive(self) -> str | bytes:
        return await self.incoming.receive()

    async def send(self, data: str | bytes) -> None:
        await self.flowing.wait()
        self.sent.append(data)
        self._more.set()
        self._more = trio.Event()

    async def wait_sent(self, predicate: Callable[[list[str | bytes]], bool]) -> None:
        """Wait until what was written so far satisfies ``predicate``."""
        while not predicate(self.sent):
            await self._more.wait()

    def corked(self) -> AbstractAsyncContextManager[None]:
        return nullcontext()

    async def close(self, code: int, reason: str) -> None:
        await trio.lowlevel.checkpoint()
        self.closed = (code, reason)


async def turn_done(wire: StalledWire) -> None:
    await wire.wait_sent(lambda sent: any(isinstance(m, str) and '"type":"turn.done"' in m for m in sent))


def checked(sent: list[str | bytes]) -> FrameChecker:
    """Every frame sent, through the ino.v2 checker."""
    checker = FrameChecker(thoughts_allowed=False)
    for message in sent:
        checker.feed(message)
    checker.finish()
    return checker


@asynccontextmanager
async def open_service(tmp_path: Path) -> AsyncIterator[AgentSocketService]:
    config = Config(journal_path=tmp_path / "journal.db", max_sessions=4, drain_grace_ms=0)
    async with open_journal(config.journal_path) as journal, open_agent_store(journal.path) as store:
        transport = WebSocketTransport()
        runner = Runner(
            config,
            journal,
            transports=[transport],
            conversation_factory=conversation_factory(AGENT, host_connected=True),
            experiment_chooser=lambda start: choose_experiments(AGENT, start.session_id, {}, None),
        )
        service = AgentSocketService(runner, transport, store, AgentSocketSetup(agent=AGENT, api_key=None))
        async with trio.open_nursery() as nursery:
            await nursery.start(runner.serve)
            await nursery.start(service.serve)
            yield service
            runner.drain_nowait("test_done")


async def test_frames_waiting_for_a_stalled_socket_are_joined_in_order(tmp_path: Path) -> None:
    async with open_service(tmp_path) as service:
        minted = await service.platform.mint_key(end_user_id="eu_outbox", ttl_seconds=600, credit_limit=None)
        row = await service.platform.create_conversation(minted.row)
        send, incoming = trio.open_memory_channel[str | bytes](math.inf)
        wire = StalledWire(incoming)
        handed: list[TurnEvent] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(service.serve_socket, wire, row.conversation_id)
            # The first write (ready) goes out; everything after waits behind a stalled one.
            send.send_nowait(
                json.dumps({"type": "auth", "key": minted.token, "session_id": row.conversation_id})
            )
            with trio.fail_after(10):
                # The service tells nobody when a socket has joined its call: polled.
                while not service.connections or next(iter(service.connections)).call is None:
                    await trio.sleep(0.01)
            conn: Connection = next(iter(service.connections))
            finished = trio.Event()
            conn.call.conversation.runtime.add_listener(_keep(handed, finished))
            send.send_nowait(json.dumps({"type": "user_message", "text": "When is breakfast served?"}))
            with trio.fail_after(20):
                await finished.wait()
            wire.flowing.set()
            with trio.fail_after(10):
                await turn_done(wire)
            nursery.cancel_scope.cancel()

    checker = checked(wire.sent)
    [done] = checker.of_type("turn.done")
    deltas = [e for e in handed if isinstance(e, ReplyDelta)]
    pieces = [e for e in handed if isinstance(e, AudioData)]
    assert len(deltas) > 1 and len(pieces) > 2
    # The reply's pieces, joined while the socket was stalled: one text.delta, the whole reply.
    assert [f["text"] for f in checker.of_type("text.delta")] == [done["message"]]
    # The audio: the same samples in the same order, in fewer, larger frames; the window's
    # first piece alone, so that playing starts as soon as it would have.
    assert b"".join(checker.binary) == b"".join(e.pcm for e in pieces)
    assert checker.binary[0] == pieces[0].pcm
    assert len(checker.binary) < len(pieces)
    assert max(len(b) for b in checker.binary) <= 64 << 10


def _keep(into: list[TurnEvent], finished: trio.Event) -> Callable[[TurnEvent], Awaitable[None]]:
    async def listen(event: TurnEvent) -> None:
        into.append(event)
        if isinstance(event, TurnFinished):
            finished.set()

    return listen


async def test_a_sentences_audio_leaves_in_as_few_frames_as_the_join_allows(tmp_path: Path) -> None:
    # A socket that writes at once: the pieces of a sentence are synthesized together and
    # queued together, so they leave joined, not one frame each.
    async with open_service(tmp_path) as service:
        minted = await service.platform.mint_key(end_user_id="eu_prompt", ttl_seconds=600, credit_limit=None)
        row = await service.platform.create_conversation(minted.row)
        send, incoming = trio.open_memory_channel[str | bytes](math.inf)
        wire = StalledWire(incoming)
        wire.flowing.set()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(service.serve_socket, wire, row.conversation_id)
            send.send_nowait(
                json.dumps({"type": "auth", "key": minted.token, "session_id": row.conversation_id})
            )
            send.send_nowait(json.dumps({"type": "user_message", "text": "When is breakfast served?"}))
            with trio.fail_after(20):
                await turn_done(wire)
            nursery.cancel_scope.cancel()
    checker = checked(wire.sent)
    [end] = checker.of_type("audio.end")
    first = len(checker.binary[0])
    assert end["bytes"] > 3 * first  # more than a few of espeak's pieces
    # The first piece alone, then the rest of the sentence in frames of up to 64 KiB.
    assert len(checker.binary) == 1 + math.ceil((end["bytes"] - first) / (64 << 10))
