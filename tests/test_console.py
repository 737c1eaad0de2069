"""``runner console``: talking to an agent in the terminal, as a person would run it."""

from __future__ import annotations

import os
import subprocess
import sys
import wave
from pathlib import Path

import numpy as np
import trio

REPO = Path(__file__).resolve().parent.parent


async def console(
    *args: str, stdin: str, cwd: Path, seconds: float = 30
) -> subprocess.CompletedProcess[bytes]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
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
    assert "Here is what I found: In lisbon it is sunny and 24 degrees." in lines[1]
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
        assert (audio.getnchannels(), audio.getsampwidth(), audio.getframerate()) == (1, 2, 22_050)
        seconds = audio.getnframes() / audio.getframerate()
        pcm = audio.readframes(audio.getnframes())
    # A greeting and an answer of some twenty words: several seconds of audible speech.
    assert 4.0 < seconds < 20.0
    level = float(np.sqrt(np.mean(np.frombuffer(pcm, "<i2").astype(np.float64) ** 2)))
    assert level > 500


async def test_spoken_console_writes_console_wav_by_default(tmp_path: Path) -> None:
    done = await console(stdin="hello\n", cwd=tmp_path)
    assert done.returncode == 0, done.stderr.decode()
    assert (tmp_path / "console.wav").stat().st_size > 44


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
