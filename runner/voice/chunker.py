"""Cutting a streamed reply into sentence-sized pieces for speech. Pure logic."""

from __future__ import annotations

import re

# A sentence ends at . ! ? … followed by whitespace; "e.g. " and "3.5" do not end one.
_END = re.compile(
    r"(?<!\b[A-Za-z]\.[A-Za-z])(?<!\be\.g)(?<!\bi\.e)(?<!\bMr)(?<!\bMrs)(?<!\bDr)(?<!\bSt)[.!?…]+[\"')\]]*\s"
)
_SOFT = re.compile(r"[,;:\u2014\u2013]\s")  # em and en dashes


class SentenceChunker:
    """Feed text deltas; get back whole sentences as soon as they end.

    A sentence longer than ``max_chars`` is cut at its last soft break (a comma, a
    semicolon, a dash) so speech never waits too long for a full stop.
    """

    def __init__(self, *, max_chars: int = 220, min_chars: int = 12) -> None:
        self._buffer = ""
        self._max = max_chars
        self._min = min_chars

    def feed(self, text: str) -> list[str]:
        self._buffer += text
        out: list[str] = []
        while True:
            match = None
            for candidate in _END.finditer(self._buffer):
                if candidate.end() >= self._min:
                    match = candidate
                    break
            if match is not None:
                out.append(self._buffer[: match.end()].strip())
                self._buffer = self._buffer[match.end() :]
                continue
            if len(self._buffer) > self._max:
                soft = [m for m in _SOFT.finditer(self._buffer[: self._max])]
                cut = soft[-1].end() if soft else self._buffer.rfind(" ", 0, self._max) + 1 or self._max
                out.append(self._buffer[:cut].strip())
                self._buffer = self._buffer[cut:]
                continue
            return [piece for piece in out if piece]

    def flush(self) -> list[str]:
        rest, self._buffer = self._buffer.strip(), ""
        return [rest] if rest else []
