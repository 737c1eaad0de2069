"""Has the caller finished their turn? Pipecat's Smart Turn v3.2 judges it from the audio alone.

The model (BSD-2-Clause, an 8 MB int8 ONNX graph on a Whisper-tiny encoder, 23 languages) reads
the last 8 s of the caller's speech and gives the probability that they are done: a sentence
that falls at its end rates high, one cut off mid-phrase ("a table for ...") rates low. It
ships inside the ``pipecat-ai`` 1.14.0 wheel, installed without its dependencies
(``.ci/install-smart-turn``; docs/speech.md says what they would add): only the model file is
used, read from the installed package and never fetched, and its SHA-256 is checked
before it is loaded, as the Whisper weights are. When it is not installed, :func:`load`
returns ``None`` and the listener keeps the fixed silence rule.

Features are Whisper's 80-band log-mel of the zero-mean, unit-variance waveform, left-padded
with silence to 8 s, computed with faster-whisper's feature extractor (the same as Pipecat's
own to about 1e-7). A judgment costs about 160-190 ms of CPU on one thread; it blocks, so the
event loop calls :meth:`SmartTurn.rate` (a worker thread) and never :meth:`SmartTurn.probability`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import threading
from pathlib import Path
from typing import Any

import numpy as np
import soxr
import trio

__all__ = [
    "MODEL_FILE",
    "MODEL_SHA256",
    "ModelRefused",
    "SmartTurn",
    "load",
    "model_path",
]

#: Where the model lives inside the ``pipecat`` package of the ``pipecat-ai`` wheel.
MODEL_FILE = "audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx"
#: The SHA-256 of ``smart-turn-v3.2-cpu.onnx`` in ``pipecat-ai`` 1.14.0: any other content is refused.
MODEL_SHA256 = "2bb026316b14a660486a75b1733cd3fbab8c2fd0314dc9af7be49f8cca967e4f"

_RATE_HZ = 16_000
_WINDOW_S = 8
_NORM_EPS = 1e-7


class ModelRefused(RuntimeError):
    """The model file is not the one recorded in :data:`MODEL_SHA256`."""


def model_path() -> Path | None:
    """The installed model file, or ``None`` when ``pipecat-ai`` is not installed.

    The package is found without importing it (importing ``pipecat`` needs its own
    dependencies, which the runner does not install).
    """
    spec = importlib.util.find_spec("pipecat")
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        path = Path(root) / MODEL_FILE
        if path.is_file():
            return path
    return None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class SmartTurn:
    """The loaded model; :meth:`probability` may be called from several threads at once.

    Args:
        path: The ONNX file (checked against :data:`MODEL_SHA256` before loading).

    Raises:
        ModelRefused: the file's SHA-256 differs.
    """

    def __init__(self, path: Path) -> None:
        import onnxruntime as ort
        from faster_whisper.feature_extractor import FeatureExtractor

        actual = _sha256(path)
        if actual != MODEL_SHA256:
            raise ModelRefused(
                f"the Smart Turn model {path} has SHA-256 {actual}, not the recorded {MODEL_SHA256}: "
                "refusing to load it"
            )
        options = ort.SessionOptions()
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.inter_op_num_threads = 1
        options.intra_op_num_threads = 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.path = path
        self._session: Any = ort.InferenceSession(
            str(path), sess_options=options, providers=["CPUExecutionProvider"]
        )
        self._features: Any = FeatureExtractor(feature_size=80, chunk_length=_WINDOW_S)

    def probability(self, pcm: bytes, sample_rate_hz: int) -> float:
        """How likely the speaker of ``pcm`` (s16le mono, ending now) has finished. Blocks."""
        x = np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768.0
        if sample_rate_hz != _RATE_HZ:
            x = soxr.resample(x, sample_rate_hz, _RATE_HZ, quality="HQ").astype(np.float32)
        window = np.zeros(_RATE_HZ * _WINDOW_S, dtype=np.float32)
        tail = x[-window.size :]
        if tail.size:
            window[-tail.size :] = tail
        window = (window - window.mean()) / np.sqrt(window.var() + _NORM_EPS)
        features = self._features(window, padding=0).astype(np.float32)[np.newaxis]
        (out,) = self._session.run(None, {"input_features": features})
        return float(np.asarray(out).reshape(-1)[0])

    async def rate(self, pcm: bytes, sample_rate_hz: int) -> float:
        """:meth:`probability`, in a worker thread (the event loop's call)."""
        return await trio.to_thread.run_sync(self.probability, pcm, sample_rate_hz)


_lock = threading.Lock()
_loaded: dict[Path, SmartTurn] = {}


def load(path: Path | None = None) -> SmartTurn | None:
    """The model, loaded once per process; ``None`` when it is not installed. Blocks (about 0.2 s).

    Args:
        path: The ONNX file; the installed package's when ``None``.

    Raises:
        ModelRefused: the file's SHA-256 differs.
    """
    path = path or model_path()
    if path is None:
        return None
    with _lock:
        model = _loaded.get(path)
        if model is None:
            model = _loaded[path] = SmartTurn(path)
        return model
