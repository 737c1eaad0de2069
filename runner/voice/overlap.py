"""Speech over the agent's voice: a backchannel ("mm-hm", "yeah"), a sound with no words, or an
interruption ("wait", "no, I said Tuesday")?

While the agent speaks, the caller's speech first holds its voice (the pipeline stops sending
it, so it falls silent within the transport's short queue) and is then judged by its words:
a backchannel or no words at all (a cough, a hum) lets the voice go on from where it was held
(livekit-agents calls this resuming after a false interruption); anything else is an
interruption and cuts the agent's turn. Pure logic: words in, a verdict out.

A backchannel is a short sound that a small recognizer easily mishears ("Mm-hm." as "and mimic
him.", "Uh-huh." as "It's hot."). So a short overlap heard as an interruption is decoded again
with :data:`BACKCHANNEL_PROMPT` as the text before it, which makes the recognizer spell these
sounds as it should; only if it is still no backchannel does it cut the agent. The prompt is
not used first: it also turns some real, badly heard interruptions into "Yeah."
"""

from __future__ import annotations

import re
from typing import Literal

__all__ = ["BACKCHANNELS", "BACKCHANNEL_PROMPT", "Overlap", "classify_overlap", "worth_a_second_hearing"]

#: What a listener says to mean "go on", in words Whisper writes them with.
BACKCHANNELS = frozenset(
    """yeah yes yep yup ya okay ok k right sure mhm mhmm mmhm mm-hm mm-hmm hm mm uh-huh uhhuh uh huh aha ah oh alright
    i see got it all right cool great good nice true exactly really wow indeed gotcha fine go on""".split()
)
#: The recognizer's hint when a short overlap is heard again (see the module's docstring).
BACKCHANNEL_PROMPT = "Mm-hm. Uh-huh. Yeah. Okay. Right."
# A hum written as Whisper writes it: "mm", "hmm", "mm-hm", "mm-hm-hm", "uh-huh".
_HUM = re.compile(r"(?:u?h?m+|m+-?h+m+|uh-?huh)(?:-h?m+)*")
# Sounds with no meaning of their own: with nothing else said they are no words at all.
_NOISES = frozenset("uh um er erm ah eh hmm hm mm mmm oh".split())
# A backchannel is short: longer speech over the agent is taken as a turn of its own.
_MAX_BACKCHANNEL_WORDS = 4

#: ``"none"``: no words (a false interruption); ``"backchannel"``; ``"interruption"``.
Overlap = Literal["none", "backchannel", "interruption"]


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z']+(?:-[a-z']+)*", text.lower())


def classify_overlap(text: str) -> Overlap:
    """What the caller's ``text``, said over the agent's voice, was."""
    words = _words(text)
    meant = [w for w in words if w not in _NOISES]
    if not meant:
        return "none"
    if len(words) <= _MAX_BACKCHANNEL_WORDS and all(w in BACKCHANNELS or _HUM.fullmatch(w) for w in meant):
        return "backchannel"
    return "interruption"


def worth_a_second_hearing(text: str) -> bool:
    """Whether ``text``, an interruption by its words, is short enough to be a misheard
    backchannel, and is decoded again with :data:`BACKCHANNEL_PROMPT`."""
    return classify_overlap(text) == "interruption" and len(_words(text)) <= _MAX_BACKCHANNEL_WORDS
