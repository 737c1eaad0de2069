"""LiveKit's own one-way audio latency on this machine, knob by knob.

    python -m bench.livekit_path [--quick]        (root: it makes a network namespace)

A real ``livekit-server`` in a private network namespace (bench/livekit.py's
``livekit_env()``), and per configuration two ``tests/livekit/lk_peer.py`` participants in a
room of their own: a publisher pushes silence (or nothing: its source idles), then a loud
1 kHz burst through ``rtc.AudioSource.capture_frame``; a subscriber's ``rtc.AudioStream``
reports the frame the burst arrives in. Both read ``time.monotonic()``, one clock on one
machine, so the figure is one-way: from the moment the burst's first sample leaves the
publisher's source (the moment it is handed to ``capture_frame``, plus what the source's
queue held then) to the moment the frame holding it reaches the subscriber's Python code.
The subscriber also reports WebRTC's mean jitter-buffer delay over the run (its
``inbound-rtp`` stats), the part of the path that sits in the receiver's NetEq.

Each row changes one knob from the runner's own configuration (``today out``: the agent's
voice, a 48 kHz source with a 200 ms queue that idles between replies, heard by a caller
that reads 48 kHz in 20 ms frames); the last rows are the runner's configuration after
issue 18's media work and what the caller's side of a turn sends (``in``).

Then the runner's own side of the way in, with no network and no clock (it does not depend on
the load): the caller's sentence fed to the runner's ``Listener`` (Silero) in the frames the
transport hands on, before (48 kHz, 20 ms: soxr to 16 kHz inside the VAD) and now; how much
audio past the sentence's last loud sample it took to report the pause and the end of the
turn. Results go to ``bench/results/livekit_path-<UTC>.json``.
"""

from __future__ import annotations

import argparse
import os
import random
import time
from typing import Any

import attrs
import numpy as np
import soxr
import trio

from runner.transports.livekit import AUDIO_IN_FRAME_MS, AUDIO_IN_RATE_HZ
from runner.voice.listener import Listener, SpeechEnded, SpeechPaused

from ._common import cpu_report, cpu_sample, machine_info, print_table, say, summarize, write_results
from .livekit import SPEECH_LEVEL, livekit_env, sentence_file

BURST_MS = 100
GAP_S = 0.35  # idle time between bursts (and a random 0-20 ms more, so the 10 ms ticks vary)


@attrs.frozen(kw_only=True)
class Config:
    """One way of sending and receiving; the defaults are the runner's agent voice today."""

    name: str
    what: str
    rate: int = 48_000  # the publisher's AudioSource
    queue_ms: int = 200  # its queue_size_ms (0: no queue, 10 ms frames in real time)
    lead_ms: int = 0  # silence pushed before the burst (0: the source idles)
    ahead: bool = False  # pushed as fast as the source takes it (a TTS), not in real time
    frame_ms: int = 20  # the publisher's capture_frame size
    dtx: bool | None = None  # None: LiveKit's default (on)
    red: bool | None = None
    sub_rate: int = 48_000  # the subscriber's AudioStream
    sub_frame_ms: int = 20  # its frame_size_ms (0: as WebRTC hands them, 10 ms)


TODAY_OUT = Config(name="today out", what="runner's voice -> caller, as today")
CONFIGS = (
    TODAY_OUT,
    attrs.evolve(TODAY_OUT, name="sub 10 ms", what="caller reads 10 ms frames", sub_frame_ms=10),
    attrs.evolve(
        TODAY_OUT, name="sub native", what="caller reads WebRTC's frames as they come", sub_frame_ms=0
    ),
    attrs.evolve(
        TODAY_OUT, name="sub 16 kHz", what="caller reads 16 kHz (WebRTC resamples)", sub_rate=16_000
    ),
    attrs.evolve(TODAY_OUT, name="src 24 kHz", what="source at the TTS's 24 kHz", rate=24_000),
    attrs.evolve(TODAY_OUT, name="src 10 ms", what="10 ms capture frames", frame_ms=10),
    attrs.evolve(TODAY_OUT, name="queue 20", what="source queue 20 ms", queue_ms=20),
    attrs.evolve(
        TODAY_OUT, name="queue 1000", what="source queue 1000 ms (the SDK's default)", queue_ms=1000
    ),
    attrs.evolve(
        TODAY_OUT, name="queue 0", what="no source queue: 10 ms frames paced here", queue_ms=0, frame_ms=10
    ),
    attrs.evolve(TODAY_OUT, name="dtx off", what="no Opus DTX", dtx=False),
    attrs.evolve(TODAY_OUT, name="red off", what="no RED", red=False),
    attrs.evolve(
        TODAY_OUT, name="busy source", what="silence pushed in real time before (a microphone)", lead_ms=500
    ),
    attrs.evolve(
        TODAY_OUT,
        name="full queue",
        what="silence queued ahead before (a TTS mid-reply: what a barge-in waits)",
        lead_ms=500,
        ahead=True,
    ),
    attrs.evolve(
        TODAY_OUT,
        name="today in",
        what="caller's mic -> runner (22.05 kHz, 200 ms queue kept full)",
        rate=22_050,
        lead_ms=500,
        ahead=True,
    ),
    attrs.evolve(
        TODAY_OUT,
        name="in 16 kHz 10 ms",
        what="caller's mic -> runner reading 16 kHz in 10 ms frames",
        rate=22_050,
        lead_ms=500,
        ahead=True,
        sub_rate=16_000,
        sub_frame_ms=10,
    ),
)
QUICK_BURSTS = 10
FULL_BURSTS = 20
QUICK_ROUNDS = 2
FULL_ROUNDS = 3
SETTLE_BURSTS = 2


@attrs.define
class Measured:
    """What the bursts of one configuration measured, over every round."""

    latencies: list[float] = attrs.Factory(list)
    end_latencies: list[float] = attrs.Factory(list)
    queued: list[float] = attrs.Factory(list)
    jitter_s: float = 0.0  # the subscriber's jitter-buffer delay, summed over its samples
    target_s: float = 0.0
    emitted: int = 0


async def measure(env: Any, config: Config, bursts: int, into: Measured) -> None:
    """``bursts`` bursts through a room of their own (a new publisher and subscriber)."""
    room = env.unique_room("path")
    async with env.peer("pub", room) as pub, env.peer("sub", room) as sub:
        options = {k: v for k, v in (("dtx", config.dtx), ("red", config.red)) if v is not None}
        await pub.request("publish_mic", rate=config.rate, queue_ms=config.queue_ms, **options)
        await sub.request(
            "record", identity="pub", within=10, rate=config.sub_rate, frame_ms=config.sub_frame_ms
        )
        # The first packets of a track meet a jitter buffer that has not settled: not counted.
        for _ in range(SETTLE_BURSTS):
            await trio.sleep(GAP_S)
            await _burst(pub, sub, config)
        before = await _jitter(sub)
        for _ in range(bursts):
            await trio.sleep(GAP_S + random.uniform(0, 0.02))
            left, heard, ended, heard_end, held = await _burst(pub, sub, config)
            into.latencies.append(heard - left)
            into.end_latencies.append(heard_end - ended)
            into.queued.append(held)
        after = await _jitter(sub)
    into.jitter_s += after[0] - before[0]
    into.emitted += after[1] - before[1]
    into.target_s += after[2] - before[2]


def report(config: Config, measured: Measured) -> dict[str, Any]:
    emitted = measured.emitted
    return {
        "config": attrs.asdict(config),
        "latency_ms": summarize(measured.latencies, scale=1000),
        "end_latency_ms": summarize(measured.end_latencies, scale=1000),
        "source_queue_ms": summarize(measured.queued, scale=1000),
        "jitter_buffer_mean_ms": measured.jitter_s / emitted * 1000 if emitted else None,
        "jitter_buffer_target_ms": measured.target_s / emitted * 1000 if emitted else None,
        "samples_ms": [round(v * 1000, 1) for v in measured.latencies],
    }


async def _burst(pub: Any, sub: Any, config: Config) -> tuple[float, float, float, float, float]:
    """One burst: when it left the source and was heard; when its end left and was heard."""
    sent = await pub.request(
        "burst",
        lead_ms=config.lead_ms,
        burst_ms=BURST_MS,
        tail_ms=200 if config.queue_ms == 0 else 0,  # with no queue nothing plays silence for us
        frame_ms=config.frame_ms,
        ahead=config.ahead,
        timeout=10,
    )
    left = float(sent["at"]) + float(sent["queued_s"])
    heard = await sub.request("wait_speech", after=float(sent["at"]), within=5, silence_ms=60, timeout=8)
    # The burst's end left the source one burst after its start; the subscriber's last loud
    # frame is the one that carried it.
    return (
        left,
        float(heard["first_loud_at"]),
        left + BURST_MS / 1000,
        float(heard["last_loud_at"]),
        float(sent["queued_s"]),
    )


async def _jitter(sub: Any) -> tuple[float, int, float]:
    """The subscriber's jitter buffer so far: delay and target delay (s, summed over the
    samples emitted), and the samples emitted."""
    stats = await sub.request("stats")
    entries = stats["inbound"]
    return (
        sum(e["jitter_buffer_delay_s"] for e in entries),
        sum(e["jitter_buffer_emitted_count"] for e in entries),
        sum(e["jitter_buffer_target_delay_s"] for e in entries),
    )


#: How the runner's transport hands the caller's audio on (rate, frame ms): before issue 18's
#: media work, and now.
HANDED_ON = {"before": (48_000, 20), "now": (AUDIO_IN_RATE_HZ, AUDIO_IN_FRAME_MS)}
PHASES = 10  # frame phases tried per way (the sentence starts 0..9 ms into a frame)


async def vad_lag(workdir: Any) -> dict[str, dict[str, Any]]:
    """The runner's own side of the way in, with no network: the caller's sentence (bench/livekit.py's)
    fed to the runner's Listener (Silero, 500 ms end-of-turn silence, its pause rule) in the
    frames the transport hands on; how much audio after the sentence's last loud sample was fed
    when the pause and the end of the turn were reported (the frame it came in included: a
    frame is handed on once it is whole). Only the rate and frame size differ between the rows."""
    path, rate, _ = await sentence_file(workdir, lead_s=0.5)
    pcm = np.frombuffer(path.read_bytes(), dtype="<i2").astype(np.float32)
    out: dict[str, dict[str, Any]] = {}
    for name, (to_rate, frame_ms) in HANDED_ON.items():
        audio = np.clip(soxr.resample(pcm, rate, to_rate), -32768, 32767).astype("<i2")
        step = to_rate * frame_ms // 1000
        paused: list[float] = []
        ended: list[float] = []
        for phase_ms in range(PHASES):
            shifted = audio[phase_ms * to_rate // 1000 :]
            speech_end = (int(np.flatnonzero(np.abs(shifted) > SPEECH_LEVEL)[-1]) + 1) / to_rate
            listener = Listener(None, silence_ms=500)  # type: ignore[arg-type]  # feed() never asks the recognizer
            seen: dict[type, float] = {}
            for start in range(0, len(shifted) - step + 1, step):
                for heard in listener.feed(shifted[start : start + step].tobytes(), to_rate):
                    if SpeechEnded not in seen:  # the last pause before the end is the one that counts
                        seen[type(heard)] = (start + step) / to_rate - speech_end
            listener.close()
            paused.append(seen[SpeechPaused])
            ended.append(seen[SpeechEnded])
        out[name] = {
            "rate_hz": to_rate,
            "frame_ms": frame_ms,
            "paused_after_speech_ms": summarize(paused, scale=1000),
            "ended_after_speech_ms": summarize(ended, scale=1000),
        }
    return out


async def run(bursts: int, rounds: int, names: list[str] | None) -> dict[str, Any]:
    """Each configuration ``rounds`` times, in turn, so a change of load meets each alike."""
    began = time.perf_counter()
    load_at_start = os.getloadavg()
    configs = [c for c in CONFIGS if names is None or c.name in names]
    measured = {c.name: Measured() for c in configs}
    async with livekit_env("bench-lkpath-") as (workdir, env):
        runner_side = await vad_lag(workdir)
        cpu_start = cpu_sample()
        for n in range(rounds):
            for config in configs:
                say(f"round {n + 1}/{rounds}, {config.name}: {config.what}")
                await measure(env, config, bursts, measured[config.name])
        cpu_end = cpu_sample()
    return {
        "benchmark": "livekit_path",
        "command": "python -m bench.livekit_path" + (" --quick" if bursts == QUICK_BURSTS else ""),
        "seconds": time.perf_counter() - began,
        "machine": machine_info(),
        "parameters": {"bursts": bursts, "rounds": rounds, "burst_ms": BURST_MS, "gap_s": GAP_S},
        "load_average_at_start": list(load_at_start),
        "load_average_at_end": list(os.getloadavg()),
        "configs": [report(c, measured[c.name]) for c in configs],
        "runner_vad": runner_side,
        "cpu": cpu_report(cpu_start, cpu_end),
    }


def _ms(value: Any) -> str:
    return "-" if value is None else f"{value:.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"{QUICK_ROUNDS} rounds of {QUICK_BURSTS} bursts per configuration",
    )
    parser.add_argument("--only", help="configurations to run, by name, comma-separated")
    args = parser.parse_args()
    names = [n.strip() for n in args.only.split(",")] if args.only else None
    if args.quick:
        result = trio.run(run, QUICK_BURSTS, QUICK_ROUNDS, names)
    else:
        result = trio.run(run, FULL_BURSTS, FULL_ROUNDS, names)
    path = write_results("livekit_path", result)
    say(f"load average at start {result['load_average_at_start']}, at end {result['load_average_at_end']}")
    print_table(
        [
            "configuration",
            "n",
            "p50 ms",
            "p99 ms",
            "min ms",
            "end p50 ms",
            "queued ms",
            "jitter buf ms",
            "what",
        ],
        [
            [
                row["config"]["name"],
                row["latency_ms"].get("n", 0),
                _ms(row["latency_ms"].get("p50")),
                _ms(row["latency_ms"].get("p99")),
                _ms(min(row["samples_ms"], default=None)),
                _ms(row["end_latency_ms"].get("p50")),
                _ms(row["source_queue_ms"].get("p50")),
                _ms(row["jitter_buffer_mean_ms"]),
                row["config"]["what"],
            ]
            for row in result["configs"]
        ],
    )
    print_table(
        ["the runner's VAD, fed as handed on", "pause found, ms of audio after speech", "turn ended"],
        [
            [
                f"{name}: {row['rate_hz'] // 1000} kHz, {row['frame_ms']} ms",
                f"{row['paused_after_speech_ms']['mean']:.0f}",
                f"{row['ended_after_speech_ms']['mean']:.0f}",
            ]
            for name, row in result["runner_vad"].items()
        ],
    )
    say(f"results: {path}")


if __name__ == "__main__":
    main()
