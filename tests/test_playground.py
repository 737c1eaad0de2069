"""The playground of ``runner dev``, in Debian's Chromium driven by Playwright.

A real ``runner dev`` process serves the page on its public listener; the page talks to the
built-in agent over the ``ino.v2`` socket, typed and spoken (Chromium's fake microphone plays
an espeak-ng WAV), plays the replies' audio and shows the call's journal records live.

``CURB_PLAYGROUND_SCREENSHOTS=docs`` also writes the screenshots the README shows.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from playwright.sync_api import Browser, Page, sync_playwright

from runner.providers.espeak import EspeakTTS
from runner.voice.audio import write_wav

REPO = Path(__file__).resolve().parent.parent
CHROMIUM = os.environ.get("CURB_CHROMIUM", "/usr/bin/chromium")
# The flags that work on a closed network, and sound that plays without a click.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--autoplay-policy=no-user-gesture-required",
]
PLAYGROUND = "runner: playground on "
QUESTION = "What is the weather in Lisbon?"
ANSWER = "Here is what I found: In Lisbon it is sunny and 24 degrees."
WAIT_MS = 60_000

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"no Chromium at {CHROMIUM}")


class DevRunner:
    """``runner dev`` (the built-in agent) in a process of its own; its stderr read line by line."""

    def __init__(self, journal: Path, agent: str | None = None) -> None:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
            "CURB_MANAGEMENT_TOKEN": "playground-test",
        }
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "runner",
                "dev",
                *([agent] if agent else []),
                "--address",
                "127.0.0.1:0",
                "--public-address",
                "127.0.0.1:0",
                "--journal",
                str(journal),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.stderr: list[str] = []
        self.stdout: list[str] = []
        self.readers = [
            threading.Thread(target=self._read, args=(stream, into), daemon=True)
            for stream, into in ((self.process.stderr, self.stderr), (self.process.stdout, self.stdout))
        ]
        for reader in self.readers:
            reader.start()

    def _read(self, stream: Any, into: list[str]) -> None:
        for raw in stream:
            line = raw.decode(errors="replace").rstrip("\n")
            into.append(line)
            self.lines.put(line)

    def url(self, seconds: float = 60) -> str:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.2)
            except queue.Empty:
                if self.process.poll() is not None:
                    raise AssertionError("runner dev exited:\n" + "\n".join(self.stderr)) from None
                continue
            if line.startswith(PLAYGROUND):
                return line.removeprefix(PLAYGROUND)
        raise AssertionError("no playground line:\n" + "\n".join(self.stderr))

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
        code = self.process.wait()
        for reader in self.readers:
            reader.join(timeout=5)
        for stream in (self.process.stdin, self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()
        return code


@pytest.fixture
def dev(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[DevRunner]:
    runner = DevRunner(tmp_path / "journal.db", getattr(request, "param", None))
    try:
        yield runner
    finally:
        code = runner.stop()
    # Ctrl-C on a dev runner ends its own call at once and exits cleanly.
    assert code == 0, "\n".join(runner.stderr)


def _browser(playwright: Any, *extra: str) -> Browser:
    return playwright.chromium.launch(executable_path=CHROMIUM, args=[*CHROMIUM_ARGS, *extra])


def _open(browser: Browser, url: str, failures: list[str]) -> Page:
    page = browser.new_page(viewport={"width": 1280, "height": 760})
    page.on("pageerror", lambda error: failures.append(f"pageerror: {error}"))
    page.on("requestfailed", lambda request: failures.append(f"request failed: {request.url}"))
    page.on(
        "response",
        lambda response: (
            failures.append(f"{response.status} {response.url}") if response.status >= 400 else None
        ),
    )
    page.goto(url)
    # The built-in agent greets: its opening line is the first reply on screen.
    page.wait_for_function("window.playground.replies.length >= 1", timeout=WAIT_MS)
    return page


def _shot(page: Page, tmp_path: Path, name: str) -> None:
    page.wait_for_timeout(300)  # let the last frame render
    page.screenshot(path=str(tmp_path / name))
    target = os.environ.get("CURB_PLAYGROUND_SCREENSHOTS")
    if target:
        page.screenshot(path=str(REPO / target / name))


def _journal_texts(page: Page) -> list[str]:
    return page.eval_on_selector_all("#journal li", "items => items.map(i => i.textContent)")


@pytest.mark.parametrize("dev", ["tests.playground_agents:moody_concierge"], indirect=True)
def test_a_typed_turn_gets_the_reply_its_tool_and_its_records_on_screen(
    dev: DevRunner, tmp_path: Path
) -> None:
    url = dev.url()
    failures: list[str] = []
    with sync_playwright() as playwright:
        browser = _browser(playwright)
        page = _open(browser, url, failures)
        # The dev runner's own terminal call is live too: the page's call is not refused 4013.
        assert page.text_content("#status") == "connected · speaks"
        page.fill("#text", QUESTION)
        page.press("#text", "Enter")
        page.wait_for_function("window.playground.replies.length >= 2", timeout=WAIT_MS)
        replies = page.eval_on_selector_all(
            "#transcript li.agent", "items => items.map(i => i.firstChild.textContent)"
        )
        assert replies[-1] == ANSWER
        assert page.eval_on_selector_all("#transcript li.user", "items => items.map(i => i.textContent)") == [
            QUESTION
        ]
        (tool,) = page.eval_on_selector_all("#transcript li.tool", "items => items.map(i => i.textContent)")
        assert tool.startswith('⚙ weather({"city":"Lisbon"}) → "In Lisbon it is sunny and 24 degrees."'), tool
        # The call's records, from the journal as they are committed.
        page.wait_for_function(
            "[...document.querySelectorAll('#journal li')].some(i => i.textContent.includes('sunny'))",
            timeout=WAIT_MS,
        )
        records = _journal_texts(page)
        assert any("curb.started" in r for r in records)
        assert any(f"user: {QUESTION}" in r for r in records)
        assert any(f"assistant: {ANSWER}" in r for r in records)
        # The reply is heard, not only read, and says how the agent feels.
        page.wait_for_function("window.playground.played > 1", timeout=WAIT_MS)
        assert page.text_content("#transcript li.agent:last-of-type .mood") == "cheerful 0.4"

        # A live settings change from the form (the host's PATCH path): accepted, it is journaled
        # and the effective settings show it (the agent's own voice, whatever its provider).
        voice = page.evaluate("JSON.parse(document.querySelector('#effective').textContent).tts.voice")
        page.fill("#voice", str(voice))
        page.click("#settings button")
        page.wait_for_function(
            "[...document.querySelectorAll('#journal li')].some(i => i.textContent.endsWith('curb.settings accepted'))",
            timeout=WAIT_MS,
        )
        # A change the runner refuses is shown as an error, and changes nothing.
        page.fill("#voice", "no-such-voice")
        page.click("#settings button")
        page.wait_for_selector("#transcript li.error", timeout=WAIT_MS)
        assert page.text_content("#transcript li.error").startswith("settings refused: invalid_settings: ")
        assert (
            page.evaluate("JSON.parse(document.querySelector('#effective').textContent).tts.voice") == voice
        )
        _shot(page, tmp_path, "playground-typed.png")
        browser.close()
    # The refused PATCH (422 invalid_settings) is the one failure the page was made to see.
    assert [f for f in failures if "/dev/sessions/" not in f or not f.startswith("422 ")] == []


async def _question_wav(path: Path) -> None:
    voice = EspeakTTS("en-us+f2")
    pcm = b"".join([chunk async for chunk in voice.synthesize(QUESTION)])
    pause = bytes(2 * voice.sample_rate_hz // 2)
    write_wav(path, pause + pcm + pause, voice.sample_rate_hz)


def test_a_spoken_turn_from_the_microphone_is_heard_answered_and_played(
    dev: DevRunner, tmp_path: Path
) -> None:
    wav = tmp_path / "question.wav"
    trio.run(_question_wav, wav)
    url = dev.url()
    failures: list[str] = []
    with sync_playwright() as playwright:
        browser = _browser(
            playwright,
            "--use-fake-ui-for-media-stream",
            "--use-fake-device-for-media-stream",
            f"--use-file-for-fake-audio-capture={wav}%noloop",
        )
        page = _open(browser, url, failures)
        # The greeting was heard to its end.
        page.wait_for_function(
            "window.playground.played > 0 && window.playground.playing.size === 0", timeout=WAIT_MS
        )
        before = page.evaluate("window.playground.played")
        page.click("#mic")
        page.wait_for_function("document.querySelector('#mic').getAttribute('aria-pressed') === 'true'")
        page.wait_for_timeout(3_000)  # the WAV: half a second, the question, half a second
        page.click("#mic")
        page.wait_for_function("window.playground.replies.length >= 2", timeout=WAIT_MS)
        (heard,) = page.evaluate("window.playground.heard")
        assert heard, "the recognizer heard nothing"
        # The recognizer's words are on screen as the person's turn, and in the journal.
        assert page.eval_on_selector_all(
            "#transcript li.user.spoken", "items => items.map(i => i.textContent)"
        ) == [heard]
        # Some of the question's words (a loaded machine may starve the page's microphone).
        assert {"what", "weather", "lisbon"} & set(heard.lower().strip("?.!").split()), heard
        page.wait_for_function(
            "text => [...document.querySelectorAll('#journal li')]"
            ".some(i => i.textContent.includes('user: ' + text))",
            arg=heard,
            timeout=WAIT_MS,
        )
        # The reply to it is on screen and its audio plays after the greeting's.
        reply = page.evaluate("window.playground.replies[1]")
        assert (
            reply
            and page.eval_on_selector_all("#transcript li.agent", "items => items.map(i => i.textContent)")[
                -1
            ]
            == reply
        )
        page.wait_for_function(f"window.playground.played > {before} + 0.5", timeout=WAIT_MS)
        _shot(page, tmp_path, "playground-spoken.png")
        browser.close()
    assert failures == []
