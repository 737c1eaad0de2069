"""The benchmark harness: every scenario, each figure beside its baseline, one report.

    python -m bench [--quick] [--only NAMES]

Runs each per-area benchmark (``python -m bench.<name>``) as its own process, in order, with
a progress line per scenario on stderr; reads the results file each one wrote; prints a
summary table (figure, value, baseline, ratio); writes ``bench/results/bench-<UTC>.json``
(+ ``bench-latest.json``) and a Markdown report with PNG plots,
``bench/results/report-<UTC>.md`` (+ ``report-latest.md``). ``--quick`` takes under two
minutes on a 2-core machine. Every scenario is bounded in count and in time; one that
overruns its time limit is stopped (its own process group, which this started).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from ._common import RESULTS_DIR, machine_info, print_table, utc_stamp

ROOT = Path(__file__).resolve().parent.parent


@attrs.frozen(kw_only=True)
class Scenario:
    name: str
    what: str
    quick_s: float  # the expected duration, for the progress bar
    full_s: float
    limit_s: float  # stopped after this, either mode
    full_only: str = ""  # why quick mode skips it, if it does


SCENARIOS = (
    Scenario(
        name="journal",
        what="journal appends vs raw sqlite3; events stream over HTTP",
        quick_s=25,
        full_s=110,
        limit_s=400,
    ),
    Scenario(
        name="journal_instructions",
        what="instructions per appended record, journal vs raw sqlite3, by object (callgrind)",
        quick_s=0,
        full_s=300,
        limit_s=1800,
        full_only="runs under valgrind for several minutes; full mode only",
    ),
    Scenario(
        name="redis_stream",
        what="events stream baseline: Redis Streams XADD/XREAD",
        quick_s=9,
        full_s=30,
        limit_s=200,
    ),
    Scenario(
        name="calls",
        what="concurrent calls: start latency, memory per call, most calls held",
        quick_s=14,
        full_s=90,
        limit_s=900,
    ),
    Scenario(
        name="calls_instructions",
        what="instructions per call start at 1 call held and at 1,000 (callgrind)",
        quick_s=0,
        full_s=600,
        limit_s=1800,
        full_only="runs under valgrind for about ten minutes; full mode only",
    ),
    Scenario(
        name="agents_baseline",
        what="livekit-agents idle job processes (memory)",
        quick_s=10,
        full_s=20,
        limit_s=900,
    ),
    Scenario(
        name="messages",
        what="host messages and agent-to-host records at 1, 100 and the most calls",
        quick_s=19,
        full_s=200,
        limit_s=600,
    ),
    Scenario(
        name="turns", what="turn engine overhead vs a bare provider loop", quick_s=3, full_s=30, limit_s=300
    ),
    Scenario(
        name="websocket",
        what="agent sockets, 1 to 500, against the platform and the runtime in-process",
        quick_s=60,
        full_s=480,
        limit_s=1500,
    ),
    Scenario(
        name="host",
        what="runner.host: placements across 4 runners; follower catch-up vs raw httpx",
        quick_s=45,
        full_s=150,
        limit_s=600,
    ),
    Scenario(
        name="telemetry",
        what="metrics and tracing on vs off: a turn, a journal append",
        quick_s=40,
        full_s=150,
        limit_s=600,
    ),
    Scenario(
        name="livekit",
        what="calls through a real LiveKit server",
        quick_s=90,
        full_s=250,
        limit_s=400,
        full_only="needs a LiveKit server in a private network namespace and several minutes; full mode only",
    ),
    Scenario(
        name="livekit_path",
        what="LiveKit's own one-way audio latency, knob by knob (AudioSource to AudioStream)",
        quick_s=300,
        full_s=660,
        limit_s=1200,
        full_only="needs a LiveKit server in a private network namespace and several minutes; full mode only",
    ),
    Scenario(
        name="worker",
        what="worker mode under LiveKit's dispatch vs livekit-agents' own worker",
        quick_s=180,
        full_s=420,
        limit_s=900,
        full_only="needs a LiveKit server in a private network namespace and several minutes; full mode only",
    ),
    Scenario(
        name="fuzz",
        what="generated requests and frames against real runners: examples, violations (0)",
        quick_s=140,
        full_s=700,
        limit_s=1500,
    ),
    Scenario(
        name="speech",
        what="embedded speech: WER old vs new recognizers, Whisper decode cost, TTS first audio, VAD cost",
        quick_s=120,
        full_s=330,
        limit_s=1200,
    ),
    Scenario(
        name="livekit_voice",
        what="spoken turns through LiveKit, old voice vs new; concurrent spoken calls",
        quick_s=300,
        full_s=1200,
        limit_s=1500,
        full_only="needs a LiveKit server in a private network namespace and many minutes; full mode only",
    ),
    Scenario(
        name="soak",
        what="mixed load, a kill -9 every 20 s, RSS and WAL over time (10 minutes: python -m bench.soak)",
        quick_s=40,
        full_s=130,
        limit_s=400,
    ),
)
NAMES = tuple(s.name for s in SCENARIOS)
MESSAGES_MOST_CALLS_CAP = {True: 1_000, False: 10_000}  # by --quick


class Progress:
    """One updating line on stderr: a bar against the expected time, and the latest line it printed."""

    def __init__(self, label: str, expected_s: float) -> None:
        self.label = label
        self.expected_s = expected_s
        self.began = time.perf_counter()
        self.last = ""
        self.tty = sys.stderr.isatty()
        self._printed = 0.0

    def update(self, line: str | None = None) -> None:
        if line:
            self.last = line.strip()
        elapsed = time.perf_counter() - self.began
        if not self.tty and line is None and elapsed - self._printed < 10:
            return  # in a log, a line per progress message and one every 10 s
        self._printed = elapsed
        done = min(1.0, elapsed / self.expected_s) if self.expected_s else 1.0
        bar = "#" * int(done * 20) + "." * (20 - int(done * 20))
        text = f"{self.label:<16} [{bar}] {elapsed:5.0f} s / ~{self.expected_s:.0f} s  {self.last[:60]}"
        if self.tty:
            sys.stderr.write("\r\x1b[2K" + text)
        else:
            sys.stderr.write(text + "\n")
        sys.stderr.flush()

    def finish(self, status: str) -> None:
        elapsed = time.perf_counter() - self.began
        text = f"{self.label:<16} {status} in {elapsed:.0f} s"
        sys.stderr.write(("\r\x1b[2K" if self.tty else "") + text + "\n")
        sys.stderr.flush()


def run_scenario(scenario: Scenario, *, quick: bool, extra: Sequence[str], log_dir: Path) -> dict[str, Any]:
    """Run one scenario's script in its own process; return its status and results."""
    if quick and scenario.full_only:
        return {"name": scenario.name, "status": "skipped", "reason": scenario.full_only}
    command = [sys.executable, "-m", f"bench.{scenario.name}", *(["--quick"] if quick else []), *extra]
    progress = Progress(scenario.name, scenario.quick_s if quick else scenario.full_s)
    began_wall = time.time()
    log = log_dir / f"{scenario.name}.log"
    with open(log, "w", encoding="utf-8") as out:
        process = subprocess.Popen(
            command,
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        tail: list[str] = []

        def read_stderr() -> None:
            assert process.stderr is not None
            for line in process.stderr:
                tail.append(line)
                del tail[:-40]
                progress.update(line)

        reader = threading.Thread(target=read_stderr, daemon=True)
        reader.start()
        timed_out = False
        while process.poll() is None:
            if time.perf_counter() - progress.began > scenario.limit_s:
                timed_out = True
                os.killpg(process.pid, signal.SIGTERM)  # the group this started, by its leader's pid
                try:
                    process.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
                break
            progress.update()
            time.sleep(0.25)
        reader.join(timeout=5)
    seconds = time.perf_counter() - progress.began
    result: dict[str, Any] = {
        "name": scenario.name,
        "command": "python -m " + " ".join(command[2:]),
        "seconds": seconds,
        "log": str(log.relative_to(ROOT)),
    }
    path = RESULTS_DIR / f"{scenario.name}-latest.json"
    fresh = path.exists() and path.stat().st_mtime >= began_wall - 1
    if timed_out:
        result.update(status="failed", reason=f"stopped after its {scenario.limit_s:.0f} s limit")
    elif process.returncode != 0 or not fresh:
        result.update(
            status="failed", reason=f"exit {process.returncode}: " + "".join(tail[-6:]).strip()[-800:]
        )
    else:
        data = json.loads(path.read_text(encoding="utf-8"))
        if "skipped" in data:
            result.update(status="skipped", reason=data["skipped"])
        else:
            result["status"] = "ok"
        result["results"] = data
    progress.finish(result["status"] + (f" ({result['reason'][:100]})" if "reason" in result else ""))
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the short profiles: under 2 minutes on 2 cores")
    parser.add_argument("--only", default="", help=f"comma-separated scenarios, of: {', '.join(NAMES)}")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots (no matplotlib needed)")
    args = parser.parse_args(argv)
    only = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = sorted(set(only) - set(NAMES))
    if unknown:
        parser.error(f"unknown scenario(s) {', '.join(unknown)}; known: {', '.join(NAMES)}")
    chosen = [s for s in SCENARIOS if not only or s.name in only]
    stamp = utc_stamp()
    command = (
        "python -m bench" + (" --quick" if args.quick else "") + (f" --only {args.only}" if only else "")
    )
    log_dir = RESULTS_DIR / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    machine = machine_info()
    sys.stderr.write(
        f"{command}: {len(chosen)} scenario(s) on {machine['cores']} cores, {machine['cpu']},"
        f" Python {machine['python']}\n"
    )
    began = time.perf_counter()
    runs: dict[str, dict[str, Any]] = {}
    for scenario in chosen:
        extra: list[str] = []
        if scenario.name == "messages" and runs.get("calls", {}).get("status") == "ok":
            # The most calls ``calls`` held, capped: starting 50,000 calls again would take minutes.
            most = runs["calls"]["results"]["held"]["held_max"]
            extra = ["--most-calls", str(min(most, MESSAGES_MOST_CALLS_CAP[args.quick]))]
        if scenario.name == "soak" and not args.quick:
            extra = ["--minutes", "2", "--kill-every-s", "20"]  # the 10-minute soak is its own command
        runs[scenario.name] = run_scenario(scenario, quick=args.quick, extra=extra, log_dir=log_dir)

    from . import report

    summary = report.summarize(runs)
    combined = {
        "benchmark": "bench",
        "command": command,
        "profile": "quick" if args.quick else "full",
        "finished_at_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "seconds": time.perf_counter() - began,
        "machine": machine,
        "summary": summary,
        "scenarios": runs,
    }
    text = json.dumps(combined, indent=2) + "\n"
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    json_path = RESULTS_DIR / f"bench-{stamp}.json"
    json_path.write_text(text, encoding="utf-8")
    (RESULTS_DIR / "bench-latest.json").write_text(text, encoding="utf-8")
    report_path = report.write_report(combined, stamp, plots=not args.no_plots)

    print()
    print(
        f"{command} ({combined['profile']}, {combined['seconds']:.0f} s; {machine['cores']} cores,"
        f" {machine['cpu']}, Python {machine['python']})"
    )
    print_table(("scenario", "figure", "value", "baseline", "ratio"), report.table_rows(summary))
    print()
    print_table(("figure", "before", "goal", "this run", "verdict"), report.goal_rows(summary))
    for line in report.status_lines(runs):
        print(line)
    for line in summary["scaling"]["verdicts"]:
        print("scaling: " + line)
    print(f"results: {json_path}")
    print(f"report:  {report_path}")
    return 0 if all(r["status"] != "failed" for r in runs.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
