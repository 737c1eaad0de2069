"""Speech benchmark: the embedded defaults (Silero VAD, Whisper, hibari) beside the light ones.

    python -m bench.speech [--quick]

All in this process, on this machine's CPU, nothing over the network:

1. Word error rate of each recognizer (pocketsphinx, the old default; Whisper tiny.en, the
   new one) on each voice: espeak-ng ``en`` (the old default voice), espeak-ng ``en-us+f2``
   (the voice pocketsphinx hears best), hibari "heart" (the new default voice), and hibari
   with white noise 10 dB below the speech. 30 fixed sentences (10 with ``--quick``); text
   normalised on both sides (lower case, no punctuation) and scored with jiwer. Clips are
   decoded one per core at once (pocketsphinx in worker processes, Whisper in threads).
2. TTS time to first audio: from ``synthesize(sentence)`` to its first chunk, espeak-ng
   against hibari, over the same sentences (warm engines).
3. VAD: the cost of one 20 ms frame at 48 kHz (LiveKit's rate) and at 16 kHz, energy against
   Silero; and false starts on a mix of speech, noise, clicks, a chord and a noise burst
   (each non-speech event should give none).
4. Whisper's decode cost, one utterance at a time (a lone turn's wait): the runner's decode
   (the encoder reads the utterance plus ``PAD_S`` of silence) beside the one it replaced
   (faster-whisper's ``transcribe``, whose encoder always reads 30 s), clip by clip on the
   clips of 1., interleaved so that load falls on both alike; each path's WER on them, and the
   load average before and after.

``--whisper-only`` leaves out pocketsphinx (the slowest part) and the VAD figures.

Results go to ``bench/results/speech-<UTC>.json`` and ``speech-latest.json`` (``speech-whisper-*``
with ``--whisper-only``).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import time
from typing import Any

import jiwer
import numpy as np
import trio

from runner.providers.espeak import EspeakTTS
from runner.providers.hibari import HibariTTS
from runner.providers.pocketsphinx import PocketsphinxSTT
from runner.providers.whisper import DECODER_RATE_HZ, WhisperSTT, model_dir
from runner.voice.audio import frames
from runner.voice.vad import EnergyVad, SileroVad

from ._common import machine_info, print_table, say, summarize, write_results

SENTENCES = (
    "Thank you very much, my name is John.",
    "I would like to book a table for two tonight.",
    "What time does the restaurant open in the morning?",
    "Could you send someone to fix the air conditioning?",
    "My flight lands late, so please keep the room for me.",
    "Is breakfast included in the price of the room?",
    "Please call a taxi to the airport after lunch.",
    "The shower in my bathroom is leaking onto the floor.",
    "Can I have a wake up call before sunrise tomorrow?",
    "We need an extra blanket and two more pillows.",
    "How far is the train station from the hotel?",
    "I left my phone charger in the lobby this afternoon.",
    "Do you have a quiet room away from the elevator?",
    "The wireless network in my room is not working.",
    "Where can I park my car for the whole weekend?",
    "Please cancel the spa appointment for my wife.",
    "Is there a pharmacy open near the hotel tonight?",
    "My daughter is allergic to nuts and eggs.",
    "Could you recommend a good museum in the old town?",
    "I would like to check out a little later than usual.",
    "The television remote control does not have batteries.",
    "Can you change my booking to a room with a balcony?",
    "We are celebrating our anniversary this evening.",
    "Please bring two coffees and a glass of orange juice.",
    "The heating is too strong and the window will not open.",
    "Is the swimming pool heated during the winter?",
    "I lost the key card to my room on the beach.",
    "Could the porter help me carry my luggage upstairs?",
    "What is the best way to get to the city center?",
    "Thank you for your help, have a wonderful day.",
)
NOISE_BELOW_SPEECH_DB = 10.0
# Clips decoded at once: one per core.
DECODERS = max(1, os.cpu_count() or 1)
VAD_FRAMES = 2_000


def _normalise(text: str) -> str:
    return " ".join(re.sub(r"[^a-z' ]+", " ", text.lower().replace("-", " ")).split())


def _noisy(pcm: bytes, below_db: float, seed: int) -> bytes:
    x = np.frombuffer(pcm, "<i2").astype(np.float64)
    level = float(np.sqrt(np.mean(x[np.abs(x) > 300] ** 2)))
    noise = np.random.default_rng(seed).normal(0.0, level * 10 ** (-below_db / 20), x.size)
    return np.clip(np.rint(x + noise), -32768, 32767).astype("<i2").tobytes()


async def _speak(tts: Any, text: str) -> tuple[bytes, float]:
    began = time.perf_counter()
    first: float | None = None
    chunks = []
    async for chunk in tts.synthesize(text):
        if first is None:
            first = time.perf_counter() - began
        chunks.append(chunk)
    return b"".join(chunks), first or 0.0


async def _transcribe_all(stt: Any, items: list[tuple[bytes, int]]) -> tuple[list[str], list[float]]:
    """Each clip's normalised words and decode time, ``DECODERS`` decodes at once (one per core).

    Both recognizers decode off the event loop (pocketsphinx in worker processes, Whisper in
    worker threads), so clips decoded side by side use every core; a decode's time is taken
    from when it got its core, not while it queued.
    """
    limiter = trio.CapacityLimiter(DECODERS)
    heard = [""] * len(items)
    seconds = [0.0] * len(items)

    async def one(i: int, pcm: bytes, rate: int) -> None:
        async with limiter:
            began = time.perf_counter()
            heard[i] = _normalise((await stt.transcribe(pcm, rate)).text)
            seconds[i] = time.perf_counter() - began

    async with trio.open_nursery() as nursery:
        for i, (pcm, rate) in enumerate(items):
            nursery.start_soon(one, i, pcm, rate)
    return heard, seconds


async def word_error_rates(sentences: tuple[str, ...], *, whisper_only: bool = False) -> dict[str, Any]:
    voices: dict[str, Any] = {
        "espeak en (old default voice)": EspeakTTS("en"),
        "espeak en-us+f2": EspeakTTS("en-us+f2"),
        "hibari heart (new default voice)": HibariTTS("heart"),
    }
    recognizers: dict[str, Any] = {
        **({} if whisper_only else {"pocketsphinx (old default)": PocketsphinxSTT("en")}),
        "whisper tiny.en (new default)": WhisperSTT("en"),
    }
    for tts in voices.values():
        if hasattr(tts, "warm_up"):
            await tts.warm_up()
    for stt in recognizers.values():
        await stt.warm_up()
    references = [_normalise(s) for s in sentences]
    clips: dict[str, list[tuple[bytes, int]]] = {}
    first_audio: dict[str, list[float]] = {}
    for name, tts in voices.items():
        clips[name] = []
        first_audio[name] = []
        for text in sentences:
            pcm, first = await _speak(tts, text)
            clips[name].append((pcm, tts.sample_rate_hz))
            first_audio[name].append(first)
    clips["hibari heart + white noise 10 dB below"] = [
        (_noisy(pcm, NOISE_BELOW_SPEECH_DB, n), rate)
        for n, (pcm, rate) in enumerate(clips["hibari heart (new default voice)"])
    ]
    table: dict[str, dict[str, Any]] = {}
    for stt_name, stt in recognizers.items():
        table[stt_name] = {}
        for voice, items in clips.items():
            say(f"WER: {stt_name} on {voice}")
            heard, seconds = await _transcribe_all(stt, items)
            table[stt_name][voice] = {
                "wer": jiwer.wer(references, heard),
                "decode_ms": summarize(seconds, scale=1000),
                "examples": [
                    {"said": r, "heard": h} for r, h in list(zip(references, heard, strict=True))[:3]
                ],
            }
    return {
        "sentences": len(sentences),
        "words": sum(len(r.split()) for r in references),
        "wer": table,
        "tts_first_audio_ms": {name: summarize(values, scale=1000) for name, values in first_audio.items()},
        "whisper_decode_cost": await whisper_decode_cost(
            recognizers["whisper tiny.en (new default)"], clips, references
        ),
    }


def _decode_30s_window(model: Any, audio: np.ndarray) -> str:
    """The runner's Whisper decode before the short window (faster-whisper's ``transcribe``)."""
    window = min(30, max(5, math.ceil(audio.size / DECODER_RATE_HZ) + 1))
    segments, _ = model.transcribe(
        audio,
        language="en",
        beam_size=1,
        temperature=0.0,
        condition_on_previous_text=False,
        without_timestamps=True,
        no_speech_threshold=0.6,
        log_prob_threshold=-1.0,
        chunk_length=window,
    )
    words = [s.text for s in segments if not (s.no_speech_prob > 0.6 and s.avg_logprob < -1.0)]
    return " ".join(w.strip() for w in words if w.strip())


async def whisper_decode_cost(
    stt: WhisperSTT, clips: dict[str, list[tuple[bytes, int]]], references: list[str]
) -> dict[str, Any]:
    """Each clip decoded alone by the runner's path and by the 30 s window, interleaved."""
    from runner.providers.whisper import _models, _to_model_rate

    # The old path on the runner's own loaded model: the same weights and the same threads
    # (a second model's idle CPU threads would spin beside the other path's decodes).
    await stt.warm_up()
    old_model = _models.get(model_dir()).model
    await trio.to_thread.run_sync(_decode_30s_window, old_model, np.zeros(DECODER_RATE_HZ, np.float32))
    load_before = os.getloadavg()
    out: dict[str, Any] = {"load_average_before": list(load_before)}
    for voice, items in clips.items():
        say(f"Whisper decode cost: {voice}")
        seconds: dict[str, list[float]] = {"short window (runner)": [], "30 s window (before)": []}
        heard: dict[str, list[str]] = {name: [] for name in seconds}
        for pcm, rate in items:
            audio = _to_model_rate(pcm, rate)
            for name in seconds:
                began = time.perf_counter()
                if name == "short window (runner)":
                    text = await stt.decode(audio)
                else:
                    text = await trio.to_thread.run_sync(_decode_30s_window, old_model, audio)
                seconds[name].append(time.perf_counter() - began)
                heard[name].append(_normalise(text))
        out[voice] = {
            name: {
                "decode_ms": summarize(seconds[name], scale=1000),
                "wer": jiwer.wer(references, heard[name]),
            }
            for name in seconds
        }
        out[voice]["ratio_p50"] = (
            out[voice]["short window (runner)"]["decode_ms"]["p50"]
            / out[voice]["30 s window (before)"]["decode_ms"]["p50"]
        )
    out["load_average_after"] = list(os.getloadavg())
    return out


def _mix_clip(speech: bytes, rate: int) -> tuple[bytes, list[tuple[str, float, float]]]:
    """Speech and non-speech events with quiet between them; each event's span in ms."""
    gap = np.zeros(rate, "<i2")
    rng = np.random.default_rng(11)
    t = np.arange(int(rate * 1.5)) / rate
    chord = (sum(np.sin(2 * np.pi * f * t) for f in (261.6, 329.6, 392.0)) / 3 * 9000).astype("<i2")
    click = np.zeros(rate, "<i2")
    for at in range(rate // 10, rate, rate // 5):
        click[at : at + rate // 200] = 20_000
    events = [
        ("speech", np.frombuffer(speech, "<i2")),
        ("noise", np.clip(rng.normal(0, 3000, rate * 2), -32768, 32767).astype("<i2")),
        ("clicks", click),
        ("chord", chord),
        ("burst", np.clip(rng.normal(0, 10000, rate // 3), -32768, 32767).astype("<i2")),
        ("speech", np.frombuffer(speech, "<i2")),
    ]
    parts = [gap]
    spans = []
    at = gap.size
    for name, x in events:
        spans.append((name, at * 1000 / rate, (at + x.size) * 1000 / rate))
        parts += [x, gap]
        at += x.size + gap.size
    return np.concatenate(parts).astype("<i2").tobytes(), spans


async def vad_figures() -> dict[str, Any]:
    espeak = EspeakTTS("en-us+f2")
    speech, _ = await _speak(espeak, "Thank you very much, my name is John.")
    out: dict[str, Any] = {"per_frame_us": {}, "false_starts": {}}
    for rate in (48_000, 16_000):
        from runner.voice.audio import resample_s16le

        pcm = resample_s16le(speech, espeak.sample_rate_hz, rate)
        clip = (pcm + bytes(2 * rate)) * (1 + VAD_FRAMES * 20 * rate // 1000 * 2 // (len(pcm) + 4 * rate))
        chunks = list(frames(clip, rate, 20))[:VAD_FRAMES]
        for name, make in (("energy", lambda r: EnergyVad(r)), ("silero", lambda r: SileroVad(r))):
            vad = make(rate)
            began = time.perf_counter()
            for chunk in chunks:
                vad.feed(chunk)
            out["per_frame_us"][f"{name} @ {rate // 1000} kHz"] = (
                (time.perf_counter() - began) / len(chunks) * 1e6
            )
            vad.close()
    rate = 16_000
    from runner.voice.audio import resample_s16le

    clip, spans = _mix_clip(resample_s16le(speech, espeak.sample_rate_hz, rate), rate)
    for name, vad in (("energy", EnergyVad(rate)), ("silero", SileroVad(rate))):
        starts = [e.at_ms for f in frames(clip, rate, 20) for e in vad.feed(f) if e.kind == "speech_started"]
        heard = {}
        for event, begin, end in spans:
            hit = any(begin - 100 <= s <= end for s in starts)
            heard.setdefault(event, []).append(hit)
        out["false_starts"][name] = {
            "speech_heard": f"{sum(heard['speech'])}/{len(heard['speech'])}",
            "non_speech_events_heard_as_speech": [e for e in heard if e != "speech" and any(heard[e])],
            "starts": len(starts),
        }
        vad.close()
    return out


async def run(quick: bool, whisper_only: bool = False) -> dict[str, Any]:
    sentences = SENTENCES[:10] if quick else SENTENCES
    began = time.perf_counter()
    machine = machine_info()
    wer = await word_error_rates(sentences, whisper_only=whisper_only)
    vad = None if whisper_only else await vad_figures()
    return {
        "benchmark": "speech",
        "profile": ("quick" if quick else "full") + (", whisper only" if whisper_only else ""),
        "command": "python -m bench.speech"
        + (" --quick" if quick else "")
        + (" --whisper-only" if whisper_only else ""),
        "seconds": time.perf_counter() - began,
        "machine": machine,
        **wer,
        "vad": vad,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="10 sentences instead of 30")
    parser.add_argument(
        "--whisper-only", action="store_true", help="leave out pocketsphinx and the VAD figures"
    )
    args = parser.parse_args()
    result = trio.run(run, args.quick, args.whisper_only)
    # A partial profile does not stand in for the full one (bench.report reads speech-latest).
    path = write_results("speech-whisper" if args.whisper_only else "speech", result)
    voices = list(next(iter(result["wer"].values())))
    print_table(
        ["WER", *voices],
        [[stt, *(f"{row[v]['wer'] * 100:.1f}%" for v in voices)] for stt, row in result["wer"].items()],
    )
    print_table(
        ["decode p50 ms", *voices],
        [[stt, *(f"{row[v]['decode_ms']['p50']:.0f}" for v in voices)] for stt, row in result["wer"].items()],
    )
    cost = result["whisper_decode_cost"]
    print_table(
        ["Whisper decode, one at a time", "path", "p50 ms", "p99 ms", "WER", "p50 ratio"],
        [
            [
                voice,
                name,
                f"{row['decode_ms']['p50']:.0f}",
                f"{row['decode_ms']['p99']:.0f}",
                f"{row['wer'] * 100:.1f}%",
                f"{paths['ratio_p50']:.2f}",
            ]
            for voice, paths in cost.items()
            if isinstance(paths, dict)
            for name, row in paths.items()
            if isinstance(row, dict)
        ],
    )
    say(
        f"load average (1, 5, 15 min): before {cost['load_average_before']}, after {cost['load_average_after']}"
    )
    print_table(
        ["TTS first audio", "p50 ms", "p99 ms"],
        [[k, f"{v['p50']:.1f}", f"{v['p99']:.1f}"] for k, v in result["tts_first_audio_ms"].items()],
    )
    if result["vad"] is not None:
        print_table(
            ["VAD per 20 ms frame", "us"], [[k, f"{v:.0f}"] for k, v in result["vad"]["per_frame_us"].items()]
        )
        print_table(
            ["VAD on the mix", "speech heard", "non-speech heard as speech", "starts"],
            [
                [
                    k,
                    v["speech_heard"],
                    ", ".join(v["non_speech_events_heard_as_speech"]) or "none",
                    v["starts"],
                ]
                for k, v in result["vad"]["false_starts"].items()
            ],
        )
    say(f"results: {path}")


if __name__ == "__main__":
    main()
