"""The playground of ``runner dev``, in Debian's Chromium driven by Playwright.

A real ``runner dev`` process serves the page on its public listener; the page talks to the
built-in agent over the ``ino.v2`` socket, typed and spoken (Chromium's fake microphone plays
an espeak-ng WAV), plays the replies' audio and shows the call's journal records live.

``CURB_PLAYGROUND_SCREENSHOTS=docs`` also writes the screenshots the README shows.
"""

from __future__ import annotations

import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from array import array
from collections.abc import Iterator
from functools import partial
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
ANSWER = "In Lisbon it is sunny and 24 degrees."
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


def _microphone_browser(playwright: Any, wav: Path) -> Browser:
    """Chromium whose microphone plays ``wav`` once, then silence."""
    return _browser(
        playwright,
        "--use-fake-ui-for-media-stream",
        "--use-fake-device-for-media-stream",
        f"--use-file-for-fake-audio-capture={wav}%noloop",
    )


def _open(browser: Browser, url: str, failures: list[str], width: int = 1280) -> Page:
    page = browser.new_page(viewport={"width": width, "height": 760})
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
        browser = _microphone_browser(playwright, wav)
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


SHOP = """\
from runner.agent import Agent

shop = Agent("shop", instructions="We sell bicycles.", greeting="{greeting}")
"""


def test_a_reload_moves_the_page_to_a_new_conversation_that_greets_with_the_new_code(tmp_path: Path) -> None:
    agent = tmp_path / "shop.py"
    agent.write_text(SHOP.format(greeting="Hello from the old shop."), encoding="utf-8")
    runner = DevRunner(tmp_path / "journal.db", str(agent))
    failures: list[str] = []
    try:
        url = runner.url()
        with sync_playwright() as playwright:
            browser = _browser(playwright)
            page = _open(browser, url, failures)
            first = page.evaluate("window.playground.session.session_id")
            assert page.evaluate("window.playground.replies") == ["Hello from the old shop."]
            agent.write_text(SHOP.format(greeting="Hello from the new shop."), encoding="utf-8")
            page.wait_for_function("window.playground.replies.length >= 2", timeout=WAIT_MS)
            assert page.evaluate("window.playground.replies") == [
                "Hello from the old shop.",
                "Hello from the new shop.",
            ]
            second = page.evaluate("window.playground.session.session_id")
            assert second != first
            assert page.text_content("#session") == second
            assert page.text_content("#status") == "connected · text only"
            notes = page.eval_on_selector_all("#transcript li.note", "items => items.map(i => i.textContent)")
            assert f"(the agent was reloaded: a new conversation, {second})" in notes
            # The journal pane follows the new conversation's call.
            page.wait_for_function(
                "[...document.querySelectorAll('#journal li')].some(i => i.textContent.includes('Hello from the new shop.'))",
                timeout=WAIT_MS,
            )
            browser.close()
    finally:
        code = runner.stop()
    assert code == 0, "\n".join(runner.stderr)
    assert failures == []


WIDTHS = (1280, 420)
# Every control of the conversation, as the person sees it: whole, and inside the window.
CUT_CONTROLS = """() => {
  const talk = document.querySelector('#talk').getBoundingClientRect();
  return [...document.querySelectorAll('#say button, #say input')]
    .filter(e => e.offsetParent !== null)
    .filter(e => {
      e.scrollIntoView({block: 'nearest'});
      const box = e.getBoundingClientRect();
      const top = document.elementFromPoint(box.left + 3, box.top + box.height / 2);
      const topRight = document.elementFromPoint(box.right - 3, box.top + box.height / 2);
      return e.scrollWidth > e.clientWidth + 1 || box.left < talk.left || box.right > talk.right
        || !e.contains(top) || !e.contains(topRight);
    })
    .map(e => e.id + ' ' + e.textContent);
}"""
SHOWN_PATHS = "() => [...document.querySelectorAll('#settings [data-path]')].filter(e => !e.hidden).map(e => e.dataset.path)"


def test_the_page_fits_a_phone_and_offers_only_the_settings_a_host_may_change(tmp_path: Path) -> None:
    agent = tmp_path / "shop.py"
    agent.write_text(SHOP.format(greeting="Hello from the shop."), encoding="utf-8")
    failures: list[str] = []
    for spec, shown in ((None, ["tts.voice", "stt.language", "llm", "llm"]), (str(agent), None)):
        runner = DevRunner(tmp_path / f"{agent.stem if spec else 'concierge'}.db", spec)
        try:
            url = runner.url()
            with sync_playwright() as playwright:
                browser = _browser(playwright)
                for width in WIDTHS:
                    page = _open(browser, url, failures, width=width)
                    page.wait_for_function("document.querySelector('#effective').textContent !== ''")
                    assert page.evaluate(CUT_CONTROLS) == [], (spec, width)
                    assert page.evaluate("document.documentElement.scrollWidth") <= width, (spec, width)
                    assert page.text_content("#send") == "Send"
                    if shown is None:
                        # Nothing adjustable: no form to be refused by, and a line saying why.
                        assert page.is_hidden("#settings") and page.is_visible("#fixed"), width
                    else:
                        assert page.is_visible("#settings") and page.is_hidden("#fixed"), width
                        assert page.evaluate(SHOWN_PATHS) == shown, width
                        assert page.is_hidden("#tts-model")
                    _shot(page, tmp_path, f"playground-{width}.png")
                    page.close()
                browser.close()
        finally:
            code = runner.stop()
        assert code == 0, "\n".join(runner.stderr)
    assert failures == []


async def _hands_free_wav(path: Path, *, noise: bool = False) -> None:
    """Quiet, the question, three seconds of quiet, as a person says it; with ``noise``, half a
    second of hiss (a breath, a door: sound with no words) and eleven seconds of quiet first
    (the page waits 8 s for words before it discards a recording)."""
    voice = EspeakTTS("en-us+f2")
    pcm = b"".join([chunk async for chunk in voice.synthesize(QUESTION)])
    rate = voice.sample_rate_hz
    second = bytes(2 * rate)
    hiss = random.Random(7)
    before = second
    if noise:
        burst = array("h", (max(-32767, min(32767, round(hiss.gauss(0, 3000)))) for _ in range(rate // 2)))
        before = second + burst.tobytes() + 11 * second
    write_wav(path, before + pcm + 3 * second, rate)


HANDS_FREE_STATE = (
    "(({recordings, heard, partials, peakDb, bargeIns, played}) =>"
    " ({recordings, heard, partials, peakDb, bargeIns, played}))(window.playground)"
)


def test_hands_free_the_page_hears_the_person_start_and_stop_and_the_agent_answers(
    dev: DevRunner, tmp_path: Path
) -> None:
    wav = tmp_path / "hands-free.wav"
    trio.run(partial(_hands_free_wav, noise=True), wav)
    url = dev.url()
    failures: list[str] = []
    with sync_playwright() as playwright:
        browser = _microphone_browser(playwright, wav)
        page = _open(browser, url, failures)
        page.wait_for_function(
            "window.playground.played > 0 && window.playground.playing.size === 0", timeout=WAIT_MS
        )
        # One click, and nothing more: the page hears each sound start and end by itself.
        page.click("#hands-free")
        page.wait_for_function("window.playground.replies.length >= 2", timeout=WAIT_MS)
        state = page.evaluate(HANDS_FREE_STATE)
        # Two barge_in recordings: the hiss, which brought no words and was discarded (no turn,
        # no error), then the question, ended as the turn.
        assert state["recordings"] == [
            {"id": "hands-free-1", "outcome": "discarded"},
            {"id": "hands-free-2", "outcome": "turn"},
        ], state
        (heard,) = state["heard"]
        assert {"what", "weather", "lisbon"} & set(heard.lower().strip("?.!").split()), heard
        # The words showed while the person spoke, the meter moved, the recognizer said it was them.
        assert state["partials"], state
        assert state["peakDb"] > -40, state
        assert len(state["bargeIns"]) == 1 and state["bargeIns"][0]["turn"] is None, state
        assert page.eval_on_selector_all(
            "#transcript li.user.spoken", "items => items.map(i => i.textContent)"
        ) == [heard]
        assert page.query_selector("#transcript li.partial") is None
        assert page.query_selector("#transcript li.error") is None
        reply = page.evaluate("window.playground.replies[1]")
        assert (
            page.eval_on_selector_all(
                "#transcript li.agent", "items => items.map(i => i.firstChild.textContent)"
            )[-1]
            == reply
        )
        _shot(page, tmp_path, "playground-hands-free.png")
        browser.close()
    assert failures == []


@pytest.mark.parametrize("dev", ["tests.playground_agents:talkative_concierge"], indirect=True)
def test_hands_free_talking_over_the_agent_stops_its_voice_and_takes_the_turn(
    dev: DevRunner, tmp_path: Path
) -> None:
    wav = tmp_path / "over.wav"
    trio.run(_hands_free_wav, wav)
    url = dev.url()
    failures: list[str] = []
    with sync_playwright() as playwright:
        browser = _microphone_browser(playwright, wav)
        page = browser.new_page(viewport={"width": 1280, "height": 760})
        page.on("pageerror", lambda error: failures.append(f"pageerror: {error}"))
        page.goto(url)
        # Listening from the start: the question comes a second into the long greeting.
        page.wait_for_function("window.playground.ready", timeout=WAIT_MS)
        page.click("#hands-free")
        # The spoken turn answered (the greeting may have ended interrupted, or done).
        page.wait_for_function(
            "window.playground.spokenTurns.length > 0"
            " && window.playground.answered.includes(window.playground.spokenTurns[0])",
            timeout=WAIT_MS,
        )
        state = page.evaluate(HANDS_FREE_STATE)
        (barge,) = state["bargeIns"]
        # The agent was speaking when the person's words came: its voice stopped there, with
        # the rest of its greeting unplayed.
        assert barge["playing"] > 0 and barge["unplayed"] > 1, state
        assert state["recordings"] == [{"id": "hands-free-1", "outcome": "turn"}], state
        (heard,) = state["heard"]
        assert {"what", "weather", "lisbon"} & set(heard.lower().strip("?.!").split()), heard
        assert page.eval_on_selector_all(
            "#transcript li.user.spoken", "items => items.map(i => i.textContent)"
        ) == [heard]
        if barge["turn"] is not None:
            # The greeting was still being written: the server cut it, as cancel would.
            notes = page.eval_on_selector_all("#transcript li.note", "items => items.map(i => i.textContent)")
            assert any(note.startswith("(the reply stopped: ") for note in notes), notes
        browser.close()
    assert failures == []
