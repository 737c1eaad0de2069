"""Small pure helpers over 16-bit signed little-endian mono PCM (``s16le``).

No Trio and no I/O beyond ``write_wav``: every function here is a plain computation
that the turn engine, the providers and the tests share.
"""

from __future__ import annotations

import math
import os
import wave
from collections.abc import Iterator

import numpy as np

__all__ = [
    "Resampler",
    "frames",
    "pcm_seconds",
    "resample_s16le",
    "rms",
    "rms_dbfs",
    "write_wav",
]

_SAMPLE_BYTES = 2
# Zero crossings of the windowed sinc on each side: 16 keeps the band flat to 6.5 kHz
# at 16 kHz output (8 lost 1 dB there) for about 50 taps per output sample.
_ZERO_CROSSINGS = 16
# Cut a little below the target Nyquist so the window's transition band does not alias.
_CUTOFF_FRACTION = 0.92
# Outputs computed per numpy pass: small enough for the tap matrix to stay in cache.
_BLOCK_OUTPUTS = 2048
# Rate pairs with at most this many distinct phases get a precomputed weight table
# (every rate pair between 8, 16, 22.05, 24, 44.1 and 48 kHz does).
_MAX_TABLE_PHASES = 4096


def _samples(pcm: bytes) -> np.ndarray:
    if len(pcm) % _SAMPLE_BYTES:
        raise ValueError(f"s16le PCM needs an even byte count, got {len(pcm)} bytes")
    return np.frombuffer(pcm, dtype="<i2")


def _to_s16le(x: np.ndarray) -> bytes:
    return bytes(np.clip(np.rint(x), -32768, 32767).astype("<i2").tobytes())


def pcm_seconds(nbytes: int, rate: int) -> float:
    """Duration of ``nbytes`` of s16le mono PCM at ``rate`` Hz, in seconds."""
    if rate <= 0:
        raise ValueError(f"sample rate must be positive, got {rate}")
    return nbytes / (_SAMPLE_BYTES * rate)


def rms(pcm: bytes) -> float:
    """Root mean square of the samples, on the int16 scale (0 to 32768); 0.0 when empty."""
    x = _samples(pcm)
    if x.size == 0:
        return 0.0
    return float(np.sqrt(np.mean(np.square(x, dtype=np.float64))))


def rms_dbfs(pcm: bytes, *, floor_db: float = -100.0) -> float:
    """Level of ``pcm`` in dB relative to full scale, never below ``floor_db``."""
    level = rms(pcm)
    if level <= 0.0:
        return floor_db
    return max(floor_db, 20.0 * math.log10(level / 32768.0))


def frames(pcm: bytes, rate: int, ms: float) -> Iterator[bytes]:
    """Cut ``pcm`` into consecutive frames of ``ms`` milliseconds.

    A trailing partial frame is dropped: callers that stream keep it and prepend it
    to the next chunk.

    Raises:
        ValueError: if a frame would hold no whole sample.
    """
    _samples(pcm)
    size = int(rate * ms / 1000) * _SAMPLE_BYTES
    if size <= 0:
        raise ValueError(f"a {ms} ms frame at {rate} Hz holds no sample")
    for start in range(0, len(pcm) - size + 1, size):
        yield pcm[start : start + size]


def write_wav(path: str | os.PathLike[str], pcm: bytes, rate: int) -> None:
    """Write s16le mono ``pcm`` at ``rate`` Hz as a WAV file (for listening and forensics)."""
    _samples(pcm)
    with wave.open(os.fspath(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(_SAMPLE_BYTES)
        w.setframerate(rate)
        w.writeframes(pcm)


class Resampler:
    """A streaming band-limited resampler for s16le mono PCM.

    Windowed-sinc interpolation (Hann window) with the cutoff at the lower of the two
    Nyquist frequencies, so downsampling does not fold high frequencies into the speech
    band as linear interpolation would. Output sample ``k`` sits exactly at input time
    ``k * from_hz / to_hz`` (integer arithmetic, no drift), and feeding audio in pieces
    gives the same bytes as feeding it at once.

    Args:
        from_hz: the input rate.
        to_hz: the output rate.
    """

    def __init__(self, from_hz: int, to_hz: int) -> None:
        if from_hz <= 0 or to_hz <= 0:
            raise ValueError(f"sample rates must be positive, got {from_hz} and {to_hz}")
        self.from_hz = from_hz
        self.to_hz = to_hz
        g = math.gcd(from_hz, to_hz)
        self._num = from_hz // g  # input step per output sample is _num / _den
        self._den = to_hz // g
        # Cutoff in cycles per input sample.
        self._fc = 0.5 * min(1.0, to_hz / from_hz) * _CUTOFF_FRACTION
        self._half = math.ceil(_ZERO_CROSSINGS / (2.0 * self._fc))
        self._taps = np.arange(-self._half + 1, self._half + 1)
        self._table = (
            self._weights(np.arange(self._den) / self._den) if self._den <= _MAX_TABLE_PHASES else None
        )
        # Samples before the stream are zeros; the buffer's first index is ``_base``.
        self._buf = np.zeros(self._half, dtype=np.float64)
        self._base = -self._half
        self._n_in = 0
        self._n_out = 0
        self._flushed = False

    def process(self, pcm: bytes) -> bytes:
        """Feed input and return every output sample that it completes."""
        if self._flushed:
            raise RuntimeError("Resampler.process after flush")
        x = _samples(pcm)
        if self.from_hz == self.to_hz:
            self._n_in += x.size
            return bytes(pcm)
        self._buf = np.concatenate([self._buf, x.astype(np.float64)])
        self._n_in += x.size
        return self._emit(limit=None)

    def flush(self) -> bytes:
        """End the stream: return the outputs still owed for the input's last samples."""
        if self._flushed:
            return b""
        self._flushed = True
        if self.from_hz == self.to_hz:
            return b""
        self._buf = np.concatenate([self._buf, np.zeros(self._half)])
        owed = -(-self._n_in * self._den // self._num)  # ceil(n_in * to / from)
        return self._emit(limit=owed)

    def _weights(self, frac: np.ndarray) -> np.ndarray:
        dist = frac[:, None] - self._taps[None, :]
        w = 2.0 * self._fc * np.sinc(2.0 * self._fc * dist) * (0.5 + 0.5 * np.cos(np.pi * dist / self._half))
        unit: np.ndarray = w / w.sum(axis=1, keepdims=True)  # unit gain at DC
        return unit

    def _emit(self, limit: int | None) -> bytes:
        end = self._base + self._buf.size - 1  # last input index held
        # Output k is complete once floor(k * num / den) + half <= end.
        last_ok = ((end - self._half + 1) * self._den - 1) // self._num
        stop = last_ok + 1 if limit is None else min(limit, last_ok + 1)
        if stop <= self._n_out:
            return b""
        parts = []
        for first in range(self._n_out, stop, _BLOCK_OUTPUTS):
            k = np.arange(first, min(stop, first + _BLOCK_OUTPUTS), dtype=np.int64)
            whole = (k * self._num) // self._den
            phase = (k * self._num) % self._den
            weights = self._table[phase] if self._table is not None else self._weights(phase / self._den)
            idx = whole[:, None] + self._taps[None, :]
            parts.append(np.sum(self._buf[idx - self._base] * weights, axis=1))
        self._n_out = stop
        # Keep only what later outputs can still reach.
        keep_from = (stop * self._num) // self._den - self._half + 1
        drop = max(0, keep_from - self._base)
        if drop:
            self._buf = self._buf[drop:]
            self._base += drop
        return _to_s16le(np.concatenate(parts))


def resample_s16le(pcm: bytes, from_hz: int, to_hz: int) -> bytes:
    """Resample a whole s16le mono clip from ``from_hz`` to ``to_hz``.

    The result holds ``ceil(n * to_hz / from_hz)`` samples for ``n`` input samples, so
    durations are kept to within one output sample. See ``Resampler`` for the method.
    """
    if from_hz == to_hz:
        _samples(pcm)
        return bytes(pcm)
    r = Resampler(from_hz, to_hz)
    return r.process(pcm) + r.flush()
