"""The harness's summary: figure beside baseline for every scenario, scaling verdicts, plots, Markdown.

Everything here reads the results the scenarios wrote; nothing is measured here.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from ._common import RESULTS_DIR, fmt, ratio

FLAT_WITHIN = (
    1.5  # a figure "stays flat" when at the most calls it is no more than 1.5x worse than at the least
)


def _ok(runs: Mapping[str, Any], name: str) -> dict[str, Any] | None:
    run = runs.get(name)
    return run["results"] if run and run.get("status") == "ok" else None


def _row(
    scenario: str,
    figure: str,
    value: float | None,
    baseline: float | None,
    baseline_name: str,
    unit: str,
    better: str,
) -> dict[str, Any]:
    return {
        "scenario": scenario,
        "figure": figure,
        "unit": unit,
        "value": value,
        "baseline": baseline,
        "baseline_name": baseline_name,
        "ratio": ratio(value, baseline),
        "better": better,
    }


def _journal_rows(runs: Mapping[str, Any]) -> list[dict[str, Any]]:
    journal = _ok(runs, "journal")
    if not journal:
        return []
    rows = []
    for r in journal["append"]["by_producers"]:
        row = _row(
            "journal",
            f"append, {r['producers']} producers",
            r["journal_records_per_s"],
            r["raw_records_per_s"],
            f"raw sqlite3, batch {max(1, round(r['group_size']))}, WAL + synchronous=FULL; ratio: median of"
            " paired trials",
            "records/s",
            "higher",
        )
        # Each journal trial is paired with the raw trial run right after it (the disk's speed drifts):
        # the ratio is the median of those pairs, as bench.journal prints it, not of the two medians.
        row["ratio"] = r["ratio"]
        rows.append(row)
    return rows


def _stream_rows(runs: Mapping[str, Any]) -> list[dict[str, Any]]:
    journal, redis = _ok(runs, "journal"), _ok(runs, "redis_stream")
    if not journal:
        return []
    rows = []
    redis_stream = {r["followers"]: r for r in redis["stream"]} if redis else {}
    redis_latency = {r["followers"]: r for r in redis["latency"]} if redis else {}
    for r in journal["stream"]:
        peer = redis_stream.get(r["followers"])
        short = "" if r["all_complete"] else " (INCOMPLETE: a follower missed records)"
        rows.append(
            _row(
                "events stream",
                f"delivery, {r['followers']} follower(s), per follower{short}",
                r["http_lines_per_s_per_follower"],
                peer and peer["lines_per_s_per_follower"],
                "Redis Streams XADD MAXLEN~ / blocking XREAD",
                "lines/s",
                "higher",
            )
        )
    for r in journal["latency"]:
        peer = redis_latency.get(r["followers"])
        short = "" if r["all_received"] else " (INCOMPLETE: a follower missed records)"
        for q in ("p50", "p99"):
            rows.append(
                _row(
                    "events stream",
                    f"append to client {q}, {r['followers']} follower(s) @{r['rate']}/s{short}",
                    r["http_ms"].get(q),
                    peer and peer["ms"].get(q),
                    "Redis Streams XADD to XREAD",
                    "ms",
                    "lower",
                )
            )
    return rows


def _rows(
    scenario: str, specs: Iterable[tuple[str, Any, Any, str]], *, unit: str = "ms", better: str = "lower"
) -> list[dict[str, Any]]:
    """A scenario's rows of one unit: ``(figure, value, baseline, baseline_name)`` each."""
    return [_row(scenario, figure, value, base, name, unit, better) for figure, value, base, name in specs]


def _calls_rows(runs: Mapping[str, Any]) -> list[dict[str, Any]]:
    calls, agents = _ok(runs, "calls"), _ok(runs, "agents_baseline")
    if not calls:
        return []
    held = calls["held"]
    top = held["levels"][-1]
    job = agents["idle_job"] if agents else None
    per_call = f"memory per live call at {top['held']} calls (RSS growth)"
    estimate = None
    if agents:
        one = agents["total_pss_mib_by_jobs"][0]
        per_job = agents["total_pss_mib_by_jobs"][-1]["per_job_uss_mib"]
        estimate = one["total_pss_mib"] + (held["held_max"] - 1) * per_job
    latency = calls["latency"]
    return [
        *_rows(
            "calls",
            [
                (
                    per_call,
                    top["rss_per_added_call_kib"],
                    job and job["rss_mib"] * 1024,
                    "livekit-agents: RSS of one idle job process",
                ),
                (
                    per_call,
                    top["rss_per_added_call_kib"],
                    job and job["uss_mib"] * 1024,
                    "livekit-agents: USS (private memory) of one idle job process",
                ),
            ],
            unit="KiB",
        ),
        *_rows(
            "calls",
            [
                (
                    f"memory for the most calls held ({held['held_max']}, stopped: {held['stopped_because']})",
                    top["rss_mib"],
                    estimate,
                    "livekit-agents: worker+forkserver+1 job PSS, + USS per extra job (extrapolated)",
                )
            ],
            unit="MiB",
        ),
        *_rows(
            "calls",
            [
                (
                    "start to connected p50, 1 client",
                    latency["sequential"]["start_ms"]["p50"],
                    latency["health_ms"]["p50"],
                    "GET /health p50, same runner and client",
                )
            ],
        ),
    ]


def _messages_rows(runs: Mapping[str, Any]) -> list[dict[str, Any]]:
    messages = _ok(runs, "messages")
    if not messages or "levels" not in messages:
        return []
    specs = []
    for level in messages["levels"]:
        n = level["calls_live"]
        specs += [
            (
                f"POST message to 202 p50, {n} calls live",
                level["sequential"]["round_trip_ms"]["p50"],
                level["health"]["ms"]["p50"],
                "GET /health p50, same runner and client",
            ),
            (
                f"agent-to-host record on the stream p50, {n} calls live",
                level["echo"]["record_ms"]["p50"],
                level["echo"]["round_trip_ms"]["p50"],
                "the same message's POST to 202 p50",
            ),
        ]
    return _rows("messages", specs)


def _turns_rows(runs: Mapping[str, Any]) -> list[dict[str, Any]]:
    turns = _ok(runs, "turns")
    if not turns:
        return []
    bare = "bare provider loop, same providers"
    specs = []
    for name, s in turns["scenarios"].items():
        specs += [
            (
                f"{name}: engine overhead p50 (total - providers)",
                s["engine"]["overhead_ms"]["p50"],
                s["baseline"]["overhead_ms"]["p50"],
                bare,
            ),
            (
                f"{name}: turn total p50",
                s["engine"]["total_ms"]["p50"],
                s["baseline"]["total_ms"]["p50"],
                bare,
            ),
        ]
    return _rows("turns", specs)


def _websocket_rows(runs: Mapping[str, Any]) -> list[dict[str, Any]]:
    ws = _ok(runs, "websocket")
    if not ws:
        return []
    return _rows(
        "websocket",
        [
            (
                f"{label} p50, {level['sockets']} socket(s), against {baseline.replace('_', '-')}",
                level["socket"][metric].get("p50"),
                level[baseline][metric].get("p50"),
                name,
            )
            for level in ws["levels"]
            for metric, label in (
                ("first_text_delta_ms", "first text.delta"),
                ("first_audio_byte_ms", "first audio byte"),
            )
            for baseline, name in (
                ("in_process", "the same turns in-process: AgentRuntime alone"),
                ("platform", "the same turns in-process through the platform, no socket"),
            )
        ],
    )


def _fuzz_rows(runs: Mapping[str, Any]) -> list[dict[str, Any]]:
    fuzz = _ok(runs, "fuzz")
    if not fuzz:
        return []
    none = "none: any violation is a bug"
    return [
        _row(
            "fuzz",
            "generated examples run (routes and frames)",
            fuzz["examples"],
            None,
            none,
            "examples",
            "higher",
        ),
        _row("fuzz", "violations found", fuzz["violations"], None, none, "violations", "lower"),
    ]


def _livekit_rows(runs: Mapping[str, Any]) -> list[dict[str, Any]]:
    lk = _ok(runs, "livekit")
    if not lk:
        return []
    none = "no peer measured: it would need livekit-agents with its own STT/LLM/TTS stack"
    return _rows(
        "livekit",
        [
            (
                "POST /v1/sessions to 202 (agent in the room) p50",
                lk["join"]["post_to_202_ms"]["p50"],
                None,
                none,
            ),
            (
                "end of caller speech to first agent audio p50",
                lk["answer"]["end_of_speech_to_first_audio_ms"]["p50"],
                None,
                none,
            ),
        ],
    )


def _host_rows(runs: Mapping[str, Any]) -> list[dict[str, Any]]:
    host = _ok(runs, "host")
    if not host:
        return []
    placements, catch_up = host["placements"], host["catch_up"]
    return [
        *_rows(
            "host",
            [
                (
                    f"placements across {placements['runners']} runners (runner.host.RunnerPool)",
                    placements["pool_best_per_s"],
                    placements["raw_best_per_s"],
                    "raw httpx starts, round-robin",
                )
            ],
            unit="calls/s",
            better="higher",
        ),
        *_rows(
            "host",
            [
                (
                    "follower catch-up (follow_events), best",
                    catch_up["follower_best_per_s"],
                    catch_up["raw_best_per_s"],
                    "httpx aiter_lines + json.loads",
                )
            ],
            unit="records/s",
            better="higher",
        ),
    ]


def _worker_rows(runs: Mapping[str, Any]) -> list[dict[str, Any]]:
    worker = _ok(runs, "worker")
    if not worker or "ours_1" not in worker:
        return []
    theirs = worker.get("agents_1", {}).get("dispatch_to_joined_ms", {})
    ours_burst, theirs_burst = worker.get("ours_burst", {}), worker.get("agents_burst", {})
    agents = "livekit-agents' AgentServer, same server, same run"
    silent = "livekit-agents' empty entrypoint says nothing"
    return [
        *_rows(
            "worker",
            [
                (
                    "create_dispatch to agent joined p50, 1 worker",
                    worker["ours_1"]["dispatch_to_joined_ms"]["p50"],
                    theirs.get("p50"),
                    agents,
                ),
                (
                    "create_dispatch to first agent audio p50, 1 worker",
                    worker["ours_1"]["dispatch_to_first_audio_ms"]["p50"],
                    None,
                    silent,
                ),
                (
                    "create_dispatch to first agent audio p50, 2 workers",
                    worker.get("ours_2", {}).get("dispatch_to_first_audio_ms", {}).get("p50"),
                    None,
                    silent,
                ),
            ],
        ),
        *_rows(
            "worker",
            [
                (
                    "jobs per second, one worker, a burst",
                    ours_burst.get("jobs_per_second"),
                    theirs_burst.get("jobs_per_second"),
                    agents,
                )
            ],
            unit="jobs/s",
            better="higher",
        ),
        *_rows(
            "worker",
            [
                (
                    "private memory (USS) per job",
                    ours_burst.get("uss_per_job_mib"),
                    theirs_burst.get("uss_per_job_mib"),
                    agents,
                ),
                (
                    "resident memory (RSS) per job",
                    ours_burst.get("rss_per_job_mib"),
                    theirs_burst.get("rss_per_job_mib"),
                    agents,
                ),
            ],
            unit="MiB",
        ),
    ]


def _speech_rows(runs: Mapping[str, Any]) -> list[dict[str, Any]]:
    sp = _ok(runs, "speech")
    if not sp:
        return []
    old, new = sp["wer"]["pocketsphinx (old default)"], sp["wer"]["whisper tiny.en (new default)"]
    tts, vad = sp["tts_first_audio_ms"], sp["vad"]["per_frame_us"]
    cost = sp.get("whisper_decode_cost", {})
    return [
        *_rows(
            "speech",
            [
                (
                    f"WER, Whisper on {voice} (%)",
                    new[voice]["wer"] * 100,
                    old[voice]["wer"] * 100,
                    "pocketsphinx on the same audio",
                )
                for voice in new
            ],
            unit="%",
        ),
        *_rows(
            "speech",
            [
                (
                    f"Whisper decode {q}, one hibari sentence at a time",
                    cost[voice]["short window (runner)"]["decode_ms"][q],
                    cost[voice]["30 s window (before)"]["decode_ms"][q],
                    "the 30 s window (faster-whisper's transcribe)",
                )
                for voice in ("hibari heart (new default voice)",)
                if voice in cost
                for q in ("p50", "p99")
            ],
        ),
        *_rows(
            "speech",
            [
                (
                    "TTS first audio p50, hibari",
                    tts["hibari heart (new default voice)"]["p50"],
                    tts["espeak en (old default voice)"]["p50"],
                    "espeak-ng en",
                )
            ],
        ),
        *_rows(
            "speech",
            [
                (
                    "VAD per 20 ms frame at 48 kHz, Silero",
                    vad["silero @ 48 kHz"],
                    vad["energy @ 48 kHz"],
                    "energy VAD",
                )
            ],
            unit="us",
        ),
    ]


def _livekit_voice_rows(runs: Mapping[str, Any]) -> list[dict[str, Any]]:
    lv = _ok(runs, "livekit_voice")
    if not lv or not lv["latency_ms"]["new"].get("n"):
        return []
    return _rows(
        "livekit_voice",
        [
            (
                f"end of speech to first audio {q}, new voice",
                lv["latency_ms"]["new"][q],
                lv["latency_ms"]["old"].get(q),
                "the old voice (energy VAD, pocketsphinx, espeak)",
            )
            for q in ("p50", "p99")
        ],
    )


def _soak_rows(runs: Mapping[str, Any]) -> list[dict[str, Any]]:
    soak = _ok(runs, "soak")
    if not soak:
        return []
    kills = f"{soak['trials']} kills, {soak['acknowledged']} records acknowledged"
    rss, wal = soak["flat"]["rss_peak_mib"], soak["flat"]["wal_peak_mib"]
    first = "the first minute's peak (flat: no more than x1.5)"
    return [
        *_rows(
            "soak",
            [
                (f"records lost, {kills}", soak["lost"], 0, "the promise: nothing acknowledged is lost"),
                (f"records duplicated, {kills}", soak["duplicated"], 0, "the promise: nothing repeats"),
            ],
            unit="records",
        ),
        *_rows(
            "soak",
            [
                ("runner RSS, the last minute's peak", rss["last"], rss["first"], first),
                ("WAL file, the last minute's peak", wal["last"], wal["first"], first),
            ],
            unit="MiB",
        ),
    ]


def _growth(
    name: str, points: list[tuple[int, float]], unit: str, *, higher_better: bool = False
) -> dict[str, Any] | None:
    """How ``name`` moved from the fewest calls to the most; only a change for the worse breaks "flat"."""
    points = [(n, v) for n, v in points if v is not None and v > 0]
    if len(points) < 2:
        return None
    (n0, v0), (n1, v1) = points[0], points[-1]
    growth = v1 / v0
    flat = growth >= 1 / FLAT_WITHIN if higher_better else growth <= FLAT_WITHIN
    return {
        "figure": name,
        "unit": unit,
        "points": points,
        "growth": growth,
        "flat": flat,
        "verdict": f"{name}: {fmt(v0)} {unit} at {n0} calls, {fmt(v1)} {unit} at {n1} calls (x{growth:.2f}):"
        f" {'flat' if flat else 'NOT flat'} (flat = no worse than {FLAT_WITHIN}x)",
    }


def _scaling(runs: Mapping[str, Any]) -> dict[str, Any]:
    figures = []
    calls = _ok(runs, "calls")
    if calls:
        levels = calls["held"]["levels"]
        figures.append(
            _growth(
                "memory per live call, cumulative (RSS growth since 1 call / calls added)",
                [(lv["held"], lv["rss_per_added_call_kib"]) for lv in levels if lv["held"] >= 100],
                "KiB",
            )
        )
        figures.append(
            _growth(
                "call start p50 while holding calls",
                [(lv["held"], lv["start_ms"]["p50"]) for lv in levels],
                "ms",
            )
        )
        figures.append(
            _growth(
                "call start p99 while holding calls",
                [(lv["held"], lv["start_ms"]["p99"]) for lv in levels],
                "ms",
            )
        )
        figures.append(
            _growth(
                "GET /v1/runner while holding calls (client in-process)",
                [(lv["held"], lv["runner_status_ms"]) for lv in levels],
                "ms",
            )
        )
        if all("runner_status_own_process_ms" in lv for lv in levels):
            figures.append(
                _growth(
                    "GET /v1/runner while holding calls (client in a process of its own)",
                    [(lv["held"], lv["runner_status_own_process_ms"]) for lv in levels],
                    "ms",
                )
            )
    messages = _ok(runs, "messages")
    if messages and "levels" in messages:
        levels = messages["levels"]
        figures.append(
            _growth(
                "host message POST p50",
                [(lv["calls_live"], lv["sequential"]["round_trip_ms"]["p50"]) for lv in levels],
                "ms",
            )
        )
        figures.append(
            _growth(
                "host message POST p99",
                [(lv["calls_live"], lv["sequential"]["round_trip_ms"]["p99"]) for lv in levels],
                "ms",
            )
        )
        figures.append(
            _growth(
                "host messages/s, 10 clients",
                [(lv["calls_live"], lv["concurrent"]["per_s"]) for lv in levels],
                "msg/s",
                higher_better=True,
            )
        )
        figures.append(
            _growth(
                "agent-to-host record p50",
                [(lv["calls_live"], lv["echo"]["record_ms"]["p50"]) for lv in levels],
                "ms",
            )
        )
    figures = [f for f in figures if f]
    verdicts = [f["verdict"] for f in figures]
    steps = []
    if calls:
        levels = calls["held"]["levels"]
        for a, b in itertools.pairwise(levels):
            added = b["held"] - a["held"]
            steps.append(
                {
                    "from": a["held"],
                    "to": b["held"],
                    "kib_per_call": (b["rss_mib"] - a["rss_mib"]) * 1024 / added if added else None,
                }
            )
        # RSS moves in pages and allocator arenas: only steps of 100+ added calls resolve a per-call cost.
        wide = [st for st in steps if st["to"] - st["from"] >= 100 and st["kib_per_call"]]
        text = ", ".join(f"{fmt(st['kib_per_call'])} KiB ({st['from']}->{st['to']})" for st in steps)
        if len(wide) >= 2:
            values = [st["kib_per_call"] for st in wide]
            spread = max(values) / min(values)
            flat = spread <= FLAT_WITHIN
            verdicts.insert(
                0,
                f"cost per call (marginal RSS per added call in each step: {text}) "
                + ("stays flat" if flat else "does NOT stay flat")
                + f" over the steps of 100+ calls, {wide[0]['from']} to {wide[-1]['to']} calls"
                f" (spread x{spread:.2f}, flat = within {FLAT_WITHIN}x)",
            )
    return {"figures": figures, "verdicts": verdicts, "flat_within": FLAT_WITHIN, "memory_steps": steps}


ROW_BUILDERS: tuple[Callable[[Mapping[str, Any]], list[dict[str, Any]]], ...] = (
    _journal_rows,
    _stream_rows,
    _calls_rows,
    _messages_rows,
    _turns_rows,
    _websocket_rows,
    _fuzz_rows,
    _livekit_rows,
    _host_rows,
    _worker_rows,
    _speech_rows,
    _livekit_voice_rows,
    _soak_rows,
)


# -- the figures issue 21 set goals for, beside their values before it ----------------------------


def _goal(figure: str, old: str, goal: str, now: str, met: bool | None) -> dict[str, Any]:
    verdict = "-" if met is None else ("met" if met else "NOT met")
    return {"figure": figure, "old": old, "goal": goal, "now": now, "verdict": verdict}


def _goals(runs: Mapping[str, Any]) -> list[dict[str, Any]]:
    goals = []
    calls = _ok(runs, "calls")
    if calls:
        levels = calls["held"]["levels"]
        top = levels[-1]
        # From a process of its own when measured (the runner's answer); in-process beside it.
        own = top.get("runner_status_own_process_ms")
        figure = own if own is not None else top["runner_status_ms"]
        goals.append(
            _goal(
                f"GET /v1/runner at {top['held']} calls, ms",
                "236 at 50,000 (2.65 at 1); 36.7 in round two, in-process",
                "under 20 at 50,000",
                (
                    f"{fmt(own)} from a process of its own, {fmt(top['runner_status_ms'])} in-process"
                    if own is not None
                    else fmt(figure)
                )
                + f" (the runner's join {fmt(top.get('runner_status_build_ms'))},"
                f" against {fmt(top.get('runner_status_rebuild_ms'))} for the old build and encode)",
                figure < 20 if top["held"] >= 50_000 else None,
            )
        )
        polled = calls["held"].get("polled")
        if polled:
            without, with_ = polled["start_ms_without"].get("p99"), polled["start_ms_with"].get("p99")
            goals.append(
                _goal(
                    f"call start p99 while a host polls GET /v1/runner at 1 Hz ({polled['held']} calls), ms",
                    "not measured",
                    "unaffected (within 1.2x of no poller, same run)",
                    f"{fmt(with_)} (no poller: {fmt(without)}); the loop's CPU per poll"
                    f" {fmt(polled.get('loop_cpu_ms_per_poll'))} ms",
                    None if not (with_ and without) else with_ <= 1.2 * without,
                )
            )
        first = levels[0]["start_ms"].get("p99")
        at = [lv for lv in levels if lv["held"] <= 1_000][-1]
        p99 = at["start_ms"].get("p99")
        goals.append(
            _goal(
                f"call start p99, 1 to {at['held']} calls, ms",
                "2.3 to 4.8 (2.1x)",
                "flat (within 1.5x)",
                f"{fmt(first)} to {fmt(p99)} ({fmt(ratio(p99, first))}x)",
                None if not (first and p99) else p99 <= 1.5 * first,
            )
        )
    counted = _ok(runs, "calls_instructions")
    if counted:
        held = max(int(k) for k in counted["levels"])
        goals.append(
            _goal(
                f"instructions per call start and stop, 1 to {held} calls held",
                "not measured",
                "flat (the per-call cost that grows, found)",
                f"{counted['levels']['1']['per_start']:,.0f} to"
                f" {counted['levels'][str(held)]['per_start']:,.0f} (x{counted['growth']:.3f})",
                counted["growth"] <= 1.05,
            )
        )
    ws = _ok(runs, "websocket")
    if ws:
        for metric, label, old, limit in (
            ("first_text_delta_ms", "first text.delta", "15 / 0.23 ms (66x; 55x in the last full run)", 3.0),
            (
                "first_audio_byte_ms",
                "first audio byte",
                "316 / 193 ms (1.6x; 1.9x in the last full run)",
                1.3,
            ),
        ):
            for level in ws["levels"]:
                if level["sockets"] < 50:
                    continue
                value = level["socket"][metric].get("p50")
                base = level["in_process"][metric].get("p50")
                platform = level["platform"][metric].get("p50")
                r = ratio(value, base)
                goals.append(
                    _goal(
                        f"{label} p50 through {level['sockets']} sockets / in-process",
                        old if level["sockets"] == 50 else "not measured",
                        f"at most {limit}x" + ("" if level["sockets"] == 50 else " (the goal is set at 50)"),
                        f"{fmt(value)} / {fmt(base)} ms ({fmt(r)}x); through the platform without the"
                        f" socket {fmt(platform)} ms (socket / platform {fmt(ratio(value, platform))}x);"
                        f" load {level['socket']['cpu']['load_average'][0]:.1f}"
                        + (
                            "; the in-process turns all start at once and queue on espeak-ng's one"
                            " engine (docs/performance.md)"
                            if metric == "first_audio_byte_ms"
                            else f"; a ping's round trip {fmt(level['socket']['ping_pong_ms'].get('p50'))} ms"
                        ),
                        None if r is None or level["sockets"] != 50 else r <= limit,
                    )
                )
    journal = _ok(runs, "journal")
    if journal:
        # With --before, the same run also timed the older build beside this one.
        beside = {r["producers"]: r for r in (journal.get("append_before") or {}).get("by_producers", [])}
        for r in journal["append"]["by_producers"]:
            if r["producers"] >= 50:
                old = beside.get(r["producers"])
                goals.append(
                    _goal(
                        f"journal append, {r['producers']} producers / raw sqlite3",
                        {50: "0.70", 200: "0.63", 500: "0.59"}.get(r["producers"], "0.60-0.70"),
                        "at least 0.8",
                        f"{r['ratio']:.2f}"
                        + (
                            f" (in processes of their own: {old['ratio_now']:.2f},"
                            f" {journal['append_before']['rev']} {old['ratio_before']:.2f})"
                            if old
                            else ""
                        ),
                        r["ratio"] >= 0.8,
                    )
                )
    counted = _ok(runs, "journal_instructions")
    if counted:
        before = counted.get("before")
        goals.append(
            _goal(
                f"journal append, {counted['producers']} producers: raw / journal instructions per record",
                "0.64 (87,604 against 55,833)"
                + (
                    f"; {before['rev']} in this run: {before['ratio']:.2f} ({before['per_record']:,.0f})"
                    if before
                    else ""
                ),
                "at least 0.8 (the throughput goal, counted)",
                f"{counted['ratio']:.2f} ({counted['sides']['journal']['per_record']:,.0f} against"
                f" {counted['sides']['raw']['per_record']:,.0f})",
                counted["ratio"] >= 0.8,
            )
        )
    return goals


def goal_rows(summary: Mapping[str, Any]) -> list[list[str]]:
    return [[g["figure"], g["old"], g["goal"], g["now"], g["verdict"]] for g in summary.get("goals", [])]


def summarize(runs: Mapping[str, Any]) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    errors = []
    for build in ROW_BUILDERS:
        try:
            rows += build(runs)
        except (KeyError, TypeError, IndexError, ValueError) as error:  # a results file of another shape
            errors.append(f"{build.__name__}: {error!r}")
    try:
        scaling = _scaling(runs)
    except (KeyError, TypeError, IndexError, ValueError) as error:
        scaling = {"figures": [], "verdicts": [], "flat_within": FLAT_WITHIN}
        errors.append(f"scaling: {error!r}")
    try:
        goals = _goals(runs)
    except (KeyError, TypeError, IndexError, ValueError) as error:
        goals = []
        errors.append(f"goals: {error!r}")
    return {"rows": rows, "scaling": scaling, "goals": goals, "errors": errors}


def table_rows(summary: Mapping[str, Any]) -> list[list[str]]:
    out = []
    for r in summary["rows"]:
        baseline = (
            f"{fmt(r['baseline'])} ({r['baseline_name']})"
            if r["baseline"] is not None
            else f"- ({r['baseline_name']}: not measured)"
        )
        out.append(
            [
                r["scenario"],
                f"{r['figure']}, {r['unit']}",
                fmt(r["value"]),
                baseline,
                (f"{r['ratio']:.3g}x" if r["ratio"] is not None else "-"),
            ]
        )
    return out


def status_lines(runs: Mapping[str, Any]) -> list[str]:
    return [
        f"{name}: {run['status']}" + (f" ({run['reason']})" if run.get("reason") else "")
        for name, run in runs.items()
        if run["status"] != "ok"
    ]


# -- plots ----------------------------------------------------------------------------------------


def _legend(ax: Any, size: int) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=size)


def _plots(combined: Mapping[str, Any], stamp: str) -> list[tuple[str, str]]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = combined["scenarios"]
    made: list[tuple[str, str]] = []

    def save(fig: Any, name: str, caption: str) -> None:
        path = RESULTS_DIR / f"{name}-{stamp}.png"
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        made.append((path.name, caption))

    journal, redis, calls, messages, agents = (
        _ok(runs, n) for n in ("journal", "redis_stream", "calls", "messages", "agents_baseline")
    )

    # 1. latency distributions
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    ax = axes[0]
    for source, label, style in ((journal, "runner /v1/runner/events", "-"), (redis, "Redis Streams", "--")):
        if not source:
            continue
        for r in source["latency"]:
            samples = r.get("http_samples_ms") or r.get("samples_ms")
            if samples:
                ys = [(i + 1) / len(samples) for i in range(len(samples))]
                ax.plot(samples, ys, style, label=f"{label}, {r['followers']} follower(s)")
    ax.set_xscale("log")
    ax.set_xlabel("append to client, ms (log)")
    ax.set_ylabel("fraction of records")
    ax.set_title("Events stream latency (CDF), paced appends")
    ax.grid(True, which="both", alpha=0.3)
    _legend(ax, 8)
    ax = axes[1]
    if messages and "levels" in messages:
        xs = [lv["calls_live"] for lv in messages["levels"]]
        for key, label in (("p50", "p50"), ("p99", "p99")):
            ax.plot(
                xs,
                [lv["sequential"]["round_trip_ms"][key] for lv in messages["levels"]],
                "o-",
                label=f"host message POST {label}",
            )
            ax.plot(
                xs,
                [lv["echo"]["record_ms"][key] for lv in messages["levels"]],
                "s--",
                label=f"agent-to-host record {label}",
            )
            ax.plot(
                xs,
                [lv["health"]["ms"][key] for lv in messages["levels"]],
                ":",
                color="grey",
                label=f"GET /health {label} (baseline)",
            )
    if calls:
        lv = calls["held"]["levels"]
        ax.plot([x["held"] for x in lv], [x["start_ms"]["p50"] for x in lv], "^-", label="call start p50")
        ax.plot([x["held"] for x in lv], [x["start_ms"]["p99"] for x in lv], "v-", label="call start p99")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("calls live (log)")
    ax.set_ylabel("ms (log)")
    ax.set_title("Latency percentiles against calls live")
    ax.grid(True, which="both", alpha=0.3)
    _legend(ax, 7)
    save(
        fig,
        "latency",
        "Latency distributions: the events stream against Redis Streams (left); message, record and call-start percentiles as calls grow (right).",
    )

    # 2. throughput against load
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    ax = axes[0]
    if journal:
        rows = journal["append"]["by_producers"]
        ax.plot(
            [r["producers"] for r in rows], [r["journal_records_per_s"] for r in rows], "o-", label="journal"
        )
        ax.plot(
            [r["producers"] for r in rows],
            [r["raw_records_per_s"] for r in rows],
            "s--",
            label="raw sqlite3, same batch",
        )
    ax.set_xscale("log")
    ax.set_xlabel("concurrent producers (log)")
    ax.set_ylabel("records/s")
    ax.set_title("Journal appends")
    ax.grid(True, which="both", alpha=0.3)
    _legend(ax, 8)
    ax = axes[1]
    if journal:
        ax.plot(
            [r["followers"] for r in journal["stream"]],
            [r["http_lines_per_s_per_follower"] for r in journal["stream"]],
            "o-",
            label="runner events stream",
        )
    if redis:
        ax.plot(
            [r["followers"] for r in redis["stream"]],
            [r["lines_per_s_per_follower"] for r in redis["stream"]],
            "s--",
            label="Redis Streams",
        )
    ax.set_xlabel("followers")
    ax.set_ylabel("lines/s per follower")
    ax.set_title("Stream delivery throughput")
    ax.grid(True, alpha=0.3)
    _legend(ax, 8)
    ax = axes[2]
    if messages and "levels" in messages:
        xs = [lv["calls_live"] for lv in messages["levels"]]
        ax.plot(
            xs,
            [lv["sequential"]["per_s"] for lv in messages["levels"]],
            "o-",
            label="host messages/s, 1 client",
        )
        ax.plot(
            xs,
            [lv["concurrent"]["per_s"] for lv in messages["levels"]],
            "s-",
            label="host messages/s, 10 clients",
        )
    if calls:
        lv = calls["held"]["levels"]
        ax.plot(
            [x["held"] for x in lv],
            [x["fill_calls_per_s"] for x in lv],
            "^--",
            label="call starts/s while filling",
        )
    ax.set_xscale("log")
    ax.set_xlabel("calls live (log)")
    ax.set_ylabel("per second")
    ax.set_title("Throughput against calls live")
    ax.grid(True, which="both", alpha=0.3)
    _legend(ax, 8)
    save(
        fig,
        "throughput",
        "Throughput against load: journal appends against raw SQLite (left), stream delivery against Redis Streams (middle), messages and call starts as calls grow (right).",
    )

    # 3. memory per call against calls
    if calls:
        fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
        lv = [x for x in calls["held"]["levels"] if x["held"] >= 10]
        ax = axes[0]
        ax.plot(
            [x["held"] for x in lv],
            [x["rss_per_added_call_kib"] or math.nan for x in lv],
            "o-",
            label="runner: RSS growth per added call",
        )
        if agents:
            job = agents["idle_job"]
            ax.axhline(
                job["rss_mib"] * 1024,
                color="red",
                ls="--",
                label=f"livekit-agents idle job RSS ({fmt(job['rss_mib'])} MiB)",
            )
            ax.axhline(
                job["uss_mib"] * 1024,
                color="orange",
                ls=":",
                label=f"livekit-agents idle job USS ({fmt(job['uss_mib'])} MiB)",
            )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("calls held (log)")
        ax.set_ylabel("KiB per call (log)")
        ax.set_title("Memory per live call")
        ax.grid(True, which="both", alpha=0.3)
        _legend(ax, 8)
        ax = axes[1]
        all_levels = calls["held"]["levels"]
        xs = [x["held"] for x in all_levels]
        ax.plot(
            xs, [x["rss_mib"] for x in all_levels], "o-", label="runner process RSS (runner + load client)"
        )
        if agents:
            one = agents["total_pss_mib_by_jobs"][0]
            per_job = agents["total_pss_mib_by_jobs"][-1]["per_job_uss_mib"]
            ax.plot(
                xs,
                [one["total_pss_mib"] + (n - 1) * per_job for n in xs],
                "s--",
                label="livekit-agents: worker+forkserver PSS + USS per job (extrapolated)",
            )
            measured = agents["total_pss_mib_by_jobs"]
            ax.plot(
                [m["jobs"] for m in measured],
                [m["total_pss_mib"] for m in measured],
                "rx",
                ms=9,
                label="livekit-agents measured",
            )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("calls (log)")
        ax.set_ylabel("MiB (log)")
        ax.set_title("Total memory against calls")
        ax.grid(True, which="both", alpha=0.3)
        _legend(ax, 7)
        save(
            fig,
            "memory",
            "Memory per call against calls held, beside livekit-agents' idle job process (left); total memory against calls (right).",
        )
    soak = _ok(runs, "soak")
    if soak:
        path = RESULTS_DIR / f"soak-{stamp}.png"
        soak_figure(soak, path)
        made.append(
            (
                path.name,
                "The soak: the runner's RSS (left) and the journal's WAL and file sizes (right) under mixed"
                " load, a kill -9 at each red line and a restart on the same journal.",
            )
        )
    return made


def soak_figure(soak: Mapping[str, Any], path: Path) -> None:
    """The soak's runner RSS (left) and journal file sizes (right) over time, a line at each kill."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = soak["samples"]
    ts = [s["t_s"] / 60 for s in samples]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    for ax, keys, title in (
        (axes[0], (("rss_mib", "runner RSS"),), "Runner memory"),
        (axes[1], (("wal_mib", "WAL file"), ("db_mib", "journal file")), "Journal files"),
    ):
        for key, label in keys:
            ax.plot(ts, [s[key] for s in samples], ".", ms=2, label=label)
        for at in soak["kills_at_s"]:
            ax.axvline(at / 60, color="red", ls=":", lw=0.8)
        ax.set_ylim(bottom=0)
        ax.set_xlabel("minutes (red: kill -9, then a restart)")
        ax.set_ylabel("MiB")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        _legend(ax, 8)
    fig.suptitle(
        f"Soak: {soak['trials']} kills, {soak['acknowledged']:,} records acknowledged,"
        f" {soak['lost']} lost, {soak['duplicated']} duplicated"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# -- Markdown -------------------------------------------------------------------------------------


def _md_table(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(c.replace("|", "/") for c in row) + " |" for row in rows]
    return "\n".join(lines)


def write_report(combined: Mapping[str, Any], stamp: str, *, plots: bool = True) -> Path:
    machine = combined["machine"]
    runs = combined["scenarios"]
    summary = combined["summary"]
    parts = [
        f"# Benchmark report {combined['finished_at_utc']}",
        "",
        f"Command: `{combined['command']}` ({combined['profile']}, {combined['seconds']:.0f} s).",
        f"Machine: {machine['cores']} cores, {machine['cpu']}, Python {machine['python']}, SQLite {machine['sqlite']},"
        f" {machine['platform']}; load average at start {', '.join(f'{v:.2f}' for v in machine.get('load_average_at_start') or [])}.",
        "",
        "## Scenarios",
        "",
        _md_table(
            ["scenario", "status", "seconds", "command / reason"],
            [
                [
                    name,
                    run["status"],
                    f"{run.get('seconds', 0):.0f}",
                    run.get("reason", "") or f"`{run.get('command', '')}`",
                ]
                for name, run in runs.items()
            ],
        ),
        "",
        "## Figures beside their baselines",
        "",
        "Ratio is value / baseline; the last column says which direction is better.",
        "",
        _md_table(
            ["scenario", "figure", "value", "baseline", "ratio", "better"],
            [
                [
                    r["scenario"],
                    f"{r['figure']}, {r['unit']}",
                    fmt(r["value"]),
                    f"{fmt(r['baseline'])} ({r['baseline_name']})"
                    if r["baseline"] is not None
                    else f"- ({r['baseline_name']}: not measured)",
                    f"{r['ratio']:.3g}x" if r["ratio"] is not None else "-",
                    r["better"],
                ]
                for r in summary["rows"]
            ],
        ),
        "",
        "## Figures against their goals (performance, round two)",
        "",
        "Each figure's value before round two (docs/performance.md), its goal, and this run's.",
        "",
        _md_table(["figure", "before", "goal", "this run", "verdict"], goal_rows(summary)),
        "",
        "## Scaling from 1 call to the most calls",
        "",
    ]
    parts += [f"- {v}" for v in summary["scaling"]["verdicts"]] or ["- (no calls data)"]
    if summary.get("errors"):
        parts += [
            "",
            "Summary errors (a results file of an unexpected shape): " + "; ".join(summary["errors"]),
        ]
    if plots:
        parts += ["", "## Plots", ""]
        try:
            for name, caption in _plots(combined, stamp):
                parts += [f"![{caption}]({name})", "", f"*{caption}*", ""]
        except ImportError as error:
            parts += [
                f"(no plots: {error}; install with `pip install matplotlib` or `pip install -e '.[bench]'`)"
            ]
    notes = [
        f"- **{name}**: {run['results']['notes']}"
        for name, run in runs.items()
        if run.get("results", {}).get("notes")
    ]
    if notes:
        parts += ["", "## What each scenario measured", "", *notes]
    parts.append("")
    text = "\n".join(parts)
    path = RESULTS_DIR / f"report-{stamp}.md"
    path.write_text(text, encoding="utf-8")
    (RESULTS_DIR / "report-latest.md").write_text(text, encoding="utf-8")  # its plots are the stamped files
    return path
