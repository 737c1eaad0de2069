"""When has the caller finished? Adaptive endpointing: a short silence, then the model's word.

A fixed silence (500 ms) both waits after a sentence that plainly ended and cuts in on a caller
who pauses mid-sentence ("a table for ... four"). Here a pause in the caller's speech is judged
by the end-of-turn model (:mod:`runner.voice.smart_turn`, on the audio up to the pause) and by
the words decoded so far: once ``min_silence_ms`` of quiet has passed, a pause the model rates
finished ends the turn; one it rates unfinished, or whose words stop on "the", "and", "for" or
mid-number, waits for more speech up to ``max_silence_ms``, when the turn ends whatever was
said. Without the model (``pipecat-ai`` not installed) the fixed ``silence_ms`` rule stays.

Pure logic: no Trio, no clock. Time is the audio's own, in milliseconds, so the same audio and
the same verdicts always end a turn at the same point of the stream.
"""

from __future__ import annotations

import re
from typing import Literal

import attrs

__all__ = ["TURN_DETECTIONS", "EndOfTurn", "TurnTaking", "sounds_unfinished"]

#: How a turn's end is found: ``"smart_turn"`` (the model, the default) or ``"silence"`` (fixed).
TURN_DETECTIONS = ("smart_turn", "silence")

# Words a finished English sentence almost never ends on: articles, conjunctions, prepositions,
# possessives, fillers. A transcript that stops on one is a caller still thinking.
_UNFINISHED_WORDS = frozenset(
    """a an the and or but because if than to of for with from at by about into my your our their
    um uh er erm""".split()
)
_DIGITS = frozenset("zero oh one two three four five six seven eight nine".split()) | frozenset("0123456789")


def sounds_unfinished(text: str) -> bool:
    """Whether ``text`` stops where a sentence cannot: on a word such as "the", "and", "for",
    a filler, a comma, a dash or an ellipsis, or a number read digit by digit (a phone number,
    a code). A question mark is taken at its word ("Where are you from?" is finished)."""
    stripped = text.strip()
    if not stripped or stripped.endswith("?"):
        return False
    if stripped[-1] in ",-\u2013\u2014\u2026" or stripped.endswith(".."):
        return True
    words = re.findall(r"[\w']+", stripped.lower())
    if not words:
        return False
    if words[-1] in _UNFINISHED_WORDS:
        return True
    digits = 0
    for word in reversed(words):
        if word not in _DIGITS:
            break
        digits += 1
    return digits >= 2


@attrs.frozen(kw_only=True)
class TurnTaking:
    """An agent's turn-taking settings (``Agent(turn_detection=..., ...)``).

    Attributes:
        detection: ``"smart_turn"`` (the end-of-turn model decides at each pause) or
            ``"silence"`` (``silence_ms`` of quiet ends every turn).
        silence_ms: The fixed rule's silence; also the rule when the model is not installed.
        min_silence_ms: The quiet a pause needs before the model's "finished" ends the turn.
        max_silence_ms: The longest the caller may pause: the turn ends then, whatever the
            model and the words said.
        threshold: The model's probability from which a pause is the turn's end.
        backchannels: Speech over the agent's voice holds it and is judged by its words
            (:mod:`runner.voice.overlap`): "mm-hm", "yeah" or no words let it go on. ``False``:
            any speech over it cuts it off at once.
    """

    detection: Literal["smart_turn", "silence"] = "smart_turn"
    silence_ms: int = 500
    min_silence_ms: int = 200
    max_silence_ms: int = 2000
    threshold: float = 0.5
    backchannels: bool = True

    def __attrs_post_init__(self) -> None:
        if self.detection not in TURN_DETECTIONS:
            raise ValueError(f"turn detection must be one of {', '.join(TURN_DETECTIONS)}")
        if not 100 <= self.silence_ms <= 5000:
            raise ValueError("end_of_turn_silence_ms must be within 100..5000")
        if not 100 <= self.min_silence_ms <= self.max_silence_ms <= 5000:
            raise ValueError(
                "min_end_of_turn_silence_ms and max_end_of_turn_silence_ms must be within 100..5000, "
                "the min at most the max"
            )
        if not 0.0 < self.threshold < 1.0:
            raise ValueError("the end-of-turn threshold must be within (0, 1)")


@attrs.define
class _Pause:
    at_ms: float
    probability: float | None = None
    words: str | None = None
    words_coming: bool = False


class EndOfTurn:
    """One caller's pauses and what was judged of them; asks :meth:`due` at each frame.

    The listener reports a pause (:meth:`paused`, with the stream time the speech stopped) and
    its end (:meth:`resumed`); the model's verdict (:meth:`judged`) and the words decoded so far
    (:meth:`heard`) arrive later, each naming the pause it is for, and are dropped if the caller
    went on meanwhile.
    """

    def __init__(self, settings: TurnTaking) -> None:
        self.settings = settings
        self._pause: _Pause | None = None
        self._count = 0

    def paused(self, at_ms: float) -> int:
        """The caller stopped speaking at ``at_ms``; returns the pause's number."""
        self._count += 1
        self._pause = _Pause(at_ms=at_ms)
        return self._count

    def resumed(self) -> None:
        """The caller went on (or the turn ended): what was judged of the pause is stale."""
        self._pause = None

    def expect_words(self, pause: int) -> None:
        """The words up to pause ``pause`` are being decoded: the turn does not end before
        they are known (the reply waits for them anyway, so this costs no time)."""
        if self._pause is not None and pause == self._count:
            self._pause.words_coming = True

    def judged(self, pause: int, probability: float) -> None:
        """The model rates pause ``pause`` finished with ``probability``."""
        if self._pause is not None and pause == self._count:
            self._pause.probability = probability

    def heard(self, pause: int, words: str) -> None:
        """The recognizer heard ``words`` up to pause ``pause``."""
        if self._pause is not None and pause == self._count:
            self._pause.words = words

    def due(self, now_ms: float) -> bool:
        """Whether the turn ends at stream time ``now_ms`` (before the detector's own cap)."""
        pause = self._pause
        if pause is None or pause.probability is None:
            return False
        if now_ms - pause.at_ms < self.settings.min_silence_ms:
            return False
        if pause.words is None and pause.words_coming:
            return False
        if pause.words is not None and sounds_unfinished(pause.words):
            return False
        return pause.probability >= self.settings.threshold
