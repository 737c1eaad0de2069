"""Offline speech to text with PocketSphinx 5 and the US English model inside its wheel.

A ``pocketsphinx.Decoder`` is not safe to share between threads, costs about 0.3 s and
about 90 MB to create, decodes about four times faster than real time, and holds the GIL
while it decodes. So each utterance or stream borrows one decoder from a small pool, and
has its feature state reset on the way out, so a transcript never depends on whichever
call used the decoder before.

A whole utterance is decoded in one call that holds the GIL for its full length (in a
thread, a 3-sentence decode froze the runner's event loop for over a second), so it runs
in a ``trio_parallel`` worker process. The worker keeps its own pool of decoders warm
between calls; it starts on first use or ``warm_up`` (about 0.9 s), exits after 10 idle
minutes and when the runner exits. A stream feeds its decoder in short slices from a
Trio worker thread, so the GIL is free between slices, for its partial hypotheses; its
``finish`` decodes the whole utterance in the worker process as ``transcribe`` does, since
the running hypothesis hears worse.
"""

from __future__ import annotations

import threading

import numpy as np
import pocketsphinx
import trio
import trio_parallel

from ..voice.audio import Resampler, pcm_seconds
from ._registry import RecognizerProvider
from ._stream import RecognizerStream, count_decode
from ._types import ProviderError, Transcript

__all__ = ["PocketsphinxSTT", "PocketsphinxStream", "UnsupportedLanguage"]

DECODER_RATE_HZ = 16_000
# Rates that callers' audio arrives at (telephony, wideband, espeak, common TTS,
# CD and WebRTC); all are resampled to the model's 16 kHz.
SUPPORTED_RATES_HZ = (8_000, 16_000, 22_050, 24_000, 44_100, 48_000)
# Idle decoders kept for reuse; each holds about 90 MB, so keep few.
_MAX_IDLE_DECODERS = 2
# Whole-utterance decoding normalises over all frames, and a long stretch of quiet
# noise around the speech skews that (measured over 15 utterances with 1 s of faint
# noise each side: mean word overlap 0.53 untrimmed, 0.75 trimmed). Frames this far
# below the loudest are trimmed from both ends, keeping a margin of context.
_TRIM_BELOW_PEAK_DB = 35.0
_TRIM_MARGIN_S = 0.3
# A stream normalises with a running cepstral mean whose start value suits quiet speech
# (about -40 dBFS); at today's louder levels the first seconds decode badly. So a stream
# holds its first audio back, sets c0 of the mean from the median level of its loud
# frames, then decodes. The line was fitted to whole-utterance c0 of espeak voices at
# levels 40 dB apart, then lowered 5 where streamed accuracy was best (measured over
# 48 streamed utterances: mean word overlap 0.33 unprimed, 0.62 primed, whatever the
# leading silence; whole-utterance decoding of the same audio: about 0.9).
_PRIME_S = 0.5
_C0_PER_DB = 1.073
_C0_AT_0_DB = -14.0
_LOUD_WITHIN_DB = 30.0
# Audio whose loudest 10 ms frame is below this (an RMS of 10 LSB, about -70 dBFS) holds
# no speech; pocketsphinx would still hear a word in it ("it", "dog").
_SILENT_BELOW_DB = 20.0
# A stream hands the decoder at most this much 16 kHz audio per call, which holds the
# GIL for about a quarter of it (about 12 ms).
_SLICE_BYTES = DECODER_RATE_HZ * 2 // 20


class UnsupportedLanguage(ProviderError, ValueError):
    """The recognizer has no model for the language (code ``invalid_settings``)."""

    def __init__(self, message: str) -> None:
        super().__init__("invalid_settings", message)


class _DecoderPool:
    """Idle decoders, shared by every ``PocketsphinxSTT``; used from worker threads."""

    def __init__(self, max_idle: int) -> None:
        self._lock = threading.Lock()
        self._idle: list[tuple[pocketsphinx.Decoder, bool]] = []  # (decoder, mid-utterance)
        self._max_idle = max_idle

    def _create(self) -> pocketsphinx.Decoder:
        try:
            return pocketsphinx.Decoder(samprate=DECODER_RATE_HZ, loglevel="FATAL")
        except (RuntimeError, ValueError) as exc:
            raise ProviderError("unavailable", "pocketsphinx could not load its model") from exc

    def acquire(self) -> pocketsphinx.Decoder:
        """Take an idle decoder or create one. Blocks: call from a worker thread."""
        with self._lock:
            entry = self._idle.pop() if self._idle else None
        if entry is None:
            return self._create()
        decoder, mid_utterance = entry
        if mid_utterance:
            try:
                decoder.end_utt()
            except RuntimeError:
                return self._create()
        # Normalisation state outlives utterances (even set_cmn leaves some behind and
        # changed results); reinit_feat makes the decoder decode like a new one (<0.1 ms).
        decoder.reinit_feat()
        return decoder

    def release(self, decoder: pocketsphinx.Decoder, *, mid_utterance: bool = False) -> None:
        """Give a decoder back; ``mid_utterance`` ones are ended by the next ``acquire``.

        Never blocks, so it may run on the Trio thread.
        """
        with self._lock:
            if len(self._idle) < self._max_idle:
                self._idle.append((decoder, mid_utterance))

    def fill(self, count: int) -> None:
        """Create decoders until ``count`` are idle (at most the pool's size). Blocks."""
        target = min(count, self._max_idle)
        while True:
            with self._lock:
                if len(self._idle) >= target:
                    return
            decoder = self._create()
            self.release(decoder)


_pool = _DecoderPool(_MAX_IDLE_DECODERS)


def _fill_pool(count: int) -> None:
    # A module-level function, so a worker process can be told to run it.
    _pool.fill(count)


def _check_rate(sample_rate_hz: int) -> None:
    if sample_rate_hz not in SUPPORTED_RATES_HZ:
        raise ValueError(
            f"pocketsphinx takes PCM at {', '.join(map(str, SUPPORTED_RATES_HZ))} Hz, got {sample_rate_hz}"
        )


def _hypothesis(decoder: pocketsphinx.Decoder) -> str:
    hyp = decoder.hyp()
    return hyp.hypstr.strip() if hyp is not None else ""


def _frame_db(x: np.ndarray) -> np.ndarray:
    # Level of each 10 ms frame at 16 kHz, in dB over one LSB squared.
    step = DECODER_RATE_HZ // 100
    n = x.size // step
    power = np.mean(np.square(x[: n * step].reshape(n, step), dtype=np.float64), axis=1)
    level: np.ndarray = 10.0 * np.log10(power + 1.0)
    return level


def _trim_quiet_ends(audio: bytes) -> bytes:
    x = np.frombuffer(audio, dtype="<i2")
    step = DECODER_RATE_HZ // 100
    db = _frame_db(x)
    if db.size == 0:
        return audio
    loud = np.flatnonzero(db >= db.max() - _TRIM_BELOW_PEAK_DB)
    margin = int(_TRIM_MARGIN_S * 100)
    first = max(0, int(loud[0]) - margin) * step
    last = min(x.size, (int(loud[-1]) + 1 + margin) * step)
    return x[first:last].tobytes()


def _prime_cmn(decoder: pocketsphinx.Decoder, audio: bytes) -> None:
    db = _frame_db(np.frombuffer(audio, dtype="<i2"))
    if db.size == 0 or db.max() <= 0.0:
        return  # no signal yet: keep the model's own start value
    level = float(np.median(db[db >= db.max() - _LOUD_WITHIN_DB]))
    cmn = decoder.get_cmn().split(",")
    cmn[0] = f"{_C0_PER_DB * level + _C0_AT_0_DB:.3f}"
    decoder.set_cmn(",".join(cmn))


def _is_silent(audio: bytes) -> bool:
    db = _frame_db(np.frombuffer(audio, dtype="<i2"))
    return db.size == 0 or db.max() < _SILENT_BELOW_DB


def _decode_whole(pcm: bytes, sample_rate_hz: int) -> str:
    # Runs in a worker process: ``_pool`` there is that process's own.
    resampler = Resampler(sample_rate_hz, DECODER_RATE_HZ)
    audio = resampler.process(pcm) + resampler.flush()
    if _is_silent(audio):
        return ""
    audio = _trim_quiet_ends(audio)
    decoder = _pool.acquire()
    try:
        decoder.start_utt()
        # full_utt: normalise over the whole utterance rather than a running estimate.
        decoder.process_raw(audio, full_utt=True)
        decoder.end_utt()
        text = _hypothesis(decoder)
    except RuntimeError as exc:
        # A decoder that failed mid-way is not returned to the pool.
        raise ProviderError("provider_failed", "pocketsphinx failed to decode") from exc
    _pool.release(decoder)
    return text


async def _transcribe_whole(pcm: bytes, sample_rate_hz: int) -> str:
    """One utterance's words, decoded whole in the worker process."""
    if not pcm:
        await trio.lowlevel.checkpoint()
        return ""
    count_decode(PocketsphinxSTT.provider)
    try:
        text: str = await trio_parallel.run_sync(_decode_whole, pcm, sample_rate_hz)
    except trio_parallel.BrokenWorkerError as exc:
        raise ProviderError("provider_failed", "pocketsphinx's worker died") from exc
    return text


class PocketsphinxSTT:
    """Speech to text on this machine with PocketSphinx's US English model.

    Accuracy is modest (it is a small 2015-era model), but it needs no network and no
    download, which makes it the embedded default and the tests' recognizer.

    Args:
        language: ``None`` or ``"en"`` (also ``"en-US"``); nothing else has a model.

    Raises:
        UnsupportedLanguage: for any other language (code ``invalid_settings``).
    """

    provider = "pocketsphinx"
    sample_rates_hz = SUPPORTED_RATES_HZ

    def __init__(self, language: str | None = None) -> None:
        if not self.supports_language(language):
            raise UnsupportedLanguage(f"pocketsphinx has only an English model, not {language!r}")
        self.language: str | None = language

    def __repr__(self) -> str:
        return f"PocketsphinxSTT(language={self.language!r})"

    @staticmethod
    def supports_language(language: str | None) -> bool:
        """Whether the recognizer can take ``language`` (``None`` means English)."""
        return language is None or language.lower() in ("en", "en-us")

    async def warm_up(self, decoders: int = 1) -> None:
        """Create up to ``decoders`` idle decoders now, so the first utterance does not wait.

        Starts the worker process that decodes whole utterances (about 0.5 s) with one
        decoder in it, and fills this process's pool for streams. At most two are kept
        idle in each; each costs about 0.3 s and 90 MB.
        """
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio_parallel.run_sync, _fill_pool, 1)
            nursery.start_soon(trio.to_thread.run_sync, _pool.fill, decoders)

    async def transcribe(self, pcm: bytes, sample_rate_hz: int, *, prompt: str = "") -> Transcript:
        """Transcribe one whole utterance of 16-bit mono PCM at ``sample_rate_hz`` (``prompt``
        is ignored: the decoder's language model takes no hint).

        Raises:
            ValueError: the rate is not one of ``sample_rates_hz`` or the PCM is not whole
                samples.
            ProviderError: the decoder failed (``provider_failed``) or could not load its
                model (``unavailable``).
        """
        _check_rate(sample_rate_hz)
        seconds = pcm_seconds(len(pcm), sample_rate_hz)
        if len(pcm) % 2:
            raise ValueError(f"s16le PCM needs an even byte count, got {len(pcm)} bytes")
        return Transcript(text=await _transcribe_whole(pcm, sample_rate_hz), audio_seconds=seconds)

    def open_stream(self, sample_rate_hz: int) -> PocketsphinxStream:
        """Start a streaming recognition of one utterance at ``sample_rate_hz``.

        Use it as ``async with stt.open_stream(16000) as stream:`` so its decoder returns
        to the pool even when the utterance is abandoned.

        Raises:
            ValueError: the rate is not one of ``sample_rates_hz``.
        """
        _check_rate(sample_rate_hz)
        return PocketsphinxStream(sample_rate_hz)


class PocketsphinxStream(RecognizerStream):
    """One utterance recognised as its audio arrives; made by ``PocketsphinxSTT.open_stream``.

    Feed audio in any chunk sizes; ``feed`` returns the partial hypothesis whenever it
    changes, and ``finish`` returns the final transcript. One task at a time.
    """

    def __init__(self, sample_rate_hz: int) -> None:
        super().__init__(sample_rate_hz)
        self._resampler = Resampler(sample_rate_hz, DECODER_RATE_HZ)
        self._decoder: pocketsphinx.Decoder | None = None
        self._held: list[bytes] = []  # 16 kHz audio kept back until the stream is primed
        self._held_bytes = 0
        self._last = ""
        self._heard = False  # whether any audio so far was louder than silence
        self._pcm: list[bytes] = []  # all of it, as fed: ``finish`` decodes it whole

    def _release(self) -> None:
        if self._decoder is not None:
            # Abandoned mid-utterance (the decoder's next user ends the utterance).
            _pool.release(self._decoder, mid_utterance=True)
            self._decoder = None

    def _decode_sync(self, audio: bytes) -> pocketsphinx.Decoder | None:
        if not self._heard and audio and not _is_silent(audio):
            self._heard = True
        if self._decoder is None:
            self._held.append(audio)
            self._held_bytes += len(audio)
            if self._held_bytes < _PRIME_S * DECODER_RATE_HZ * 2:
                return None
            audio = b"".join(self._held)
            self._held.clear()
            self._held_bytes = 0
            decoder = _pool.acquire()
            self._decoder = decoder
            count_decode(PocketsphinxSTT.provider)  # the running pass, for partials
            _prime_cmn(decoder, audio)
            decoder.start_utt()
        # The decoder holds the GIL in each call: short slices let the event loop run
        # between them. (It also refuses an empty buffer.)
        for start in range(0, len(audio), _SLICE_BYTES):
            self._decoder.process_raw(audio[start : start + _SLICE_BYTES])
        return self._decoder

    def _feed_sync(self, pcm: bytes) -> str | None:
        decoder = self._decode_sync(self._resampler.process(pcm))
        text = _hypothesis(decoder) if decoder is not None and self._heard else ""
        if text and text != self._last:
            self._last = text
            return text
        return None

    async def feed(self, pcm: bytes) -> str | None:
        """Add audio; return the partial transcript so far if it changed, else ``None``.

        Raises:
            trio.ClosedResourceError: after ``finish`` or ``aclose``.
            trio.BusyResourceError: another task is feeding or finishing the stream.
            ProviderError: the decoder failed (``provider_failed``).
        """
        with self._inside():
            self._took(pcm)
            self._pcm.append(pcm)
            try:
                return await trio.to_thread.run_sync(self._feed_sync, pcm)
            except RuntimeError as exc:
                self._drop()
                raise ProviderError("provider_failed", "pocketsphinx failed to decode") from exc

    async def finish(self) -> Transcript:
        """End the utterance and return what was said in all of it (decoded whole, in the worker).

        Raises:
            trio.ClosedResourceError: after ``finish`` or ``aclose``.
            trio.BusyResourceError: another task is feeding the stream.
            ProviderError: the decoder failed (``provider_failed``).
        """
        with self._inside(finishing=True):
            # The running hypothesis hears worse than one pass over the whole utterance,
            # normalised over all of it (WER 45% against 29%, 8 espeak en-us+f2 sentences):
            # the words are that pass; the stream's decoder goes back to the pool unfinished.
            text = await _transcribe_whole(b"".join(self._pcm), self.sample_rate_hz)
        return self._transcript(text)

    def _drop(self) -> None:
        # A decoder that raised is in an unknown state: let it be freed, not reused.
        self._decoder = None
        self._closed = True


def _language_problem(language: str) -> str | None:
    if PocketsphinxSTT.supports_language(language):
        return None
    return f"the offline recognizer takes no language but English, not {language!r}"


PROVIDES = (
    RecognizerProvider(
        name="pocketsphinx", build=PocketsphinxSTT, streams=True, language_problem=_language_problem
    ),
)
