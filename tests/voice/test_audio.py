import math
import wave

import numpy as np
import pytest

from runner.voice.audio import (
    Resampler,
    frames,
    pcm_seconds,
    resample_s16le,
    rms,
    rms_dbfs,
    write_wav,
)


def tones(rate: int, seconds: float, freqs_hz: tuple[float, ...], amplitude: float) -> bytes:
    t = np.arange(int(rate * seconds)) / rate
    x = sum(amplitude * np.sin(2 * np.pi * f * t + i) for i, f in enumerate(freqs_hz))
    return np.rint(x).astype("<i2").tobytes()


def samples(pcm: bytes) -> np.ndarray:
    return np.frombuffer(pcm, dtype="<i2").astype(np.float64)


def test_round_trip_22050_to_16000_keeps_the_speech_band() -> None:
    original = tones(22_050, 1.0, (220.0, 1_000.0, 3_100.0, 6_500.0), 5_000.0)
    down = resample_s16le(original, 22_050, 16_000)
    back = resample_s16le(down, 16_000, 22_050)

    assert len(down) // 2 == 16_000
    assert len(back) == len(original)
    a, b = samples(original)[200:-200], samples(back)[200:-200]
    snr_db = 10 * math.log10(np.mean(a**2) / np.mean((a - b) ** 2))
    assert snr_db > 40


def test_downsampling_removes_what_the_new_rate_cannot_hold() -> None:
    # 10 kHz cannot exist at 16 kHz; linear interpolation would fold it to 6 kHz.
    high = tones(22_050, 1.0, (10_000.0,), 8_000.0)
    out = resample_s16le(high, 22_050, 16_000)
    assert rms(out[4_000:-4_000]) < 0.01 * rms(high)


@pytest.mark.parametrize("from_hz", [8_000, 16_000, 22_050, 24_000, 44_100, 48_000])
def test_resampled_tone_keeps_pitch_and_level(from_hz: int) -> None:
    pcm = tones(from_hz, 0.5, (440.0,), 10_000.0)
    out = samples(resample_s16le(pcm, from_hz, 16_000))
    assert len(out) == 8_000
    expected = 10_000.0 * np.sin(2 * np.pi * 440.0 * np.arange(8_000) / 16_000)
    assert np.max(np.abs(out - expected)[100:-100]) < 30


def test_streaming_resampler_matches_whole_clip_resampling() -> None:
    pcm = tones(44_100, 0.7, (300.0, 2_000.0), 6_000.0)
    resampler = Resampler(44_100, 16_000)
    pieces = [resampler.process(pcm[i : i + 1_234]) for i in range(0, len(pcm), 1_234)]
    pieces.append(resampler.flush())
    streamed, whole = samples(b"".join(pieces)), samples(resample_s16le(pcm, 44_100, 16_000))
    assert streamed.size == whole.size == math.ceil(len(pcm) / 2 * 16_000 / 44_100)
    assert np.max(np.abs(streamed - whole)) <= 2  # soxr works in blocks: the last bit may differ


def test_same_rate_is_unchanged_and_odd_bytes_are_refused() -> None:
    pcm = tones(16_000, 0.1, (500.0,), 1_000.0)
    assert resample_s16le(pcm, 16_000, 16_000) == pcm
    with pytest.raises(ValueError, match="even byte count"):
        resample_s16le(pcm + b"\x00", 16_000, 8_000)


def test_pcm_seconds_counts_16_bit_samples() -> None:
    assert pcm_seconds(44_100, 22_050) == 1.0
    assert pcm_seconds(3_200, 16_000) == 0.1
    with pytest.raises(ValueError):
        pcm_seconds(10, 0)


def test_rms_of_a_sine_and_of_silence() -> None:
    sine = tones(16_000, 1.0, (1_000.0,), 10_000.0)
    assert rms(sine) == pytest.approx(10_000 / math.sqrt(2), rel=1e-3)
    assert rms(bytes(320)) == 0.0
    assert rms(b"") == 0.0
    assert rms_dbfs(bytes(320)) == -100.0
    assert rms_dbfs(np.full(160, 32767, "<i2").tobytes()) == pytest.approx(0.0, abs=0.01)


def test_frames_cuts_fixed_lengths_and_drops_the_partial_tail() -> None:
    pcm = bytes(2 * 16_000 // 1000 * 65)  # 65 ms at 16 kHz
    cut = list(frames(pcm, 16_000, 20))
    assert [len(f) for f in cut] == [640, 640, 640]
    assert next(iter(frames(pcm, 22_050, 30))) == bytes(2 * 661)


def test_write_wav_is_readable_with_the_rate_and_samples(tmp_path) -> None:
    pcm = tones(22_050, 0.25, (440.0,), 3_000.0)
    path = tmp_path / "clip.wav"
    write_wav(path, pcm, 22_050)
    with wave.open(str(path), "rb") as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, 22_050)
        assert w.readframes(w.getnframes()) == pcm
