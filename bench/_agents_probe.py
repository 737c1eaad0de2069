"""Run by the livekit-agents venv's Python (not ours): start idle job processes as its worker does.

    bench/.venv-baseline/bin/python bench/_agents_probe.py N

``AgentServer`` keeps ``num_idle_processes`` job processes warm before any job arrives; it
builds them with ``ipc.proc_pool.ProcPool`` on a ``forkserver`` context whose preload list
ends with ``livekit.agents.ipc._preload`` and ``_preload_freeze``. This does the same with
the worker's default timeouts and memory limits, no plugins and an empty ``prewarm``, waits
until the N processes are initialised (idle, waiting for a job), then prints one JSON line:
the resident (RSS), proportional (PSS) and private (USS) memory of each job process, of the
forkserver and of this (the worker's) process. No LiveKit server is involved: a job process
is idle until the server assigns it a room, and the pool never contacts the server.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import os
import sys
import time


def prewarm(proc) -> None:
    return None


async def entrypoint(ctx) -> None:
    return None


def memory_of(pid: int) -> dict[str, float]:
    """RSS, PSS and USS of ``pid`` in MiB, from /proc/<pid>/smaps_rollup."""
    fields: dict[str, int] = {}
    with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as rollup:
        for line in rollup:
            parts = line.split()
            if len(parts) >= 3 and parts[-1] == "kB":
                fields[parts[0].rstrip(":")] = int(parts[1])
    return {
        "rss_mib": fields.get("Rss", 0) / 1024,
        "pss_mib": fields.get("Pss", 0) / 1024,
        "uss_mib": (fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0)) / 1024,
    }


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


async def _main(idle: int) -> dict:
    from importlib import metadata

    from livekit.agents import ipc
    from livekit.agents.job import JobExecutorType

    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["livekit.agents.ipc._preload", "livekit.agents.ipc._preload_freeze"])
    began = time.perf_counter()
    pool = ipc.proc_pool.ProcPool(
        initialize_process_fnc=prewarm,
        job_entrypoint_fnc=entrypoint,
        session_end_fnc=None,
        simulation_end_fnc=None,
        num_idle_processes=idle,
        initialize_timeout=10.0,
        close_timeout=10.0,
        session_end_timeout=10.0,
        inference_executor=None,
        job_executor_type=JobExecutorType.PROCESS,
        mp_ctx=ctx,
        memory_warn_mb=1000,
        memory_limit_mb=0,
        http_proxy=None,
        loop=asyncio.get_running_loop(),
    )
    await pool.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        started = [p for p in pool.processes if p.started and p.pid]
        if len(started) >= idle:
            break
        await asyncio.sleep(0.1)
    ready_s = time.perf_counter() - began
    await asyncio.sleep(2.0)  # let them settle into their idle wait
    job_pids = sorted(p.pid for p in pool.processes if p.pid)
    me = os.getpid()
    others = sorted({_parent(pid) for pid in job_pids} - {me})  # the forkserver they were forked from
    result = {
        "livekit_agents": metadata.version("livekit-agents"),
        "python": sys.version.split()[0],
        "idle_processes": idle,
        "ready_seconds": ready_s,
        "jobs": [{"pid": pid, **memory_of(pid)} for pid in job_pids],
        "forkserver": [{"pid": pid, **memory_of(pid)} for pid in others],
        "worker": {"pid": me, **memory_of(me)},
    }
    await pool.aclose()
    return result


if __name__ == "__main__":
    print(json.dumps(asyncio.run(_main(int(sys.argv[1]) if len(sys.argv) > 1 else 1))))
