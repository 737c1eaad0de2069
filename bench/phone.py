"""Phone calls against WebRTC calls: the same agent, the same sentences, in the same run.

    python -m bench.phone [--quick]        (root: it makes a network namespace)

The SIP stack of the phone tests (tests/livekit/lk_sip.py: redis-server, livekit-server and
LiveKit's SIP service in a private network namespace), one ``runner serve`` process with the
LiveKit tests' agent (hibari speaks, Whisper tiny.en hears, the local model answers), and two
callers of it, one after the other:

- **WebRTC**: an ``lk_peer.py`` participant publishing the sentences as a microphone track
  (espeak-ng's en-us+f2 at 22.05 kHz; Opus in the room).
- **Phone**: baresip dialing in through the SIP service, speaking the same sentences resampled
  to 8 kHz as its microphone (G.711 PCMU on the line).

Per turn, end of speech to first audio: from the caller's last loud sample leaving it to the
first loud 20 ms frame of the agent's reply reaching it. The WebRTC caller reads both moments
on the machine's monotonic clock in its own process (bench/livekit.py's ``say_and_hear``). The
phone has no such hook: the bench polls baresip's own recordings every 5 ms (its sndfile
module writes what it sends and what it hears as the audio passes, ``-enc.wav``/``-dec.wav``)
and takes the moment each one grew past the sample in question, so a phone figure carries up
to about 25 ms more of the phone's audio framing (20 ms packets) and polling. The WER is the
runner's own transcript of each turn (its ``user`` turn record) against the sentence.
Then phone calls at once on the one runner (``levels``: 2 for ``--quick``; 2, 3, 4, 6, 8 for
the full run), each saying the first sentences, until the p50 is more than twice the one-call
phone p50. Results go to ``bench/results/phone-<UTC>.json``.
"""

from __future__ import annotations

import argparse
import secrets
import sys
import tempfile
import time
import uuid
from array import array
from pathlib import Path
from typing import Any

import attrs
import jiwer
import numpy as np
import soxr
import trio

from ._common import cpu_report, cpu_sample, machine_info, print_table, say, summarize, write_results
from .livekit import SPEECH_LEVEL, VOICE, say_and_hear
from .speech import SENTENCES, _normalise

_LK_TESTS = Path(__file__).resolve().parents[1] / "tests" / "livekit"
if str(_LK_TESTS) not in sys.path:
    sys.path.insert(0, str(_LK_TESTS))

from lk_harness import find_livekit_server  # noqa: E402 - after the sys.path entry that makes tests/livekit's modules importable
from lk_runner import AGENT_IDENTITY, agent_spec, open_runner  # noqa: E402 - as above
from lk_sip import PHONE_RATE_HZ, Phone, SipEnv, SipStack, find_livekit_sip, write_wav  # noqa: E402 - as above

from runner.providers.espeak import EspeakTTS  # noqa: E402 - as above

LEAD_S = 0.5
TAIL_S = 1.5
POLL_S = 0.005
LOUD_DBFS = -40.0
FRAME = PHONE_RATE_HZ // 50  # 20 ms at 8 kHz


@attrs.frozen(kw_only=True)
class Profile:
    name: str
    sentences: int
    seconds: float
    levels: tuple[int, ...]  # phone calls at once, after the one-call figures
    level_turns: int  # turns per call at each level


QUICK = Profile(name="quick", sentences=6, seconds=300.0, levels=(2,), level_turns=3)
FULL = Profile(name="full", sentences=20, seconds=1200.0, levels=(2, 3, 4, 6, 8), level_turns=4)


@attrs.frozen(kw_only=True)
class Spoken:
    """One sentence as each caller plays it."""

    text: str
    pcm_path: Path  # for the WebRTC caller, at ``rate``
    rate: int
    after_speech_s: float  # quiet after its last loud sample, in the PCM file
    wav_path: Path  # for the phone, at 8 kHz, with a long quiet after (its end hangs up)
    last_loud_sample: int  # in the phone's file


async def spoken(directory: Path, index: int, text: str) -> Spoken:
    tts = EspeakTTS(VOICE)
    pcm = b"".join([chunk async for chunk in tts.synthesize(text)])
    rate = tts.sample_rate_hz
    data = bytes(2 * int(rate * LEAD_S)) + pcm + bytes(2 * int(rate * TAIL_S))
    samples = array("h", data)
    last = max(i for i, x in enumerate(samples) if abs(x) > SPEECH_LEVEL)
    pcm_path = directory / f"sentence-{index}.pcm"
    pcm_path.write_bytes(data)
    narrow = soxr.resample(
        np.frombuffer(data, dtype=np.int16).astype(np.float32) / 32768, rate, PHONE_RATE_HZ
    )
    narrow_pcm = (np.clip(narrow, -1, 1) * 32767).astype(np.int16)
    loud = np.nonzero(np.abs(narrow_pcm) > SPEECH_LEVEL)[0]
    wav = write_wav(directory / f"sentence-{index}.wav", narrow_pcm.tobytes() + bytes(2 * PHONE_RATE_HZ * 60))
    return Spoken(
        text=text,
        pcm_path=pcm_path,
        rate=rate,
        after_speech_s=(len(samples) - 1 - last) / rate,
        wav_path=wav,
        last_loud_sample=int(loud[-1]),
    )


def _samples(path: Path | None) -> int:
    if path is None or not path.exists():
        return 0
    return max(0, (path.stat().st_size - 44) // 2)


def _loud(frame: bytes) -> bool:
    x = np.frombuffer(frame, dtype=np.int16).astype(np.float64)
    return bool(10 * np.log10(np.mean(x * x) / 32768**2 + 1e-10) > LOUD_DBFS)


async def _when_grown(path: Path, samples: int, *, within: float) -> float:
    """``time.monotonic()`` once the recording at ``path`` holds ``samples`` samples."""
    with trio.fail_after(within):
        while True:  # a file has no event to wait for: it is polled
            if _samples(path) >= samples:
                return time.monotonic()
            await trio.sleep(POLL_S)


async def phone_turn(phone: Phone, sentence: Spoken, *, within: float = 25) -> float:
    """The phone says ``sentence``; seconds from the end of its speech leaving it to the first
    loud frame of the agent's reply reaching it."""
    sent = next(iter(sorted(phone.dumps.glob("*-enc.wav"))), None)
    heard = phone.heard_path()
    assert sent is not None and heard is not None, "the phone's call is not up"
    start = _samples(sent)
    await phone.speak(sentence.wav_path)
    ended_at = await _when_grown(sent, start + sentence.last_loud_sample + 1, within=within)
    position = _samples(heard)
    position -= position % FRAME
    with trio.fail_after(within):
        while True:
            grown = _samples(heard)
            data = heard.read_bytes()[44:]
            while position + FRAME <= grown:
                if _loud(data[2 * position : 2 * (position + FRAME)]):
                    first_loud = position
                    break
                position += FRAME
            else:
                await trio.sleep(POLL_S)
                continue
            break
    # The frame was already in the file when found: its arrival is at most one poll earlier.
    arrived = await _when_grown(heard, first_loud + FRAME, within=within)
    return arrived - ended_at


async def _quiet(phone: Phone, seconds: float) -> None:
    """Wait until the phone heard ``seconds`` of quiet at its end (the agent done talking)."""
    with trio.fail_after(30):
        while True:
            data = phone.heard()
            tail = data[-2 * int(PHONE_RATE_HZ * seconds) :]
            if len(tail) == 2 * int(PHONE_RATE_HZ * seconds) and not any(
                _loud(tail[i : i + 2 * FRAME]) for i in range(0, len(tail) - 2 * FRAME + 1, 2 * FRAME)
            ):
                return
            await trio.sleep(0.1)


def _user_turns(records: list[dict[str, Any]]) -> list[str]:
    return [
        r["body"]["text"]
        for r in records
        if r["body"].get("type") == "turn" and r["body"]["role"] == "user" and r["body"].get("spoken")
    ]


def _wer(references: list[str], heard: list[str]) -> dict[str, Any]:
    pairs = list(zip(references, heard, strict=False))
    if not pairs:
        return {"wer": None, "turns": 0}
    said = [_normalise(r) for r, _ in pairs]
    got = [_normalise(h) or "(nothing)" for _, h in pairs]
    return {
        "wer": jiwer.wer(said, got),
        "turns": len(pairs),
        "examples": [{"said": s, "heard": h} for s, h in list(zip(said, got, strict=True))[:4]],
    }


async def webrtc_call(env: SipEnv, host: Any, sentences: list[Spoken]) -> tuple[list[float], list[str]]:
    room = env.unique_room("webrtc")
    session_id = f"webrtc-{uuid.uuid4().hex[:6]}"
    latencies: list[float] = []
    async with env.peer("caller", room) as caller:
        await caller.request("publish_mic", rate=sentences[0].rate)
        answer = await host.start_call(session_id, room)
        assert answer.status == 202, answer.body
        await caller.request("wait_participant", identity=AGENT_IDENTITY)
        await caller.request("record", identity=AGENT_IDENTITY)
        await caller.request("wait_speech", within=20, timeout=25)  # the greeting
        for n, sentence in enumerate(sentences):
            say(f"WebRTC turn {n + 1}/{len(sentences)}")
            speech_end, heard_at = await say_and_hear(
                caller, (sentence.pcm_path, sentence.rate, sentence.after_speech_s), within=25
            )
            latencies.append(heard_at - speech_end)
            await caller.request("wait_quiet", after=heard_at, quiet_ms=700, within=20, timeout=25)
        await host.stop_call(session_id)
    records = await host.read_call(session_id, timeout=30)
    return latencies, _user_turns(records)


async def phone_call(env: SipEnv, host: Any, sentences: list[Spoken]) -> tuple[list[float], list[str]]:
    room = env.unique_room("phone")
    session_id = f"phone-{uuid.uuid4().hex[:6]}"
    number = "+1555" + "".join(secrets.choice("0123456789") for _ in range(7))
    latencies: list[float] = []
    async with env.peer("control", env.unique_room("control")) as control, env.phone("+15550123") as phone:
        trunk = await control.request("sip_inbound_trunk", numbers=[number])
        await control.request("sip_dispatch_rule", room=room, trunk_ids=[trunk["trunk_id"]])
        await phone.dial(f"sip:{number}@{env.sip_address}")
        with trio.fail_after(15):
            while True:  # the server's API has no event for it: it is polled
                listed = (await control.request("list_participants", room=room))["participants"]
                if any(p["kind"] == "SIP" for p in listed):
                    break
                await trio.sleep(0.2)
        answer = await host.start_call(session_id, room)
        assert answer.status == 202, answer.body
        await phone.wait_event("CALL_ESTABLISHED")
        await trio.sleep(1.0)
        await _quiet(phone, 0.8)  # the greeting said
        for n, sentence in enumerate(sentences):
            say(f"phone turn {n + 1}/{len(sentences)}")
            latencies.append(await phone_turn(phone, sentence))
            await _quiet(phone, 0.8)
        await phone.hang_up()
    records = await host.read_call(session_id, timeout=30)
    return latencies, _user_turns(records)


async def phones_at_once(env: SipEnv, host: Any, sentences: list[Spoken], calls: int) -> list[float]:
    """``calls`` phone calls at once on the one runner, each saying ``sentences``."""
    latencies: list[float] = []

    async def one() -> None:
        said, _ = await phone_call(env, host, sentences)
        latencies.extend(said)

    say(f"{calls} phone calls at once")
    async with trio.open_nursery() as nursery:
        for _ in range(calls):
            nursery.start_soon(one)
    return latencies


async def run(profile: Profile) -> dict[str, Any]:
    server, sip = find_livekit_server(), find_livekit_sip()
    if server is None or sip is None:
        raise SystemExit(
            "livekit-server or livekit-sip not found: run .ci/install-livekit-server and .ci/install-livekit-sip"
        )
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-phone-") as tmp:
        workdir = Path(tmp)
        stack = SipStack(server, sip, workdir / "stack")
        await trio.to_thread.run_sync(stack.start)
        env = SipEnv(stack, workdir)
        cpu_start = cpu_sample()
        try:
            texts = list(SENTENCES[: profile.sentences])
            sentences = [await spoken(workdir, n, text) for n, text in enumerate(texts)]
            levels: dict[int, list[float]] = {}
            with trio.fail_after(profile.seconds):
                async with open_runner(
                    env,
                    workdir / "journal.db",
                    "--max-sessions",
                    str(max(profile.levels)),
                    agent=agent_spec(),
                ) as host:
                    webrtc, webrtc_heard = await webrtc_call(env, host, sentences)
                    phone, phone_heard = await phone_call(env, host, sentences)
                    levels[1] = phone
                    for calls in profile.levels:
                        levels[calls] = await phones_at_once(
                            env, host, sentences[: profile.level_turns], calls
                        )
                        if np.median(levels[calls]) > 2 * np.median(phone):
                            break
        finally:
            cpu_end = cpu_sample()
            await env.aclose()
            await trio.to_thread.run_sync(stack.stop)
    return {
        "benchmark": "phone",
        "profile": profile.name,
        "command": "python -m bench.phone" + (" --quick" if profile is QUICK else ""),
        "seconds": time.perf_counter() - started,
        "machine": machine_info(),
        "parameters": attrs.asdict(profile)
        | {"voice": VOICE, "sip": "livekit-sip v1.0.0, baresip 1.0.0, PCMU"},
        "end_of_speech_to_first_audio_ms": {
            "webrtc": summarize(webrtc, scale=1000),
            "phone": summarize(phone, scale=1000),
        },
        "wer": {"webrtc": _wer(texts, webrtc_heard), "phone": _wer(texts, phone_heard)},
        "phone_calls_at_once": {
            str(calls): summarize(values, scale=1000) for calls, values in sorted(levels.items())
        },
        "samples_ms": {
            "webrtc": [round(v * 1000, 1) for v in webrtc],
            "phone": [round(v * 1000, 1) for v in phone],
        },
        "cpu": cpu_report(cpu_start, cpu_end),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="6 sentences per caller, then 2 phones at once")
    args = parser.parse_args()
    profile = QUICK if args.quick else FULL
    result = trio.run(run, profile)
    path = write_results("phone", result)
    latency = result["end_of_speech_to_first_audio_ms"]
    rows = []
    for path_name in ("webrtc", "phone"):
        s = latency[path_name]
        rows.append(
            [
                path_name,
                str(s.get("n", 0)),
                f"{s.get('p50', 0):.0f}",
                f"{s.get('p99', 0):.0f}",
                f"{result['wer'][path_name]['wer']:.3f}"
                if result["wer"][path_name]["wer"] is not None
                else "-",
            ]
        )
    print_table(["caller", "turns", "p50 ms", "p99 ms", "WER"], rows)
    webrtc_p50, phone_p50 = latency["webrtc"].get("p50"), latency["phone"].get("p50")
    if webrtc_p50 and phone_p50:
        say(f"phone / WebRTC p50: {phone_p50 / webrtc_p50:.2f}")
    print_table(
        ["phone calls at once", "turns", "p50 ms", "p99 ms", "p50 / one call"],
        [
            [
                calls,
                s.get("n", 0),
                f"{s.get('p50', 0):.0f}",
                f"{s.get('p99', 0):.0f}",
                f"{s.get('p50', 0) / phone_p50:.2f}" if phone_p50 else "-",
            ]
            for calls, s in result["phone_calls_at_once"].items()
        ],
    )
    say(f"results: {path}")


if __name__ == "__main__":
    main()
