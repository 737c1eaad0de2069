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
import soxr

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


def _samples(pcm: bytes) -> np.ndarray:
    if len(pcm) % _SAMPLE_BYTES:
        raise ValueError(f"s16le PCM needs an even byte count, got {len(pcm)} bytes")
    return np.frombuffer(pcm, dtype="<i2")


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


def read_wav(path: str | os.PathLike[str]) -> tuple[bytes, int]:
    """A 16-bit PCM WAV file as s16le mono and its rate (channels are mixed down).

    Raises:
        ValueError: The file is not 16-bit PCM WAV.
    """
    try:
        with wave.open(os.fspath(path), "rb") as w:
            width, channels, rate = w.getsampwidth(), w.getnchannels(), w.getframerate()
            pcm = w.readframes(w.getnframes())
    except (wave.Error, EOFError) as exc:
        raise ValueError(f"{os.fspath(path)} is not a PCM WAV file: {exc}") from exc
    if width != _SAMPLE_BYTES:
        raise ValueError(f"{os.fspath(path)} holds {8 * width}-bit samples; 16-bit PCM is read")
    if channels > 1:
        mixed = np.frombuffer(pcm, dtype="<i2").reshape(-1, channels).mean(axis=1)
        pcm = mixed.round().astype("<i2").tobytes()
    return pcm, rate


class Resampler:
    """A streaming resampler for s16le mono PCM: one soxr stream (libsoxr, high quality).

    Band-limited, so downsampling does not fold high frequencies into the speech band, and
    delay-compensated: the output lines up with the input, and a whole stream gives
    ``ceil(n * to_hz / from_hz)`` samples for ``n`` in. Feeding audio in pieces gives the
    same samples as feeding it at once to within 2 LSB (soxr works in blocks). Use one per
    stream: it keeps the filter's state between pieces.

    Args:
        from_hz: the input rate.
        to_hz: the output rate.
    """

    def __init__(self, from_hz: int, to_hz: int) -> None:
        if from_hz <= 0 or to_hz <= 0:
            raise ValueError(f"sample rates must be positive, got {from_hz} and {to_hz}")
        self.from_hz = from_hz
        self.to_hz = to_hz
        self._stream = (
            None if from_hz == to_hz else soxr.ResampleStream(from_hz, to_hz, 1, dtype="int16", quality="HQ")
        )
        self._flushed = False

    def process(self, pcm: bytes) -> bytes:
        """Feed input and return every output sample that it completes."""
        if self._flushed:
            raise RuntimeError("Resampler.process after flush")
        x = _samples(pcm)
        if self._stream is None:
            return bytes(pcm)
        out: bytes = self._stream.resample_chunk(x.astype(np.int16)).astype("<i2").tobytes()
        return out

    def flush(self) -> bytes:
        """End the stream: return the outputs still owed for the input's last samples."""
        if self._flushed:
            return b""
        self._flushed = True
        if self._stream is None:
            return b""
        out: bytes = self._stream.resample_chunk(np.zeros(0, np.int16), last=True).astype("<i2").tobytes()
        return out


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
