"""Run by the livekit-agents venv's Python (not ours): livekit-agents' own worker, for bench.worker.

    bench/.venv-baseline/bin/python -P bench/_agents_worker.py AGENT_NAME

An ``AgentServer`` registered under AGENT_NAME (LIVEKIT_URL / LIVEKIT_API_KEY /
LIVEKIT_API_SECRET from the environment) whose entrypoint only joins the room
(``ctx.connect()``): the dispatch path and the job process, nothing else. It runs with its
production defaults (a process per job, forked from a warm pool of one idle process per
core), except that its load is reported as zero: on a shared 2-core machine its default
CPU-based load would mark it full and refuse jobs for reasons that are not its own.
"""

from __future__ import annotations

import asyncio
import sys


async def entrypoint(ctx) -> None:  # a job process unpickles it by name: module level
    await ctx.connect()


def no_load() -> float:
    return 0.0


def main() -> None:
    from livekit.agents import AgentServer

    server = AgentServer(load_fnc=no_load, port=0)
    server.rtc_session(entrypoint, agent_name=sys.argv[1])
    asyncio.run(server.run(devmode=False))


if __name__ == "__main__":
    main()
