"""The playground's hands-free detector (``runner/playground/vad.js``) beside Silero.

    python -m bench.playground_vad

The page decides when the person speaks (the agent WebSocket has no server-side detection).
It could run Silero in the browser (the npm package ``@ricky0123/vad-web``, whose model is the
one ``runner.voice.vad.SileroVad`` runs here) or its own level detector. This measures the
second against the first, on the same 16 kHz clip (bench.speech's: speech, steady noise,
clicks, a chord, a noise burst, speech, a second of quiet between each), in the same run:

1. which events each detector opens a recording for (vad.js in Node, fed the page's 512-sample
   pieces; Silero in this process, 20 ms frames), and when, against each event's true span;
2. the cost of one 20 ms frame for each, and their ratio;
3. the bytes the page serves for each (vad.js, against the npm packages' files the page would
   need: the bundle, one model, one ONNX runtime WebAssembly build; their sizes are written
   below, measured with ``npm pack --dry-run`` on @ricky0123/vad-web 0.0.31 and
   onnxruntime-web 1.31.1, as nothing here downloads).

vad.js opens a recording for any sound with the loudness of speech: whether it held words is
the recognizer's to say (``barge_in``), and a recording without them is discarded, so a false
start costs a moment of recognition, never a turn. Results go to
``bench/results/playground_vad-<UTC>.json``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import trio

from runner.providers.espeak import EspeakTTS
from runner.voice.audio import frames, resample_s16le
from runner.voice.vad import SileroVad

from ._common import machine_info, print_table, write_results
from .speech import _mix_clip, _speak

VAD_JS = Path(__file__).resolve().parent.parent / "runner" / "playground" / "vad.js"
RATE = 16_000
# What the page would serve for @ricky0123/vad-web (npm pack --dry-run, bytes unpacked).
NPM_FILES = {
    "@ricky0123/vad-web 0.0.31 dist/bundle.min.js": 69_345,
    "@ricky0123/vad-web 0.0.31 dist/silero_vad_v5.onnx": 2_327_524,
    "onnxruntime-web 1.31.1 dist/ort-wasm-simd-threaded.wasm": 14_848_852,
}

_NODE = r"""
const { LevelDetector } = require(process.argv[1]);
const chunks = [];
process.stdin.on("data", (c) => chunks.push(c));
process.stdin.on("end", () => {
  const raw = Buffer.concat(chunks);
  const pcm = new Int16Array(raw.buffer, raw.byteOffset, raw.length >> 1);
  const samples = Float32Array.from(pcm, (v) => v / 32768);
  // Once over the clip first, so the figure is the warm page's, not the JIT's first pass.
  const warm = new LevelDetector({ rate: 16000 });
  for (let at = 0; at + 512 <= samples.length; at += 512) warm.push(samples.subarray(at, at + 512));
  const detector = new LevelDetector({ rate: 16000 });
  const events = [];
  let busy = 0n;
  for (let at = 0; at + 512 <= samples.length; at += 512) {
    const began = process.hrtime.bigint();
    const out = detector.push(samples.subarray(at, at + 512));
    busy += process.hrtime.bigint() - began;
    for (const e of out) if (e.type !== "audio") events.push([e.type, ((at + 512) / 16) | 0]);
  }
  const frames = Math.floor(samples.length / 320);
  console.log(JSON.stringify({ events, per_frame_us: Number(busy) / 1000 / frames }));
});
"""


def _vad_js(clip: bytes) -> dict[str, Any]:
    node = shutil.which("node")
    if node is None:
        raise SystemExit("bench.playground_vad needs node (the page's detector runs in it)")
    done = subprocess.run(
        [node, "-e", _NODE, str(VAD_JS)], input=clip, capture_output=True, check=True, timeout=120
    )
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def _spans_heard(starts: list[float], spans: list[tuple[str, float, float]]) -> dict[str, Any]:
    heard: dict[str, list[Any]] = {}
    for event, begin, end in spans:
        hit = [s for s in starts if begin - 100 <= s <= end + 100]
        heard.setdefault(event, []).append(round(hit[0] - begin) if hit else None)
    return heard


async def run() -> dict[str, Any]:
    espeak = EspeakTTS("en-us+f2")
    speech, _ = await _speak(espeak, "Thank you very much, my name is John.")
    clip, spans = _mix_clip(resample_s16le(speech, espeak.sample_rate_hz, RATE), RATE)

    js = _vad_js(clip)
    js_starts = [at for kind, at in js["events"] if kind == "start"]
    js_ends = [at for kind, at in js["events"] if kind == "end"]

    pieces = list(frames(clip, RATE, 20))
    warm = SileroVad(RATE)
    for piece in pieces:
        warm.feed(piece)
    warm.close()
    silero = SileroVad(RATE)
    began = time.perf_counter()
    silero_events = [e for f in pieces for e in silero.feed(f)]
    silero_us = (time.perf_counter() - began) / len(pieces) * 1e6
    silero.close()
    silero_starts = [e.at_ms for e in silero_events if e.kind == "speech_started"]

    speech_ends = [end for name, _, end in spans if name == "speech"]
    js_bytes = VAD_JS.stat().st_size
    npm_bytes = sum(NPM_FILES.values())
    return {
        "benchmark": "playground_vad",
        "command": "python -m bench.playground_vad",
        "machine": machine_info(),
        "load_average": list(os.getloadavg()),
        "clip_seconds": len(clip) / 2 / RATE,
        "events": [[name, round(begin), round(end)] for name, begin, end in spans],
        # Per event: ms from its true start to the detector's start (None: no recording opened).
        "onset_ms": {"vad.js": _spans_heard(js_starts, spans), "silero": _spans_heard(silero_starts, spans)},
        # After each utterance's last sample, when vad.js ended its recording.
        "vad_js_end_after_speech_ms": [
            round(min((e for e in js_ends if e >= end), default=float("nan")) - end) for end in speech_ends
        ],
        "per_frame_us": {"vad.js": js["per_frame_us"], "silero": silero_us},
        "cost_ratio_silero_over_vad_js": silero_us / js["per_frame_us"],
        "served_bytes": {"vad.js": js_bytes, "@ricky0123/vad-web (bundle, model, runtime)": npm_bytes},
        "size_ratio": npm_bytes / js_bytes,
    }


def main() -> None:
    result = trio.run(run)
    path = write_results("playground_vad", result)
    heard = result["onset_ms"]
    print_table(
        ["event", "span ms", "vad.js start (ms after)", "silero start (ms after)"],
        [
            [name, f"{begin}-{end}", str(heard["vad.js"][name][i]), str(heard["silero"][name][i])]
            for name, begin, end, i in (
                (name, begin, end, sum(1 for e in result["events"][:k] if e[0] == name))
                for k, (name, begin, end) in enumerate(result["events"])
            )
        ],
    )
    cost = result["per_frame_us"]
    print(
        f"per 20 ms frame: vad.js {cost['vad.js']:.2f} us, silero {cost['silero']:.0f} us"
        f" (x{result['cost_ratio_silero_over_vad_js']:.0f});"
        f" vad.js ends a recording {result['vad_js_end_after_speech_ms']} ms after the speech;"
        f" served: vad.js {result['served_bytes']['vad.js']:,} B, the npm detector"
        f" {sum(NPM_FILES.values()):,} B (x{result['size_ratio']:.0f});"
        f" load average {result['load_average'][0]:.1f}"
    )
    print(f"results: {path}")


if __name__ == "__main__":
    main()
