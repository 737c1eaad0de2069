"""Cutting a streamed reply into sentence-sized pieces for speech. Pure logic.

Sentence boundaries come from pysbd (its rules for abbreviations, initials, decimals,
quotes and lists), not from a regular expression of our own.
"""

from __future__ import annotations

import re

import pysbd

# Only text holding a possible sentence end is worth handing to pysbd (about 0.5 ms a call).
_MAYBE_END = re.compile(r"[.!?…]")
_SOFT = re.compile(r"[,;:\u2014\u2013]\s")  # em and en dashes
# Appended to text that ends in whitespace, to ask pysbd whether the last sentence is over
# ("fine. " is, "Dr. " is not): the probe is then a sentence of its own or not.
_PROBE = "Then"


class SentenceChunker:
    """Feed text deltas; get back whole sentences as soon as they end.

    A sentence is over once text (or whitespace) follows its end, so "3." may still become
    "3.5". Pieces shorter than ``min_chars`` wait for the next sentence, so speech does not
    come in choppy bursts. A sentence longer than ``max_chars`` is cut at its last soft break
    (a comma, a semicolon, a dash) so speech never waits too long for a full stop.
    """

    def __init__(self, *, max_chars: int = 220, min_chars: int = 12) -> None:
        self._buffer = ""
        self._max = max_chars
        self._min = min_chars
        self._segmenter = pysbd.Segmenter(language="en", clean=False, char_span=False)

    def _complete(self) -> list[str]:
        """The buffer's sentences that are surely over, as written (spaces included)."""
        # A sentence longer than max_chars is cut anyway, so pysbd (whose cost grows with the
        # text) only reads the buffer's start.
        text = self._buffer[: 2 * self._max]
        if not _MAYBE_END.search(text):
            return []
        probed = len(text) == len(self._buffer) and text[-1].isspace()
        segments: list[str] = self._segmenter.segment(text + _PROBE if probed else text)
        # The last segment may go on; with the probe it is the probe's, and holds text only
        # when the sentence before it was not over.
        if len(segments) < 2:
            return []
        done = segments[:-1]
        if "".join(done) != text[: sum(map(len, done))]:
            return []  # pysbd changed the text: trust none of it
        return done

    def feed(self, text: str) -> list[str]:
        self._buffer += text
        out: list[str] = []
        while True:
            piece = ""
            for sentence in self._complete():
                piece += sentence
                if len(piece) >= self._min:  # counting the space after it, as the old rule did
                    break
            else:
                piece = ""
            if piece:
                out.append(piece.strip())
                self._buffer = self._buffer[len(piece) :]
                continue
            if len(self._buffer) > self._max:
                soft = list(_SOFT.finditer(self._buffer[: self._max]))
                cut = soft[-1].end() if soft else self._buffer.rfind(" ", 0, self._max) + 1 or self._max
                out.append(self._buffer[:cut].strip())
                self._buffer = self._buffer[cut:]
                continue
            return [p for p in out if p]

    def flush(self) -> list[str]:
        rest, self._buffer = self._buffer.strip(), ""
        return [rest] if rest else []
