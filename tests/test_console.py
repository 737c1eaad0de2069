"""``runner console``: talking to an agent in the terminal, as a person would run it."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
import wave
from pathlib import Path

import numpy as np
import pytest
import trio

from runner.console import open_audio

REPO = Path(__file__).resolve().parent.parent


async def console(
    *args: str, stdin: str, cwd: Path, seconds: float = 30, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[bytes]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        **(env or {}),
    }
    with trio.fail_after(seconds):
        return await trio.run_process(
            [sys.executable, "-m", "runner", "console", *args],
            stdin=stdin.encode(),
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            cwd=cwd,
            env=env,
        )


async def test_text_console_prints_the_reply_and_exits_0_at_end_of_input(tmp_path: Path) -> None:
    done = await console("--text", stdin="what is the weather in lisbon\n", cwd=tmp_path)
    out = done.stdout.decode()
    assert done.returncode == 0, done.stderr.decode()
    lines = out.splitlines()
    # The built-in concierge greets first (one of its two experiment variants), then answers.
    assert len(lines) == 2, out
    assert "Welcome to Hotel Lumen" in lines[0] or "welcome to Hotel Lumen" in lines[0]
    assert "[weather(city='lisbon')]" in lines[1]
    assert "In lisbon it is sunny and 24 degrees." in lines[1]
    assert "ms" in lines[1]  # the timings
    assert "\x1b[" not in out  # not a terminal: no escape codes
    # Text only: nothing is spoken, so no WAV file appears.
    assert list(tmp_path.iterdir()) == []


async def test_text_console_takes_a_line_per_turn_and_skips_blank_ones(tmp_path: Path) -> None:
    agent = tmp_path / "shop.py"
    agent.write_text(
        "from runner.agent import Agent\n"
        "agent = Agent('shop', instructions='We sell bicycles. We open at nine.')\n",
        encoding="utf-8",
    )
    done = await console(
        "--text", f"{agent}:agent", stdin="when do you open\n\n   \nwhat do you sell\n", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr.decode()
    lines = done.stdout.decode().splitlines()
    assert [line.split("  (")[0] for line in lines] == ["We open at nine.", "We sell bicycles."]


async def test_empty_input_still_greets_and_exits_0(tmp_path: Path) -> None:
    done = await console("--text", stdin="", cwd=tmp_path)
    assert done.returncode == 0, done.stderr.decode()
    assert "Hotel Lumen" in done.stdout.decode()


async def test_spoken_console_writes_the_replies_to_a_wav(tmp_path: Path) -> None:
    target = tmp_path / "replies.wav"
    done = await console("--wav", str(target), stdin="what is the weather in lisbon\n", cwd=tmp_path)
    out = done.stdout.decode()
    assert done.returncode == 0, done.stderr.decode()
    assert "In lisbon it is sunny and 24 degrees." in out
    assert f"speech written to {target}" in out
    assert "first audio" in out
    with wave.open(str(target), "rb") as audio:
        assert (audio.getnchannels(), audio.getsampwidth(), audio.getframerate()) == (1, 2, 24_000)
        seconds = audio.getnframes() / audio.getframerate()
        pcm = audio.readframes(audio.getnframes())
    # A greeting and an answer of some twenty words: several seconds of audible speech.
    assert 4.0 < seconds < 20.0
    level = float(np.sqrt(np.mean(np.frombuffer(pcm, "<i2").astype(np.float64) ** 2)))
    assert level > 500


async def test_without_audio_devices_the_console_says_why_once_and_stays_text(tmp_path: Path) -> None:
    if open_audio()[0] is not None:
        pytest.skip("this machine has audio devices: the console plays and hears them")
    done = await console(stdin="what is the weather in lisbon\n", cwd=tmp_path)
    assert done.returncode == 0, done.stderr.decode()
    said = [line for line in done.stderr.decode().splitlines() if line.startswith("runner: no audio")]
    assert len(said) == 1 and said[0].endswith("; text only"), done.stderr.decode()
    assert "In lisbon it is sunny and 24 degrees." in done.stdout.decode()
    assert "first audio" not in done.stdout.decode()  # nothing was spoken
    assert list(tmp_path.iterdir()) == []


def _null_sound_card(home: Path) -> dict[str, str]:
    """An environment whose ALSA default device is the null one: a sound card that hears silence."""
    home.mkdir()
    (home / ".asoundrc").write_text("pcm.!default { type null }\n", encoding="utf-8")
    return {"HOME": str(home)}


async def test_with_a_sound_card_the_console_speaks_and_listens(tmp_path: Path) -> None:
    env = _null_sound_card(tmp_path / "home")
    try:
        import sounddevice  # noqa: F401 - imported only to learn whether it loads
    except OSError:
        pytest.skip("no PortAudio here (.ci/install-audio installs it)")
    work = tmp_path / "work"
    work.mkdir()
    # Well under wait_played's 60 s limit: the last reply is played, then the console exits.
    done = await console(stdin="what is the weather in lisbon\n", cwd=work, env=env, seconds=45)
    assert done.returncode == 0, done.stderr.decode()
    assert "no audio" not in done.stderr.decode()
    out = done.stdout.decode()
    # Spoken: the replies were synthesized and played (first audio), and nothing was written.
    assert "In lisbon it is sunny and 24 degrees." in out
    assert out.count("first audio") == 2, out
    assert list(os.scandir(work)) == []


def _talk_on_a_terminal(lines: list[bytes], cwd: Path, seconds: float = 60) -> tuple[str, int]:
    """Run ``runner console --text`` on a pseudo-terminal; type each line once the prompt shows."""
    parent, child = pty.openpty()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "runner", "console", "--text"],
        stdin=child,
        stdout=child,
        stderr=subprocess.DEVNULL,
        cwd=cwd,
        env=env,
    )
    os.close(child)
    seen = b""
    deadline = time.monotonic() + seconds
    pending = list(lines)
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([parent], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(parent, 4096)
                except OSError:  # the console exited and closed the terminal
                    break
                if not chunk:
                    break
                seen += chunk
            if pending and seen.count(b"you> ") == len(lines) - len(pending) + 1:
                os.write(parent, pending.pop(0))
            if process.poll() is not None and not ready:
                break
        code = process.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        os.close(parent)
    return seen.decode(errors="replace").replace("\r\n", "\n"), code


def test_on_a_terminal_the_console_prompts_helps_and_quits(tmp_path: Path) -> None:
    out, code = _talk_on_a_terminal([b"/help\n", b"/what\n", b"when is breakfast\n", b"/quit\n"], tmp_path)
    assert code == 0, out
    assert "Hotel Lumen" in out  # the greeting came before the first prompt
    assert out.index("Hotel Lumen") < out.index("you> ")
    assert "/quit   end" in out and "/help   this list" in out
    assert "unknown command /what; /help lists them" in out
    # /help and /what were not turns: the only reply answers the one question asked.
    assert out.count("ms)") == 2, out  # the greeting's timings and the answer's
    assert out.count("you> ") == 4, out  # /quit ended it: no fifth prompt


async def test_a_failed_turn_is_said_in_place_of_the_reply_and_the_exit_is_1(tmp_path: Path) -> None:
    from .test_logs import refusing_url

    with refusing_url() as url:
        agent = tmp_path / "broken.py"
        agent.write_text(
            "from runner.agent import Agent, LLM\n"
            "agent = Agent('broken', instructions='.',\n"
            f"    llm=LLM(provider='openai-compatible', model='m', base_url={url!r}))\n",
            encoding="utf-8",
        )
        done = await console("--text", f"{agent}:agent", stdin="hello\n", cwd=tmp_path)
    assert done.returncode == 1, done.stderr.decode()
    (line,) = done.stdout.decode().splitlines()
    assert line.startswith(
        "[turn failed at the model: unavailable: cannot reach openai-compatible: ConnectError]  ("
    ), line
    # The conversation is the terminal: by default no log line interrupts it.
    assert done.stderr == b""
