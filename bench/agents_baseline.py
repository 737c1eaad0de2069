"""The concurrent-calls baseline: livekit-agents' process-per-job model, measured here.

    python -m bench.agents_baseline [--quick]

livekit-agents runs every job (one call) in its own process, forked from a forkserver that
preloaded the framework; its worker keeps idle processes warm for the next job. This
installs ``livekit-agents`` into a throwaway venv (``bench/.venv-baseline``, git-ignored;
made on first use), starts N idle job processes the way its worker does (see
``bench/_agents_probe.py``) and records each one's memory: RSS (what ``ps`` shows, the
figure the issue asks for), PSS (shared pages split between the sharers) and USS (pages
only that process holds: what one more job costs). No LiveKit server is needed: an idle job
process waits for the server to assign it a room, and we stop it before that.

Results go to ``bench/results/agents_baseline-<UTC>.json`` and ``agents_baseline-latest.json``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ._common import fmt, machine_info, print_table, say, write_results

HERE = Path(__file__).resolve().parent
VENV = HERE / ".venv-baseline"
PROBE = HERE / "_agents_probe.py"
INSTALL_HINT = f"python -m venv {VENV} && {VENV}/bin/pip install livekit-agents"


def ensure_venv() -> Path | str:
    """The venv's Python, made and filled on first use; or why it could not be."""
    python = VENV / "bin" / "python"
    check = [str(python), "-P", "-c", "import livekit.agents"]
    if python.exists() and subprocess.run(check, capture_output=True, timeout=120).returncode == 0:
        return python
    say(f"  installing livekit-agents into {VENV} (once; about a minute)")
    try:
        subprocess.run(
            [sys.executable, "-m", "venv", str(VENV)], check=True, capture_output=True, timeout=120
        )
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", "livekit-agents"],
            check=True,
            capture_output=True,
            timeout=600,
        )
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as error:
        return f"could not install livekit-agents ({error}); install with: {INSTALL_HINT}"
    return python


def probe(python: Path, idle: int) -> dict[str, Any]:
    # -P: do not put bench/ on sys.path, where bench/livekit.py would shadow the livekit package.
    done = subprocess.run(
        [str(python), "-P", str(PROBE), str(idle)], capture_output=True, text=True, timeout=120, cwd="/tmp"
    )
    if done.returncode != 0:
        raise RuntimeError(f"probe failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(quick: bool) -> dict[str, Any]:
    levels = (1, 4) if quick else (1, 4, 8)
    results: dict[str, Any] = {
        "benchmark": "agents_baseline",
        "profile": "quick" if quick else "full",
        "command": "python -m bench.agents_baseline" + (" --quick" if quick else ""),
        "machine": machine_info(),
        "parameters": {"idle_processes": list(levels)},
        "notes": "ProcPool on a forkserver context preloading livekit.agents.ipc._preload(+_freeze),"
        " JobExecutorType.PROCESS, empty prewarm and entrypoint, no plugins, no LiveKit server;"
        " memory from /proc/<pid>/smaps_rollup 2 s after the processes were ready",
    }
    python = ensure_venv()
    if isinstance(python, str):
        results["skipped"] = python
        say(f"  skipped: {python}")
        return results
    began = time.perf_counter()
    runs = []
    for idle in levels:
        got = probe(python, idle)
        runs.append(got)
        job = got["jobs"][0]
        say(
            f"  {idle} idle job process(es): each RSS {fmt(job['rss_mib'])} MiB, PSS {fmt(job['pss_mib'])} MiB,"
            f" USS {fmt(job['uss_mib'])} MiB; ready in {fmt(got['ready_seconds'])} s"
        )
    results["seconds"] = time.perf_counter() - began
    results["finished_at_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    results["livekit_agents"] = runs[0]["livekit_agents"]
    results["runs"] = runs
    one = runs[0]
    results["idle_job"] = {
        "rss_mib": one["jobs"][0]["rss_mib"],
        "pss_mib": one["jobs"][0]["pss_mib"],
        "uss_mib": one["jobs"][0]["uss_mib"],
        "forkserver_rss_mib": sum(p["rss_mib"] for p in one["forkserver"]),
        "worker_rss_mib": one["worker"]["rss_mib"],
    }
    # What N jobs cost together: worker + forkserver + jobs, in PSS (no page counted twice).
    results["total_pss_mib_by_jobs"] = [
        {
            "jobs": r["idle_processes"],
            "total_pss_mib": r["worker"]["pss_mib"] + sum(p["pss_mib"] for p in r["forkserver"] + r["jobs"]),
            "per_job_uss_mib": sum(p["uss_mib"] for p in r["jobs"]) / len(r["jobs"]),
        }
        for r in runs
    ]
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.agents_baseline", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--quick", action="store_true", help="1 and 4 idle processes (full: 1, 4, 8)")
    args = parser.parse_args(argv)
    results = run(args.quick)
    path = write_results("agents_baseline", results)
    if "skipped" in results:
        print(f"agents_baseline skipped: {results['skipped']}\nresults: {path}")
        return 0
    rows = [
        [
            f"{r['jobs']} idle job(s): worker+forkserver+jobs PSS, MiB",
            fmt(r["total_pss_mib"]),
            f"USS per job {fmt(r['per_job_uss_mib'])} MiB",
        ]
        for r in results["total_pss_mib_by_jobs"]
    ]
    job = results["idle_job"]
    rows.insert(
        0,
        [
            "one idle job process, RSS MiB",
            fmt(job["rss_mib"]),
            f"PSS {fmt(job['pss_mib'])}, USS {fmt(job['uss_mib'])}",
        ],
    )
    print(f"\n{results['command']} (livekit-agents {results['livekit_agents']})")
    print_table(("figure", "value", "note"), rows)
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
