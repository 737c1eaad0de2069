import numpy as np
import pytest

from runner.providers.espeak import EspeakTTS
from runner.providers.hibari import HibariTTS
from runner.providers.whisper import WhisperSTT
from runner.voice.audio import frames, resample_s16le
from runner.voice.listener import PAUSE_MS, Listener
from runner.voice.vad import VAD_KINDS, EnergyVad, SileroVad, VadEvent, make_vad

RATE = 22_050


async def speech(text: str) -> bytes:
    tts = EspeakTTS("en-us")
    return b"".join([chunk async for chunk in tts.synthesize(text)])


def noise(seconds: float, dbfs: float, seed: int = 0) -> bytes:
    sd = 32768 * 10 ** (dbfs / 20)
    # round, not int: a length given as samples / RATE must come back exact to mix with them.
    x = np.random.default_rng(seed).normal(0.0, sd, round(RATE * seconds))
    return np.clip(np.rint(x), -32768, 32767).astype("<i2").tobytes()


def mix(a: bytes, b: bytes) -> bytes:
    x = np.frombuffer(a, "<i2").astype(np.int32) + np.frombuffer(b, "<i2").astype(np.int32)
    return np.clip(x, -32768, 32767).astype("<i2").tobytes()


def voiced_span_ms(pcm: bytes) -> tuple[float, float]:
    """Where the signal is above a low amplitude, in ms: the ground truth to compare to."""
    loud = np.flatnonzero(np.abs(np.frombuffer(pcm, "<i2")) > 300)
    return loud[0] * 1000 / RATE, (loud[-1] + 1) * 1000 / RATE


def run(vad: EnergyVad, pcm: bytes, chunk_ms: int = 20) -> list[VadEvent]:
    events: list[VadEvent] = []
    for frame in frames(pcm, RATE, chunk_ms):
        events.extend(vad.feed(frame))
    return events


@pytest.mark.parametrize("noise_dbfs", [None, -55.0, -38.0])
async def test_detects_one_utterance_start_and_end(noise_dbfs: float | None) -> None:
    voice = await speech("Please call me tomorrow morning, the weather is sunny today.")
    lead, tail = 1.0, 1.5
    clip = bytes(2 * int(RATE * lead)) + voice + bytes(2 * int(RATE * tail))
    if noise_dbfs is not None:
        clip = mix(clip, noise(len(clip) / 2 / RATE, noise_dbfs))
    onset, offset = voiced_span_ms(voice)
    onset += lead * 1000
    offset += lead * 1000

    vad = EnergyVad(RATE, frame_ms=20, silence_ms=500, min_speech_ms=100)
    events = run(vad, clip)

    assert [e.kind for e in events] == ["speech_started", "speech_ended"]
    started, ended = events
    assert abs(started.at_ms - onset) <= 80
    assert abs(ended.at_ms - offset) <= 120
    assert not vad.in_speech


async def test_events_come_after_the_configured_waits() -> None:
    voice = await speech("Hello there.")
    clip = bytes(2 * RATE // 2) + voice + bytes(2 * RATE * 2)
    vad = EnergyVad(RATE, frame_ms=20, silence_ms=700, min_speech_ms=200)
    reported: list[tuple[str, float, float]] = []
    for frame in frames(clip, RATE, 20):
        for event in vad.feed(frame):
            reported.append((event.kind, event.at_ms, vad.position_ms))
    (k1, at1, seen1), (k2, at2, seen2) = reported
    assert (k1, k2) == ("speech_started", "speech_ended")
    assert seen1 - at1 == pytest.approx(200, abs=20)
    assert seen2 - at2 == pytest.approx(700, abs=20)


@pytest.mark.parametrize(
    "clip",
    [bytes(2 * RATE * 3), noise(3.0, -60.0), noise(3.0, -35.0), noise(3.0, -20.0)],
    ids=["digital-silence", "faint-noise", "room-noise", "loud-steady-noise"],
)
def test_reports_nothing_without_speech(clip: bytes) -> None:
    vad = EnergyVad(RATE)
    assert run(vad, clip) == []
    assert not vad.in_speech


def test_a_click_is_shorter_than_min_speech() -> None:
    click = np.zeros(RATE, "<i2")
    click[RATE // 2 : RATE // 2 + RATE // 50] = 12_000  # 20 ms
    vad = EnergyVad(RATE, min_speech_ms=100)
    assert run(vad, click.tobytes()) == []


def test_noise_floor_follows_the_room() -> None:
    vad = EnergyVad(RATE, noise_window_ms=1000)
    run(vad, noise(1.5, -40.0))
    assert vad.noise_floor_dbfs == pytest.approx(-40.0, abs=2.0)
    run(vad, noise(1.5, -60.0, seed=1))
    assert vad.noise_floor_dbfs == pytest.approx(-60.0, abs=2.0)


async def test_any_chunking_gives_the_same_events() -> None:
    voice = await speech("Thank you very much.")
    clip = bytes(RATE) + voice + bytes(2 * RATE)
    whole = EnergyVad(RATE).feed(clip)
    pieces = EnergyVad(RATE)
    odd: list[VadEvent] = []
    for i in range(0, len(clip), 2 * 337):
        odd.extend(pieces.feed(clip[i : i + 2 * 337]))
    assert whole == odd
    assert [e.kind for e in whole] == ["speech_started", "speech_ended"]


async def test_flush_ends_an_utterance_cut_short() -> None:
    voice = await speech("Thank you very much.")
    vad = EnergyVad(RATE)
    events = vad.feed(bytes(RATE) + voice)
    assert [e.kind for e in events] == ["speech_started"]
    assert vad.in_speech
    (end,) = vad.flush()
    assert end.kind == "speech_ended"
    assert end.at_ms == pytest.approx(voiced_span_ms(voice)[1] + 500, abs=60)
    assert not vad.in_speech


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError):
        EnergyVad(16_000, start_margin_db=6, stop_margin_db=10)
    with pytest.raises(ValueError):
        EnergyVad(0)


# --- Silero VAD (the default) ---------------------------------------------------------


def run_silero(vad: SileroVad, pcm: bytes, chunk_ms: int = 20) -> list[VadEvent]:
    events: list[VadEvent] = []
    for frame in frames(pcm, RATE, chunk_ms):
        events.extend(vad.feed(frame))
    return events


def tone(seconds: float, freqs: tuple[float, ...], dbfs: float = -20.0) -> bytes:
    t = np.arange(int(RATE * seconds)) / RATE
    x = sum(np.sin(2 * np.pi * f * t) for f in freqs) / len(freqs) * 32768 * 10 ** (dbfs / 20) * 1.41
    return np.clip(np.rint(x), -32768, 32767).astype("<i2").tobytes()


async def test_silero_finds_one_utterance_in_noise_at_any_rate() -> None:
    voice = await speech("Please call me tomorrow morning, the weather is sunny today.")
    clip = mix(bytes(RATE * 2) + voice + bytes(RATE * 3), noise((len(voice) / 2 + RATE * 2.5) / RATE, -40.0))
    onset, offset = voiced_span_ms(voice)
    vad = SileroVad(RATE, silence_ms=500)  # 22,050 Hz goes through soxr to the model's 16 kHz
    events = run_silero(vad, clip)
    assert [e.kind for e in events] == ["speech_started", "speech_ended"]
    assert abs(events[0].at_ms - (1000 + onset)) <= 120
    assert abs(events[1].at_ms - (1000 + offset)) <= 200
    vad.close()


def test_silero_hears_no_speech_in_noise_clicks_a_chord_or_a_burst() -> None:
    click = np.zeros(RATE, "<i2")
    for at in range(RATE // 10, RATE, RATE // 5):
        click[at : at + RATE // 200] = 20_000  # 5 ms clicks, five a second
    burst = bytes(RATE) + noise(0.3, -10.0, seed=3) + bytes(RATE)
    clips = {
        "loud-steady-noise": noise(3.0, -20.0),
        "clicks": click.tobytes() * 2,
        "chord": bytes(RATE) + tone(1.5, (261.6, 329.6, 392.0)) + bytes(RATE),
        "burst": burst,
    }
    for name, clip in clips.items():
        vad = SileroVad(RATE)
        assert run_silero(vad, clip) == [], name
        vad.close()
    # The energy detector hears speech in the chord and the burst: the reason Silero is the default.
    assert [e.kind for e in run(EnergyVad(RATE), clips["chord"])][:1] == ["speech_started"]
    assert [e.kind for e in run(EnergyVad(RATE), clips["burst"])][:1] == ["speech_started"]


async def test_silero_reports_pauses_inside_speech_before_its_end() -> None:
    one = await speech("Thank you very much.")
    two = await speech("My name is John.")
    clip = bytes(RATE) + one + bytes(int(RATE * 0.8)) + two + bytes(RATE * 4)  # a 0.4 s gap
    vad = SileroVad(RATE, silence_ms=1500, pause_ms=200)
    kinds = [e.kind for e in run_silero(vad, clip)]
    assert kinds == ["speech_started", "pause", "resumed", "pause", "speech_ended"]
    vad.close()
    with pytest.raises(RuntimeError):
        vad.feed(bytes(640))


def test_make_vad_names_the_detectors() -> None:
    assert VAD_KINDS == ("silero", "energy")
    silero = make_vad("silero", 48_000, silence_ms=700)
    assert isinstance(silero, SileroVad) and silero.silence_ms == 700
    silero.close()
    assert isinstance(make_vad("energy", 16_000), EnergyVad)
    with pytest.raises(ValueError, match="unknown VAD 'webrtc'"):
        make_vad("webrtc", 16_000)


# --- The silence clock: counted from the last speech, not from Silero's release -------------

LIVEKIT_RATE = 48_000
# A sample louder than this is the voice: where a recording's speech ends.
VOICE_LEVEL = 300


async def hibari(text: str, rate: int) -> np.ndarray:
    tts = HibariTTS("heart")  # renders the same audio every time
    pcm = b"".join([chunk async for chunk in tts.synthesize(text)])
    return np.frombuffer(resample_s16le(pcm, tts.sample_rate_hz, rate), "<i2").astype(np.float64)


def room(voice: np.ndarray, rate: int, noise_rms: float, seed: int = 0) -> tuple[bytes, float]:
    """``voice`` after 0.5 s of a room's noise, then 2 s more of it; and where the voice ends, in ms."""
    clip = np.concatenate([np.zeros(rate // 2), voice, np.zeros(2 * rate)])
    end_ms = (np.flatnonzero(np.abs(clip) > VOICE_LEVEL)[-1] + 1) * 1000 / rate
    clip += np.random.default_rng(seed).normal(0.0, noise_rms, clip.size)
    return np.clip(np.rint(clip), -32768, 32767).astype("<i2").tobytes(), end_ms


@pytest.mark.parametrize(
    "text", ["Thank you very much, my name is John.", "Could you send someone to fix the air conditioning?"]
)
async def test_the_end_of_turn_silence_is_counted_from_the_last_speech(text: str) -> None:
    clip, voice_end_ms = room(
        await hibari(text, LIVEKIT_RATE), LIVEKIT_RATE, noise_rms=32768 * 10 ** (-55 / 20)
    )
    listener = Listener(WhisperSTT(), silence_ms=500)  # as a LiveKit call feeds it: 10 ms at 48 kHz
    heard: list[tuple[str, float]] = []
    for n, frame in enumerate(frames(clip, LIVEKIT_RATE, 10), start=1):
        heard += [(type(h).__name__, n * 10.0) for h in listener.feed(frame, LIVEKIT_RATE)]
    listener.close()

    assert [kind for kind, _ in heard] == ["SpeechStarted", "SpeechPaused", "SpeechEnded"], heard
    paused_at, ended_at = heard[1][1], heard[2][1]
    # The turn ends with the frame that completes 500 ms after the voice's last sound, within
    # one of Silero's windows (32 ms), not when Silero's probability has fallen (70-150 ms later).
    assert ended_at == pytest.approx(voice_end_ms + 500, abs=32), (voice_end_ms, heard)
    # The pause comes once Silero no longer hears a voice, PAUSE_MS after the last sound at the least.
    assert voice_end_ms + PAUSE_MS - 32 <= paused_at < voice_end_ms + 200, (voice_end_ms, heard)


async def test_a_voice_in_loud_noise_is_one_utterance() -> None:
    # Under noise 6 dB below the voice, the voice's soft sounds are no louder than the room:
    # Silero still hears them, and quiet audio it hears for longer than its echo is speech.
    voice = await hibari("My flight lands late, so please keep the room for me.", 16_000)
    level = np.sqrt(np.mean(voice[np.abs(voice) > VOICE_LEVEL] ** 2))
    clip, _ = room(voice, 16_000, noise_rms=level / 2, seed=4)
    vad = SileroVad(16_000, silence_ms=500, pause_ms=120)
    events = [e for frame in frames(clip, 16_000, 10) for e in vad.feed(frame)]
    vad.close()
    assert [e.kind for e in events if e.kind in ("speech_started", "speech_ended")] == [
        "speech_started",
        "speech_ended",
    ]


async def test_a_pause_waits_until_silero_no_longer_hears_the_voice() -> None:
    # Under noise 10 dB below the voice its last sounds are no louder than the room, but Silero
    # still hears them: a pause counted from the loud audio alone would be taken back by them.
    voice = await hibari("Thank you very much, my name is John.", 16_000)
    level = np.sqrt(np.mean(voice[np.abs(voice) > VOICE_LEVEL] ** 2))
    clip, _ = room(voice, 16_000, noise_rms=level / np.sqrt(10))
    vad = SileroVad(16_000, silence_ms=500, pause_ms=120)
    events = [e.kind for frame in frames(clip, 16_000, 10) for e in vad.feed(frame)]
    vad.close()
    assert events == ["speech_started", "pause", "speech_ended"]


@pytest.mark.parametrize(
    "text",
    [
        "Thank you very much, my name is John.",
        "Could you send someone to fix the air conditioning?",
        "Is breakfast included in the price of the room?",
    ],
)
async def test_the_turn_ends_with_the_frame_that_completes_the_silence(text: str) -> None:
    # As LiveKit hands the caller's audio on: 10 ms frames at 16 kHz. The quiet at the end of a
    # frame counts at once, though it is short of a Silero window (32 ms) or an 8 ms piece.
    clip, _ = room(await hibari(text, 16_000), 16_000, noise_rms=32768 * 10 ** (-55 / 20))
    vad = SileroVad(16_000, silence_ms=500, pause_ms=100)
    ended: list[tuple[float, float]] = []
    for n, frame in enumerate(frames(clip, 16_000, 10), start=1):
        ended += [(e.at_ms, n * 10.0) for e in vad.feed(frame) if e.kind == "speech_ended"]
    vad.close()
    ((speech_end_ms, reported_at_ms),) = ended
    assert reported_at_ms - 10 < speech_end_ms + 500 <= reported_at_ms, ended
