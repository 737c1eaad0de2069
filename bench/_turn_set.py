"""The turn-taking bench's set, built from the embedded voices (hibari's default, two espeak ones).

- complete: whole sentences, as a caller says them and stops;
- hesitation: the same sentences cut at a word boundary where they are plainly unfinished ("a
  table for | four people"), with 300 to 1,500 ms of quiet put in before the rest, a third
  of them with a filler ("um", "uh") in the middle of that quiet. The cut is made in the whole
  sentence's audio (tests/voice/turn_audio.py): a fragment synthesized on its own ends with a
  sentence's fall, and Smart Turn rates it finished;
- backchannel and interruption: what a caller says over the agent's voice.

Every other item is mixed with the noise the speech bench uses (white, 10 dB below the voice).
"""

from __future__ import annotations

import attrs

from tests.voice.turn_audio import cut_after, say, silence

from .speech import NOISE_BELOW_SPEECH_DB, _noisy

# "|" marks the cut of the hesitation: the words before it cannot end a sentence.
SENTENCES = (
    "I would like to book a table for | four people tomorrow evening.",
    "Could you tell me the | opening hours of the pool?",
    "My name is John and | I am calling about my order.",
    "I need to change the | date of my appointment.",
    "Can I speak to someone about | my bill please?",
    "We are looking for a room with | a view of the sea.",
    "The parcel was sent to the | wrong address last week.",
    "I was wondering if you | could help me with something.",
    "Please send the invoice to | my office address.",
    "I would like to cancel my | subscription as soon as possible.",
    "Is there a pharmacy near the | train station?",
    "We will arrive on Friday and | leave on Sunday morning.",
    "Could you remind me of the | name of the doctor?",
    "I am calling because my | internet has stopped working.",
    "Can you put me through to the | sales department?",
    "I think the problem is with the | heating in the kitchen.",
    "My daughter and I would like | two tickets for the concert.",
    "What time does the last | bus leave tonight?",
    "I have a question about the | price of the garden room.",
    "Could you book me a taxi to | the airport at noon?",
)
BACKCHANNELS = (
    "Mm-hm.",
    "Yeah.",
    "Okay.",
    "Right.",
    "Uh-huh.",
    "Sure.",
    "I see.",
    "Got it.",
    "Yes.",
    "Okay, sure.",
)
INTERRUPTIONS = (
    "Wait.",
    "No, I said Tuesday.",
    "Stop, that is wrong.",
    "Hold on a second.",
    "Sorry, can you repeat that?",
    "Actually, I want the other one.",
    "No, no, not that one.",
    "Excuse me, one question.",
    "Wait, what was the price?",
    "That is not what I asked.",
)
VOICES = ("hibari", "espeak:en-us", "espeak:en-gb")
PAUSES_MS = (300, 500, 700, 900, 1100, 1300, 1500)
FILLERS = ("Um.", "Uh.")
LEAD_MS = 300


@attrs.frozen(kw_only=True)
class Item:
    """One clip: ``pcm`` at ``rate``, with where its voice ends (ms) and, for a hesitation,
    where its pause starts and the rest begins."""

    kind: str
    text: str
    voice: str
    noisy: bool
    pcm: bytes
    rate: int
    voice_end_ms: float
    pause_ms: float = 0.0
    resume_ms: float = 0.0
    #: A hesitation's quiet from ``pause_ms`` to its filler or the rest of the sentence.
    quiet_ms: float = 0.0


def _ms(pcm: bytes, rate: int) -> float:
    return len(pcm) * 500 / rate


def _voice_end_ms(pcm: bytes, rate: int) -> float:
    import numpy as np

    loud = np.flatnonzero(np.abs(np.frombuffer(pcm, "<i2")) > 328)
    return float(loud[-1] + 1) * 1000 / rate if loud.size else 0.0


async def build(*, every: int = 1) -> list[Item]:
    """The set; ``every`` > 1 keeps one sentence and one overlap phrase in ``every``."""
    items: list[Item] = []
    n = 0
    for v, voice in enumerate(VOICES):
        for s, marked in enumerate(SENTENCES[::every]):
            before, after = (part.strip() for part in marked.split("|"))
            text = f"{before} {after}"
            whole, rate = await say(text, voice)
            noisy = (s + v) % 2 == 1
            lead = silence(LEAD_MS, rate)
            items.append(_item("complete", text, voice, noisy, lead + whole + silence(2500, rate), rate, n))
            cut = cut_after(whole, rate, len(before.split()) - 1)
            pause = PAUSES_MS[(s + v) % len(PAUSES_MS)]
            gap = silence(pause, rate)
            quiet = float(pause)
            if s % 3 == 0:
                filler, _ = await say(FILLERS[s % 2], voice)
                half = silence(max(0.0, (pause - _ms(filler, rate)) / 2), rate)
                gap = half + filler + half
                quiet = _ms(half, rate)
            head = lead + whole[:cut]
            clip = head + gap + whole[cut:] + silence(2500, rate)
            items.append(
                attrs.evolve(
                    _item("hesitation", marked, voice, noisy, clip, rate, n),
                    pause_ms=_voice_end_ms(head, rate),
                    resume_ms=_ms(head + gap, rate),
                    quiet_ms=quiet,
                )
            )
            n += 1
        for kind, phrases in (("backchannel", BACKCHANNELS), ("interruption", INTERRUPTIONS)):
            for p, phrase in enumerate(phrases[::every]):
                pcm, rate = await say(phrase, voice)
                clip = silence(LEAD_MS, rate) + pcm + silence(2500, rate)
                items.append(_item(kind, phrase, voice, (p + v) % 2 == 1, clip, rate, n))
                n += 1
    return items


def _item(kind: str, text: str, voice: str, noisy: bool, clip: bytes, rate: int, seed: int) -> Item:
    end = _voice_end_ms(clip, rate)
    if noisy:
        clip = _noisy(clip, NOISE_BELOW_SPEECH_DB, seed)
    return Item(kind=kind, text=text, voice=voice, noisy=noisy, pcm=clip, rate=rate, voice_end_ms=end)
