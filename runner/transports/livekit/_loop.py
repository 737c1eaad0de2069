"""One asyncio event loop in a thread of its own, driven from Trio: each LiveKit session's.

The ``livekit`` SDK builds futures and queues on whatever loop is current and its native
library wakes that loop with ``call_soon_threadsafe``, so it gets exactly the world it was
written for, and Trio keeps a single scheduler. Every call from Trio into the loop is bounded
by a timeout; everything the loop learns reaches Trio through ``TrioToken.run_sync_soon``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import trio

from ...sessions import TransportError

log = logging.getLogger("runner.transports.livekit")

CALL_TIMEOUT_S = 5.0  # a cross-thread call that should be quick (a send, a clear)
THREAD_EXIT_TIMEOUT_S = 3.0

T = TypeVar("T")


class LoopThread:
    """An asyncio event loop running in its own thread, for one session."""

    def __init__(self, name: str, token: trio.lowlevel.TrioToken) -> None:
        self.loop = asyncio.new_event_loop()
        self._token = token
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._exited = trio.Event()
        self._stopping = False

    def start(self) -> None:
        self._thread.start()

    def _main(self) -> None:
        loop = self.loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
            # Whatever is left (an SDK task that outlived its room) gets a bounded goodbye.
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.wait(pending, timeout=1.0))
            loop.run_until_complete(loop.shutdown_asyncgens())
        except Exception:
            log.exception("the LiveKit event loop failed")
        finally:
            asyncio.set_event_loop(None)
            loop.close()
            self.to_trio(self._exited.set)

    def to_trio(self, fn: Callable[..., object], *args: Any) -> bool:
        """Run ``fn(*args)`` soon in the Trio thread; False once Trio is gone."""

        def guarded() -> None:
            try:
                fn(*args)
            except Exception:
                log.exception("LiveKit callback %r failed", fn)

        try:
            self._token.run_sync_soon(guarded)
        except trio.RunFinishedError:
            return False
        return True

    def call_soon(self, fn: Callable[..., object], *args: Any) -> bool:
        """Run ``fn(*args)`` soon on the loop (from any thread); False once it is closed."""
        try:
            self.loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:
            return False
        return True

    async def run(self, make: Callable[[], Coroutine[Any, Any, T]], *, timeout_s: float, what: str) -> T:
        """Run the coroutine ``make()`` on the loop; wait for it, at most ``timeout_s``.

        Raises:
            TransportError: The coroutine failed, the loop is gone, or it did not finish in
                time (it is then cancelled).
        """
        if self._stopping:
            raise TransportError(f"could not {what}: the LiveKit session is closed")
        coro = make()
        try:
            future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        except RuntimeError:
            coro.close()
            raise TransportError(f"could not {what}: the LiveKit session is closed") from None
        done = trio.Event()
        future.add_done_callback(lambda _: self.to_trio(done.set))
        try:
            with trio.fail_after(timeout_s):
                await done.wait()
        except trio.TooSlowError:
            future.cancel()
            raise TransportError(f"could not {what} within {timeout_s:g} s") from None
        except BaseException:
            future.cancel()
            raise
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            raise TransportError(f"could not {what}: the LiveKit session is closed") from None
        except TransportError:
            raise
        except Exception as exc:
            raise TransportError(f"could not {what}: {type(exc).__name__}: {exc}") from exc

    async def aclose(self) -> None:
        """Stop the loop and wait for its thread to end (bounded)."""
        self._stopping = True
        if not self.call_soon(self.loop.stop):
            return
        with trio.move_on_after(THREAD_EXIT_TIMEOUT_S):
            await self._exited.wait()
        if self._exited.is_set():
            self._thread.join(timeout=1.0)  # it is past its last line
        else:
            log.error(
                "the LiveKit thread %s did not stop within %g s", self._thread.name, THREAD_EXIT_TIMEOUT_S
            )
