"""A loopback port in the test's own network that leads to an address inside the namespace.

A host library such as ``runner.host`` opens its own connections (httpx); it reaches a runner
listening inside the test's namespace through one of these, as it would through a load
balancer. Each connection is opened inside the namespace and its bytes passed both ways.
"""

from __future__ import annotations

import trio
from lk_harness import LiveKitEnv


class Relay:
    def __init__(self, livekit: LiveKitEnv, host: str, port: int) -> None:
        self._livekit = livekit
        self._target = (host, port)
        self.url = ""

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        task_status.started()
        await trio.serve_listeners(self._pass, listeners)

    async def _pass(self, outside: trio.SocketStream) -> None:
        try:
            inside = await self._livekit.open_tcp_stream(*self._target)
        except OSError:
            await outside.aclose()  # the runner is gone: refuse, as a dead address does
            return
        async with outside, inside, trio.open_nursery() as nursery:

            async def pump(source: trio.SocketStream, sink: trio.SocketStream) -> None:
                try:
                    while data := await source.receive_some(65536):
                        await sink.send_all(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass
                nursery.cancel_scope.cancel()

            nursery.start_soon(pump, outside, inside)
            nursery.start_soon(pump, inside, outside)
