"""Worker-mode benchmark: LiveKit's agent dispatch to our runner, beside livekit-agents' own worker.

    python -m bench.worker [--quick]        (root: it makes a network namespace)

A real ``livekit-server`` (1.13.5, dev mode) runs in a private network namespace
(tests/livekit/lk_harness.py). Every figure is measured against it, in this one run:

1. **Dispatch to first audio**, with 1 and with 2 ``runner start`` workers under one agent
   name. For each sample a caller joins a new room and records whichever agent joins. It
   then calls ``AgentDispatchService.create_dispatch``. The figure runs from just before that
   call to the first loud 20 ms frame of the agent's greeting reaching the caller (the
   offline test agent: espeak-ng says "Hello there.").
2. **Dispatch to joined**, the same samples read from the server's own log: from the
   ``CreateDispatch`` API call to the agent participant becoming active in the room. The
   same figure is taken for livekit-agents' worker (``AgentServer``, installed into
   ``bench/.venv-baseline`` as ``bench.agents_baseline`` does; see ``bench/_agents_worker.py``),
   whose entrypoint only joins the room.
3. **Jobs per second** one worker sustains: a burst of dispatches fired back to back,
   counted until the last agent is active in its room. Taken for ours and for livekit-agents'.
4. **Memory per job**, while the burst's calls are up: the growth of the worker's memory,
   with all its descendants (a livekit-agents job is a process forked from its forkserver),
   divided by the calls. It is given as RSS (what ``ps`` shows, shared pages counted in
   every process), PSS (shared pages split between their sharers) and USS (private pages:
   what one more job really costs).

Goal (issue 17): our dispatch-to-joined latency no worse than livekit-agents', and our
memory per job at least 100x smaller. Results go to ``bench/results/worker-<UTC>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import attrs
import trio

from ._common import Budget, fmt, machine_info, print_table, ratio, say, summarize, write_results
from .agents_baseline import ensure_venv
from .livekit import livekit_env

_LK_TESTS = Path(__file__).resolve().parents[1] / "tests" / "livekit"
if str(_LK_TESTS) not in sys.path:
    sys.path.insert(0, str(_LK_TESTS))

from lk_harness import LiveKitEnv, Peer  # noqa: E402 - after the sys.path entry that makes tests/livekit's modules importable
from lk_runner import Host, agent_spec, open_runner  # noqa: E402 - after the sys.path entry that makes tests/livekit's modules importable

AGENTS_WORKER = Path(__file__).resolve().with_name("_agents_worker.py")
LOG_WAIT_S = 30.0


@attrs.frozen(kw_only=True)
class Profile:
    name: str
    samples: int  # dispatch latency samples per configuration
    burst: int  # dispatches fired back to back, for jobs per second and memory
    seconds: float  # the whole run's budget


QUICK = Profile(name="quick", samples=4, burst=6, seconds=300.0)
FULL = Profile(name="full", samples=15, burst=12, seconds=900.0)


# -- The server's own log: when it took each step -------------------------------------------


def _at(line: str) -> float:
    return datetime.fromisoformat(line.split("\t", 1)[0].replace("Z", "+00:00")).timestamp()


def _fields(line: str) -> dict[str, Any]:
    try:
        return dict(json.loads(line[line.index("\t{") + 1 :]))
    except ValueError:
        return {}


def server_steps(log: Path, room: str) -> dict[str, float]:
    """When the server took the dispatch for ``room``, assigned it, and saw its agent active."""
    steps: dict[str, float] = {}
    for line in log.read_text(errors="replace").splitlines():
        if f'"room": "{room}"' not in line:
            continue
        if "AgentDispatchService.CreateDispatch" in line:
            steps.setdefault("dispatched", _at(line))
        elif "assigned job to worker" in line:
            steps.setdefault("assigned", _at(line))
        elif "participant active" in line and str(_fields(line).get("participant", "")).startswith("agent-"):
            steps.setdefault("joined", _at(line))
    return steps


async def wait_steps(log: Path, room: str) -> dict[str, float]:
    with trio.move_on_after(LOG_WAIT_S):
        while True:
            steps = await trio.to_thread.run_sync(server_steps, log, room)
            if "joined" in steps and "dispatched" in steps:
                return steps
            await trio.sleep(0.1)
    raise RuntimeError(f"no agent joined {room} within {LOG_WAIT_S:g} s")


def _registered(log: Path, agent_name: str) -> bool:
    return any(
        "worker registered" in line and f'"agentName": "{agent_name}"' in line
        for line in log.read_text(errors="replace").splitlines()
    )


async def wait_registered(log: Path, agent_name: str) -> None:
    for _ in range(int(LOG_WAIT_S * 2 / 0.2)):
        if await trio.to_thread.run_sync(_registered, log, agent_name):
            return
        await trio.sleep(0.2)
    raise RuntimeError(f"livekit-agents' worker did not register within {LOG_WAIT_S * 2:g} s")


# -- Memory -------------------------------------------------------------------------------------


def memory_mib(pid: int) -> dict[str, float]:
    """RSS, PSS and USS of ``pid`` in MiB (0 once it is gone), from /proc/<pid>/smaps_rollup."""
    fields: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as rollup:
            for line in rollup:
                parts = line.split()
                if len(parts) >= 3 and parts[-1] == "kB":
                    fields[parts[0].rstrip(":")] = int(parts[1])
    except OSError:
        pass
    return {
        "rss": fields.get("Rss", 0) / 1024,
        "pss": fields.get("Pss", 0) / 1024,
        "uss": (fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0)) / 1024,
    }


def family(pid: int) -> list[int]:
    """``pid`` and all its descendants."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", encoding="ascii") as stat:
                    parents[int(entry)] = int(stat.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    found, frontier = [pid], [pid]
    while frontier:
        frontier = [child for child, parent in parents.items() if parent in frontier]
        found.extend(frontier)
    return found


def family_memory_mib(pid: int) -> dict[str, float]:
    """The sums over ``pid`` and its descendants (RSS counts shared pages once per process)."""
    total = {"rss": 0.0, "pss": 0.0, "uss": 0.0}
    for member in family(pid):
        for key, value in memory_mib(member).items():
            total[key] += value
    return total


# -- Samples ------------------------------------------------------------------------------------


async def sample(env: LiveKitEnv, control: Peer, agent_name: str, *, audio: bool) -> dict[str, float]:
    """One dispatched room with a caller in it: the latencies, in ms."""
    room = env.unique_room("bench")
    async with env.peer("caller", room) as caller:
        async with trio.open_nursery() as nursery:
            if audio:
                nursery.start_soon(lambda: caller.request("record", identity="*agent", within=30, timeout=35))
            sent_at = time.monotonic()
            await caller.request("create_dispatch", agent_name=agent_name, room=room)
        got: dict[str, float] = {}
        if audio:
            speech = await caller.request("wait_speech", within=20, timeout=25)
            got["dispatch_to_first_audio_ms"] = (speech["first_loud_at"] - sent_at) * 1000
        steps = await wait_steps(env.server.log_path, room)
        got["dispatch_to_joined_ms"] = (steps["joined"] - steps["dispatched"]) * 1000
        got["dispatch_to_assigned_ms"] = (steps.get("assigned", steps["joined"]) - steps["dispatched"]) * 1000
    # From another room's peer: a peer in the deleted room would be cut off mid-request.
    await control.request("delete_room", room=room)
    return got


async def samples(
    env: LiveKitEnv, control: Peer, agent_name: str, count: int, budget: Budget, *, audio: bool
) -> dict[str, list[float]]:
    await sample(env, control, agent_name, audio=audio)  # warm-up, not counted
    out: dict[str, list[float]] = {}
    for index in range(count):
        if budget.expired():
            break
        say(f"    sample {index + 1}/{count}")
        for key, value in (await sample(env, control, agent_name, audio=audio)).items():
            out.setdefault(key, []).append(value)
    return out


async def burst(env: LiveKitEnv, control: Peer, agent_name: str, count: int, pid: int) -> dict[str, Any]:
    """``count`` dispatches back to back: jobs per second until the last agent is in its room,
    and the worker's private memory per job while they are all up."""
    idle = await trio.to_thread.run_sync(family_memory_mib, pid)
    rooms = [env.unique_room("burst") for _ in range(count)]
    for room in rooms:
        await control.request("create_dispatch", agent_name=agent_name, room=room)
    steps = [await wait_steps(env.server.log_path, room) for room in rooms]
    await trio.sleep(2.0)  # let each call settle (greeting said, buffers allocated)
    loaded = await trio.to_thread.run_sync(family_memory_mib, pid)
    first = min(s["dispatched"] for s in steps)
    last = max(s["joined"] for s in steps)
    for room in rooms:
        await control.request("delete_room", room=room)
    return {
        "jobs": count,
        "seconds": last - first,
        "jobs_per_second": count / (last - first),
        "dispatch_to_joined_ms": summarize([(s["joined"] - s["dispatched"]) * 1000 for s in steps]),
        "idle_mib": idle,
        "loaded_mib": loaded,
        "rss_per_job_mib": (loaded["rss"] - idle["rss"]) / count,
        "pss_per_job_mib": (loaded["pss"] - idle["pss"]) / count,
        "uss_per_job_mib": (loaded["uss"] - idle["uss"]) / count,
        "processes_while_loaded": len(await trio.to_thread.run_sync(family, pid)),
    }


# -- The workers --------------------------------------------------------------------------------


def _ours(env: LiveKitEnv, workdir: Path, agent_name: str, index: int, max_sessions: int) -> Any:
    return open_runner(
        env,
        workdir / f"worker-{agent_name}-{index}.db",
        "--agent-name",
        agent_name,
        "--max-sessions",
        str(max_sessions),
        "--address",
        "127.0.0.1:0",
        command="start",
        agent=agent_spec("agent"),
    )


@asynccontextmanager
async def agents_worker(env: LiveKitEnv, python: Path, agent_name: str, workdir: Path) -> AsyncIterator[int]:
    """livekit-agents' worker, registered; yields its pid."""
    log_path = Path(os.environ.get("BENCH_AGENTS_LOG", workdir / f"agents-{agent_name}.log"))
    log = await trio.to_thread.run_sync(log_path.open, "wb")
    try:
        process = await env.open_process(
            [str(python), "-P", str(AGENTS_WORKER), agent_name], stdout=log, stderr=log, cwd="/tmp"
        )
    finally:
        log.close()
    try:
        await wait_registered(env.server.log_path, agent_name)
        yield process.pid
    finally:
        process.terminate()
        with trio.move_on_after(15):
            await process.wait()
        if process.returncode is None:
            process.kill()
            await process.wait()


def _rss_mib(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


async def run(profile: Profile, only: str | None = None) -> dict[str, Any]:
    python = ensure_venv()
    budget = Budget(profile.samples * 4, profile.seconds)
    result: dict[str, Any] = {
        "benchmark": "worker",
        "profile": profile.name,
        "command": "python -m bench.worker" + (" --quick" if profile is QUICK else ""),
        "machine": machine_info(),
        "parameters": attrs.asdict(profile),
    }
    async with (
        livekit_env("bench-worker-") as (workdir, env),
        env.peer("control", env.unique_room("control")) as control,
    ):
        if only != "agents":
            await _run_ours(env, control, workdir, profile, budget, result)
        if only == "ours":
            pass
        elif isinstance(python, str):
            result["livekit_agents_skipped"] = python
        else:
            await _run_agents(env, control, python, workdir, profile, budget, result)
    result["seconds"] = time.perf_counter() - budget.started
    result["finished_at_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return result


async def _run_ours(
    env: LiveKitEnv, control: Peer, workdir: Path, profile: Profile, budget: Budget, result: dict[str, Any]
) -> None:
    name = f"ours-{uuid.uuid4().hex[:6]}"
    say("  ours, one worker")
    async with _ours(env, workdir, name, 1, profile.burst) as host:
        result["ours_1"] = _summaries(await samples(env, control, name, profile.samples, budget, audio=True))
        say("  ours, a burst on one worker")
        result["ours_burst"] = await burst(env, control, name, profile.burst, _pid(host))
    name = f"ours2-{uuid.uuid4().hex[:6]}"
    say("  ours, two workers")
    async with AsyncExitStack() as stack:
        for index in (1, 2):
            await stack.enter_async_context(_ours(env, workdir, name, index, profile.burst))
        result["ours_2"] = _summaries(await samples(env, control, name, profile.samples, budget, audio=True))


async def _run_agents(
    env: LiveKitEnv,
    control: Peer,
    python: Path,
    workdir: Path,
    profile: Profile,
    budget: Budget,
    result: dict[str, Any],
) -> None:
    name = f"agents-{uuid.uuid4().hex[:6]}"
    say("  livekit-agents, one worker")
    async with agents_worker(env, python, name, workdir) as pid:
        result["agents_1"] = _summaries(
            await samples(env, control, name, profile.samples, budget, audio=False)
        )
        say("  livekit-agents, a burst on one worker")
        result["agents_burst"] = await burst(env, control, name, profile.burst, pid)
    result["livekit_agents"] = _agents_version(python)


def _pid(host: Host) -> int:
    return int(host.runner.process.pid)


def _summaries(values: dict[str, list[float]]) -> dict[str, Any]:
    return {key: summarize(samples) for key, samples in values.items()} | {
        "samples_ms": {key: [round(v, 1) for v in samples] for key, samples in values.items()}
    }


def _agents_version(python: Path) -> str:
    import subprocess

    done = subprocess.run(
        [str(python), "-P", "-c", "import livekit.agents as a; print(a.__version__)"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/tmp",
    )
    return done.stdout.strip()


def _p(result: dict[str, Any], config: str, key: str, q: str) -> float | None:
    value = result.get(config, {}).get(key, {}).get(q)
    return float(value) if value is not None else None


def report(result: dict[str, Any]) -> None:
    rows: list[Sequence[Any]] = []
    for key, label in (
        ("dispatch_to_first_audio_ms", "dispatch -> first audio, ms"),
        ("dispatch_to_joined_ms", "dispatch -> agent joined, ms"),
        ("dispatch_to_assigned_ms", "dispatch -> job assigned, ms"),
    ):
        for q in ("p50", "p99"):
            rows.append(
                [
                    f"{label} {q}",
                    fmt(_p(result, "ours_1", key, q)),
                    fmt(_p(result, "ours_2", key, q)),
                    fmt(_p(result, "agents_1", key, q))
                    if key != "dispatch_to_first_audio_ms"
                    else "(no audio)",
                    fmt(ratio(_p(result, "ours_1", key, q), _p(result, "agents_1", key, q))),
                ]
            )
    ours, theirs = result.get("ours_burst", {}), result.get("agents_burst", {})
    rows.append(
        [
            f"jobs/s, a burst of {ours.get('jobs')}",
            fmt(ours.get("jobs_per_second")),
            "",
            fmt(theirs.get("jobs_per_second")),
            fmt(ratio(ours.get("jobs_per_second"), theirs.get("jobs_per_second"))),
        ]
    )
    for key, label in (
        ("rss_per_job_mib", "memory per job, RSS (what ps adds up), MiB"),
        ("pss_per_job_mib", "memory per job, PSS (shared pages split), MiB"),
        ("uss_per_job_mib", "memory per job, USS (private pages), MiB"),
    ):
        rows.append(
            [
                label,
                fmt(ours.get(key)),
                "",
                fmt(theirs.get(key)),
                fmt(ratio(ours.get(key), theirs.get(key))),
            ]
        )
    print(f"\n{result['command']} (livekit-agents {result.get('livekit_agents', 'skipped')})")
    print_table(("figure", "ours, 1 worker", "ours, 2 workers", "livekit-agents", "ours / theirs"), rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.worker", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 samples and a burst of 6 per worker")
    parser.add_argument("--only", choices=("ours", "agents"), help="measure one side only (no comparison)")
    args = parser.parse_args(argv)
    result = trio.run(run, QUICK if args.quick else FULL, args.only)
    path = write_results("worker", result)
    report(result)
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
