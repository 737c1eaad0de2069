"""Offline text to speech with espeak-ng, the library and data shipped by ``espeakng-loader``.

libespeak-ng is driven through ctypes in synchronous mode: ``espeak_Synth`` renders the
whole text on the calling thread and hands the samples to a callback as it goes. The
library keeps one global state (voice, rate, callback), so every use holds one process
lock, and the blocking call runs in a Trio worker thread.
"""

from __future__ import annotations

import ctypes
import os
import re
import threading
from collections.abc import AsyncIterator, Sequence

import attrs
import espeakng_loader
import trio

from ._once import LoadedOnce
from ._registry import SynthesizerProvider
from ._types import ProviderError

__all__ = ["EspeakTTS", "EspeakVoice", "UnsupportedVoice"]

_AUDIO_OUTPUT_SYNCHRONOUS = 2
_INITIALIZE_DONT_EXIT = 0x8000  # report a broken data path instead of calling exit()
_CHARS_UTF8 = 1
_POS_CHARACTER = 1
_PARAM_RATE = 1
_EE_OK = 0
_MIN_RATE_WPM = 80
_MAX_RATE_WPM = 450
_DEFAULT_VOICE = "en"

# One sentence per worker-thread call, so long texts start sounding before they are
# fully rendered and a cancel lands between sentences.
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


class UnsupportedVoice(ProviderError, ValueError):
    """The voice (or its ``+variant``) is not one espeak-ng ships."""

    def __init__(self, message: str) -> None:
        super().__init__("invalid_settings", message)


@attrs.frozen(kw_only=True)
class EspeakVoice:
    """A voice or a variant as espeak-ng lists it.

    Attributes:
        name: the display name, e.g. ``"English (America)"`` or ``"Adam"``.
        identifier: the data file, e.g. ``"gmw/en-US"`` or ``"!v/adam"``.
        languages: language codes the voice speaks, preferred first (``"variant"`` for
            variants).
    """

    name: str
    identifier: str
    languages: tuple[str, ...]

    @property
    def short_name(self) -> str:
        """The identifier's last part (``"en-US"``, ``"f3"``), the usual way to name it."""
        return self.identifier.rsplit("/", 1)[-1]


class _EspeakStruct(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("languages", ctypes.c_void_p),
        ("identifier", ctypes.c_char_p),
        ("gender", ctypes.c_ubyte),
        ("age", ctypes.c_ubyte),
        ("variant", ctypes.c_ubyte),
        ("xx1", ctypes.c_ubyte),
        ("score", ctypes.c_int),
        ("spare", ctypes.c_void_p),
    ]


_SynthCallback = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p)


def _read_languages(address: int | None) -> tuple[tuple[int, str], ...]:
    # espeak packs (priority byte, NUL-terminated code) pairs, ended by a zero byte.
    out: list[tuple[int, str]] = []
    if not address:
        return ()
    i = 0
    while True:
        priority = ctypes.string_at(address + i, 1)[0]
        if priority == 0:
            return tuple(out)
        code = ctypes.string_at(address + i + 1)
        out.append((priority, code.decode("utf-8", "replace")))
        i += len(code) + 2


class _Engine:
    """The process's one libespeak-ng; every method takes ``lock`` itself."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        lib = ctypes.CDLL(espeakng_loader.get_library_path())
        lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        lib.espeak_Initialize.restype = ctypes.c_int
        lib.espeak_SetSynthCallback.argtypes = [_SynthCallback]
        lib.espeak_SetSynthCallback.restype = None
        lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        lib.espeak_SetVoiceByName.restype = ctypes.c_int
        lib.espeak_SetParameter.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
        lib.espeak_SetParameter.restype = ctypes.c_int
        lib.espeak_ListVoices.argtypes = [ctypes.POINTER(_EspeakStruct)]
        lib.espeak_ListVoices.restype = ctypes.POINTER(ctypes.POINTER(_EspeakStruct))
        lib.espeak_Synth.argtypes = [
            ctypes.c_char_p,
            ctypes.c_size_t,
            ctypes.c_uint,
            ctypes.c_int,
            ctypes.c_uint,
            ctypes.c_uint,
            ctypes.c_void_p,
            ctypes.c_void_p,
        ]
        lib.espeak_Synth.restype = ctypes.c_int
        rate = lib.espeak_Initialize(
            _AUDIO_OUTPUT_SYNCHRONOUS,
            0,
            os.fsencode(espeakng_loader.get_data_path()),
            _INITIALIZE_DONT_EXIT,
        )
        if rate <= 0:
            raise ProviderError("unavailable", "espeak-ng failed to initialise")
        self.lib = lib
        self.sample_rate_hz = rate
        self._sink: list[bytes] | None = None
        # ctypes frees a callback whose Python object dies: keep it on the engine.
        self._callback = _SynthCallback(self._on_audio)
        lib.espeak_SetSynthCallback(self._callback)
        self._current_voice: str | None = None
        self.voices = self._list(None)
        spec = _EspeakStruct()
        spec.languages = ctypes.cast(ctypes.c_char_p(b"variant"), ctypes.c_void_p)
        self.variants = self._list(ctypes.byref(spec))

    def _on_audio(self, wav: ctypes._Pointer[ctypes.c_short], numsamples: int, _events: int | None) -> int:
        if numsamples > 0 and wav and self._sink is not None:
            self._sink.append(ctypes.string_at(wav, numsamples * 2))
        return 0  # 0 = go on

    def _list(self, spec: object) -> tuple[tuple[EspeakVoice, tuple[tuple[int, str], ...]], ...]:
        arr = self.lib.espeak_ListVoices(spec)
        out = []
        i = 0
        while arr[i]:
            v = arr[i].contents
            langs = _read_languages(v.languages)
            voice = EspeakVoice(
                name=(v.name or b"").decode("utf-8", "replace"),
                identifier=(v.identifier or b"").decode("utf-8", "replace"),
                languages=tuple(code for _, code in langs),
            )
            out.append((voice, langs))
            i += 1
        return tuple(out)

    def synthesize(self, voice_spec: str, rate_wpm: int, text: str) -> list[bytes]:
        data = text.encode("utf-8") + b"\0"
        chunks: list[bytes] = []
        with self.lock:
            if voice_spec != self._current_voice:
                if self.lib.espeak_SetVoiceByName(voice_spec.encode()) != _EE_OK:
                    self._current_voice = None
                    raise ProviderError("provider_failed", f"espeak-ng cannot load {voice_spec!r}")
                self._current_voice = voice_spec
            self.lib.espeak_SetParameter(_PARAM_RATE, rate_wpm, 0)
            self._sink = chunks
            try:
                err = self.lib.espeak_Synth(data, len(data), 0, _POS_CHARACTER, 0, _CHARS_UTF8, None, None)
            finally:
                self._sink = None
        if err != _EE_OK:
            raise ProviderError("provider_failed", f"espeak-ng synthesis failed (error {err})")
        return chunks


# One engine for the process (espeak-ng's state is global), keyed by nothing.
_engines: LoadedOnce[None, _Engine] = LoadedOnce(lambda _: _Engine())


def _engine() -> _Engine:
    return _engines.get(None)


def _resolve(voice: str) -> str:
    """Map a user's voice name to the exact ``identifier[+variant]`` espeak-ng loads."""
    engine = _engine()
    base, plus, variant = voice.strip().partition("+")
    key = base.strip().lower()
    if not key:
        raise UnsupportedVoice(f"espeak voice {voice!r} names no language")
    found: str | None = None
    # Most specific first: a full identifier, its last part, the display name, then a
    # language code, taking the voice that prefers it most (lowest priority number).
    for field in ("identifier", "short_name", "name"):
        found = next((v.identifier for v, _ in engine.voices if getattr(v, field).lower() == key), None)
        if found:
            break
    if found is None:
        ranked = sorted(
            (priority, n, v.identifier)
            for n, (v, langs) in enumerate(engine.voices)
            for priority, code in langs
            if code.lower() == key
        )
        if ranked:
            found = ranked[0][2]
    if found is None:
        raise UnsupportedVoice(f"espeak has no voice {base!r}; see EspeakTTS.list_voices() for the names")
    if not plus:
        return found
    vkey = variant.strip().lower()
    var = next(
        (v.short_name for v, _ in engine.variants if vkey and vkey in (v.short_name.lower(), v.name.lower())),
        None,
    )
    if var is None:
        # espeak itself ignores an unknown variant silently; refuse it instead.
        raise UnsupportedVoice(
            f"espeak has no variant {variant!r}; see EspeakTTS.list_variants() for the names"
        )
    return f"{found}+{var}"


def _sentences(text: str) -> list[str]:
    return [s for s in (p.strip() for p in _SENTENCE_END.split(text)) if s]


class EspeakTTS:
    """Text to speech with the espeak-ng library shipped in a wheel; no network, no model.

    Output is 16-bit mono PCM at the library's rate (22,050 Hz). Rendering runs about a
    thousand times faster than real time, one sentence per worker-thread call.

    Args:
        voice: an espeak voice: a language code (``"en"``, ``"en-us"``, ``"de"``), a voice
            identifier (``"gmw/en-US"``) or display name, optionally with a variant
            (``"en+f3"``, ``"en-us+klatt3"``) that changes pitch and timbre. ``None``
            means ``"en"``.
        rate_wpm: speaking rate in words per minute (80 to 450).

    Raises:
        UnsupportedVoice: the voice or variant is unknown (code ``invalid_settings``).
        ValueError: ``rate_wpm`` is out of range.
    """

    provider = "espeak"

    def __init__(self, voice: str | int | None = None, *, rate_wpm: int = 175) -> None:
        if voice is None:
            voice = _DEFAULT_VOICE
        if not isinstance(voice, str):
            raise UnsupportedVoice(f"espeak voices are named by strings, got {voice!r}")
        if not _MIN_RATE_WPM <= rate_wpm <= _MAX_RATE_WPM:
            raise ValueError(f"rate_wpm must be within {_MIN_RATE_WPM}..{_MAX_RATE_WPM}, got {rate_wpm}")
        self.voice: str | int | None = voice
        self.rate_wpm = rate_wpm
        self._spec = _resolve(voice)
        self.sample_rate_hz: int = _engine().sample_rate_hz

    def __repr__(self) -> str:
        return f"EspeakTTS(voice={self.voice!r}, rate_wpm={self.rate_wpm})"

    @staticmethod
    def list_voices() -> Sequence[EspeakVoice]:
        """The voices (one per language or accent) that this espeak-ng ships."""
        return tuple(v for v, _ in _engine().voices)

    @staticmethod
    def list_variants() -> Sequence[EspeakVoice]:
        """The variants (``f3``, ``m1``, ``klatt``, ...) that may follow a voice after ``+``."""
        return tuple(v for v, _ in _engine().variants)

    @staticmethod
    def supports_voice(voice: object) -> bool:
        """Whether ``EspeakTTS(voice)`` would accept ``voice`` (for validating settings)."""
        if not isinstance(voice, str):
            return False
        try:
            _resolve(voice)
        except UnsupportedVoice:
            return False
        return True

    async def warm_up(self) -> None:
        """Load the engine and its voice data, and say one word."""
        async for _ in self.synthesize("ready"):
            pass

    async def synthesize(self, text: str) -> AsyncIterator[bytes]:
        """Yield the audio of ``text`` as 16-bit PCM chunks of about 60 ms.

        Raises:
            ProviderError: espeak-ng failed (code ``provider_failed``).
        """
        engine = _engine()
        for sentence in _sentences(text):
            chunks = await trio.to_thread.run_sync(engine.synthesize, self._spec, self.rate_wpm, sentence)
            for chunk in chunks:
                yield chunk


def _build(voice: str | int | None, *, model: str | None) -> EspeakTTS:
    return EspeakTTS(voice)  # no models: ``model`` chooses nothing


def _voice_problem(voice: str | int | float) -> str | None:
    return None if EspeakTTS.supports_voice(voice) else f"espeak has no voice {voice!r}"


PROVIDES = (SynthesizerProvider(name="espeak", build=_build, voice_problem=_voice_problem, has_models=False),)
