"""Recordings on the agent WebSocket, offline end to end: espeak-ng speech in, Whisper
hearing it, the agent's reply spoken back by hibari and heard again.

The person's voice is real speech from espeak-ng, sent as 16 kHz PCM in 100 ms binary
frames at twice real time, the way a microphone client sends.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio

from runner.providers.espeak import EspeakTTS
from runner.providers.whisper import WhisperSTT
from runner.voice.audio import resample_s16le

from ..test_telemetry import scrape, value
from .ino_agents import CLEAR_VOICE
from .ino_client import Addresses, InoSocket, connect
from .test_ino_conformance import types

pytestmark = pytest.mark.slow

SENTENCE = "Thank you very much, my name is John."
WORDS = {"thank", "you", "very", "much", "my", "name", "is", "john"}
RATE = 16_000
FRAME_BYTES = RATE * 2 // 10  # 100 ms


async def speech(text: str = SENTENCE, rate: int = RATE) -> bytes:
    """``text`` spoken by espeak-ng at ``rate``, with 300 ms of quiet on each side."""
    tts = EspeakTTS(CLEAR_VOICE)
    pcm = b"".join([chunk async for chunk in tts.synthesize(text)])
    quiet = bytes(2 * int(rate * 0.3))
    return quiet + resample_s16le(pcm, tts.sample_rate_hz, rate) + quiet


async def send_audio(sock: InoSocket, pcm: bytes, *, pace: float = 0.5) -> None:
    """Binary frames of 100 ms, one every ``pace`` * 100 ms."""
    for start in range(0, len(pcm), FRAME_BYTES):
        await sock.send_raw(pcm[start : start + FRAME_BYTES])
        await trio.sleep(0.1 * pace)


def heard_words(text: str) -> set[str]:
    return WORDS & set(text.lower().replace(",", " ").replace(".", " ").split())


async def test_a_spoken_turn_end_to_end(speaking: Addresses) -> None:
    pcm = await speech()
    token, session_id = await speaking.api().person()
    async with connect(speaking, token, session_id) as sock:
        await sock.send("user_audio.start", rate=RATE, recording_id="take-1", language="en", model="whisper")
        await send_audio(sock, pcm)
        # The person is still "speaking": a partial transcript arrives at the pause before the end.
        partials = await sock.until_type("heard.partial")
        await sock.send("user_audio.end")
        frames = partials + await sock.turn_end(timeout=30)
        kinds = types(frames)
        assert kinds[-1] == "turn.done"
        assert (
            kinds.index("heard.partial")
            < kinds.index("turn.start")
            < kinds.index("heard")
            < kinds.index("text.delta")
        )
        assert all(f["turn"] for f in frames if f["type"] not in ("heard.partial",))
        heard = next(f for f in frames if f["type"] == "heard")
        # espeak-ng renders with random noise: 4 of the sentence's 8 words is a safe floor.
        assert len(heard_words(heard["text"])) >= 4, heard
        assert abs(heard["audio_seconds"] - len(pcm) / 2 / RATE) < 0.01
        done = frames[-1]
        assert done["heard"] == heard["text"] and done["heard_seconds"] == heard["audio_seconds"]
        assert done["message"].startswith("You said:") and done["chunks_spoken"] >= 1
        assert "text.chunk" in kinds and "audio.start" in kinds and "audio.end" in kinds
        # The reply's audio, as the client would play it, says the reply.
        rate = next(f for f in frames if f["type"] == "audio.start")["sample_rate"]
        reply_pcm = _turn_audio(sock, done["turn"])
        assert len(reply_pcm) == sum(f["bytes"] for f in frames if f["type"] == "audio.end")
        transcript = await WhisperSTT("en").transcribe(reply_pcm, rate)
        said = _words(done["message"])
        assert len(said & _words(transcript.text)) >= 0.8 * len(said), (transcript.text, done["message"])
        sock.checker.finish()


async def test_a_spoken_turn_decodes_its_recording_once(speaking: Addresses) -> None:
    # The recognizer stream decodes at the pause after the last word; the turn's words are
    # that decode, not a second decode of the same audio once the recording ends.
    pcm = await speech("My name is John.")
    token, session_id = await speaking.api().person()
    async with speaking.management_client() as management:
        before = value(await scrape(management), "curb_stt_decodes_total", provider="whisper")
        async with connect(speaking, token, session_id) as sock:
            await sock.send("user_audio.start", rate=RATE, recording_id="once", language="en")
            await send_audio(sock, pcm)
            partials = await sock.until_type("heard.partial")
            await sock.send("user_audio.end")
            frames = partials + await sock.turn_end(timeout=30)
        decodes = value(await scrape(management), "curb_stt_decodes_total", provider="whisper") - before
    heard = next(f for f in frames if f["type"] == "heard")
    assert {"name", "john"} <= heard_words(heard["text"]), heard
    assert frames[-1]["type"] == "turn.done"
    assert decodes == 1


def _words(text: str) -> set[str]:
    return set(text.lower().replace(":", " ").replace(",", " ").replace(".", " ").split())


def _turn_audio(sock: InoSocket, turn: str) -> bytes:
    """The binary frames of ``turn``'s audio windows, in wire order."""
    # The checker keeps binary frames in order; windows are told apart by their audio.end counts.
    ends = [f for f in sock.checker.frames if f["type"] == "audio.end"]
    sizes = [f["bytes"] for f in ends]
    audio = b"".join(sock.checker.binary)
    mine = [f["bytes"] for f in ends if f["turn"] == turn]
    before = sum(sizes[: next(i for i, f in enumerate(ends) if f["turn"] == turn)])
    return audio[before : before + sum(mine)]


async def test_transcribe_only_returns_the_words_with_its_recording_id_and_takes_no_turn(
    speaking: Addresses,
) -> None:
    pcm = await speech()
    token, session_id = await speaking.api().person()
    async with connect(speaking, token, session_id) as sock:
        await sock.send("user_audio.start", rate=RATE, recording_id="frag-1")
        await send_audio(sock, pcm, pace=0)
        await sock.send("user_audio.end", transcribe_only=True)
        frames = await sock.until_type("transcript", timeout=30)
        transcript = frames[-1]
        assert set(transcript) == {"type", "seq", "text", "audio_seconds", "request_id", "recording_id"}
        assert transcript["recording_id"] == "frag-1" and transcript["request_id"].startswith("req_")
        assert len(heard_words(transcript["text"])) >= 5
        assert "turn.start" not in types(frames)
        # A silent recording comes back as an empty text; one with no recording_id names none.
        await sock.send("user_audio.start")
        await sock.send_raw(bytes(RATE * 2))
        await sock.send("user_audio.end", transcribe_only=True)
        silent = (await sock.until_type("transcript", timeout=30))[-1]
        assert (silent["text"], silent["recording_id"], silent["audio_seconds"]) == ("", None, 1.0)
        sock.checker.finish()
    # Nothing of it was stored: the transcript has only the greeting.
    assert [m["role"] for m in await speaking.api().messages(session_id, token)] == ["assistant"]


async def test_a_fourth_transcribe_only_in_flight_is_rate_limited_and_its_recording_stays_open(
    speaking: Addresses,
) -> None:
    # 8 kHz keeps the four recordings small, so they reach the runner together: a recording
    # that trickled in behind a decode could find the first one already done.
    pcm = await speech(rate=8000)
    token, session_id = await speaking.api().person()
    async with connect(speaking, token, session_id) as sock:
        for n in range(1, 5):
            await sock.send("user_audio.start", rate=8000, recording_id=f"frag-{n}")
            await sock.send_raw(pcm)
            await sock.send("user_audio.end", transcribe_only=True)
        got: list[dict[str, Any]] = []
        with trio.fail_after(60):
            while len([f for f in got if f["type"] == "transcript"]) < 3:
                got += [
                    f
                    for f in await sock.until_type("transcript", "error")
                    if f["type"] in ("transcript", "error")
                ]
        errors = [f for f in got if f["type"] == "error"]
        assert [(e["code"], e["recording_id"]) for e in errors] == [("rate_limited", "frag-4")]
        assert sorted(f["recording_id"] for f in got if f["type"] == "transcript") == [
            "frag-1",
            "frag-2",
            "frag-3",
        ]
        assert all(
            heard_words(f["text"]) for f in got if f["type"] == "transcript"
        )  # telephone rate: some words
        # The refused recording is still open: ending it again now works.
        await sock.send("user_audio.end", transcribe_only=True)
        last = (await sock.until_type("transcript", timeout=60))[-1]
        assert last["recording_id"] == "frag-4" and heard_words(last["text"])
        sock.checker.finish()


async def test_barge_in_cancels_the_running_turn_once_and_the_recording_becomes_the_next_turn(
    speaking: Addresses,
) -> None:
    pcm = await speech()
    token, session_id = await speaking.api().person()
    async with connect(speaking, token, session_id, tools=["open_page"]) as sock:
        await sock.send("user_message", text="Please open page spa")
        turn = (await sock.until_type("tool.call"))[0]["turn"]
        await sock.send("user_audio.start", rate=RATE, barge_in=True, recording_id="hands-free")
        await send_audio(sock, pcm)
        frames = await sock.until_type("interrupted", timeout=30)
        barge = next(f for f in frames if f["type"] == "barge_in")
        assert (barge["turn"], barge["recording_id"]) == (turn, "hands-free") and barge["text"]
        assert frames[-1]["reason"] == "barge_in" and frames[-1]["turn"] == turn
        # The recording goes on, and becomes the next turn; no second barge_in.
        await send_audio(sock, pcm, pace=0)
        await sock.send("user_audio.end")
        frames = await sock.turn_end(timeout=30)
        assert "barge_in" not in types(frames) and frames[-1]["type"] == "turn.done"
        assert len(heard_words(frames[-1]["heard"])) >= 5
        assert len(sock.checker.of_type("barge_in")) == 1
        sock.checker.finish()


async def test_barge_in_with_no_turn_running_names_no_turn(speaking: Addresses) -> None:
    pcm = await speech()
    token, session_id = await speaking.api().person()
    async with connect(speaking, token, session_id) as sock:
        await sock.send("user_audio.start", rate=RATE, barge_in=True)
        await send_audio(sock, pcm)
        barge = (await sock.until_type("barge_in", timeout=30))[-1]
        assert barge["turn"] is None and barge["recording_id"] is None
        # Nothing was heard that needs answering: the person closes it without a word.
        await sock.send("user_audio.end", discard=True)
        await sock.send("ping")
        assert [f for f in await sock.until_type("pong") if f["type"] not in ("heard.partial", "pong")] == []
        sock.checker.finish()


async def test_discard_throws_a_recording_away_and_the_running_turn_goes_on(speaking: Addresses) -> None:
    token, session_id = await speaking.api().person()
    async with connect(speaking, token, session_id, tools=["open_page"]) as sock:
        await sock.send("user_message", text="Please open page spa")
        call = (await sock.until_type("tool.call"))[-1]
        await sock.send("user_audio.start", rate=RATE)
        await sock.send_raw(bytes(RATE))
        await sock.send("user_audio.end", discard=True)
        await sock.send("tool.result", call_id=call["call_id"], result="open")
        frames = await sock.turn_end()
        assert frames[-1]["type"] == "turn.done" and "error" not in types(frames)
        # Discarded means closed: audio now has no recording to go to.
        await sock.send_raw(bytes(640))
        assert await sock.closed() == (4011, "binary audio with no user_audio.start before it")


async def test_user_audio_end_while_a_turn_runs_is_a_conflict_and_the_recording_stays_open(
    speaking: Addresses,
) -> None:
    pcm = await speech()
    token, session_id = await speaking.api().person()
    async with connect(speaking, token, session_id, tools=["open_page"]) as sock:
        await sock.send("user_message", text="Please open page spa")
        call = (await sock.until_type("tool.call"))[-1]
        await sock.send("user_audio.start", rate=RATE, recording_id="early")
        await send_audio(sock, pcm, pace=0)
        await sock.send("user_audio.end")
        error = (await sock.until_type("error"))[-1]
        assert (error["code"], error["recording_id"], error["turn"]) == ("conflict", "early", None)
        await sock.send("tool.result", call_id=call["call_id"], result="open")
        await sock.turn_end()
        await sock.send("user_audio.end")
        frames = await sock.turn_end(timeout=30)
        assert frames[-1]["type"] == "turn.done" and len(heard_words(frames[-1]["heard"])) >= 5
        sock.checker.finish()


async def test_invalid_request_for_an_end_with_nothing_recorded(speaking: Addresses) -> None:
    token, session_id = await speaking.api().person()
    async with connect(speaking, token, session_id) as sock:
        await sock.send("user_audio.end")
        error = (await sock.until_type("error"))[-1]
        assert error["code"] == "invalid_request" and error["recording_id"] is None
        await sock.send("user_audio.start", recording_id="empty")
        await sock.send("user_audio.end")
        error = (await sock.until_type("error"))[-1]
        assert (error["code"], error["recording_id"], error["message"]) == (
            "invalid_request",
            "empty",
            "nothing was recorded",
        )
        sock.checker.finish()


async def test_validation_failed_for_a_rate_model_or_language_the_socket_does_not_take(
    speaking: Addresses,
) -> None:
    # An error about a recording carries its recording_id (a bad one is not echoed), and a
    # model the runner does not have is not repeated back.
    token, session_id = await speaking.api().person()
    async with connect(speaking, token, session_id) as sock:
        for start, message, recording_id in [
            (
                {"rate": 12_345, "recording_id": "r1"},
                "user_audio.start.rate must be one of 8000, 16000, 22050, 24000, 44100",
                "r1",
            ),
            (
                {"model": "scribe_v2", "recording_id": "m"},
                "that model is not available here; this agent transcribes with 'whisper'",
                "m",
            ),
            (
                # French is heard (the multilingual extra, which the tests install); Klingon is not.
                {"language": "tlh", "recording_id": "l1"},
                "language: Whisper hears no language 'tlh'",
                "l1",
            ),
            (
                {"language": "e", "recording_id": "l2"},
                "user_audio.start.language must be 2 to 8 characters",
                "l2",
            ),
            ({"rate": 12_345}, "user_audio.start.rate must be one of 8000, 16000, 22050, 24000, 44100", None),
            (
                {"recording_id": "r" * 65},
                "user_audio.start.recording_id must be 1 to 64 characters",
                None,
            ),
        ]:
            await sock.send("user_audio.start", **start)
            error = (await sock.until_type("error"))[-1]
            assert (error["code"], error["message"], error["recording_id"]) == (
                "validation_failed",
                message,
                recording_id,
            )
        # None of those opened a recording.
        await sock.send_raw(bytes(640))
        assert await sock.closed() == (4011, "binary audio with no user_audio.start before it")


async def test_4011_for_a_recording_past_10_mb(speaking: Addresses) -> None:
    token, session_id = await speaking.api().person()
    async with connect(speaking, token, session_id) as sock:
        await sock.send("user_audio.start", rate=44_100)
        megabyte = bytes(1_000_000)
        for _ in range(10):
            await sock.send_raw(megabyte)
        await sock.send("ping")
        assert (await sock.until_type("pong"))[-1] == {"type": "pong"}  # 10 MB exactly is still a recording
        await sock.send_raw(b"\x00\x00")
        assert await sock.closed() == (
            4011,
            "the recording passed 10 MB: send long audio to POST /v1/transcriptions",
        )


async def test_cancel_discards_an_open_recording(speaking: Addresses) -> None:
    token, session_id = await speaking.api().person()
    async with connect(speaking, token, session_id) as sock:
        await sock.send("user_audio.start")
        await sock.send_raw(bytes(3200))
        await sock.send("cancel")
        await sock.send("user_audio.end")
        assert (await sock.until_type("error"))[-1]["code"] == "invalid_request"  # nothing open any more
        sock.checker.finish()
