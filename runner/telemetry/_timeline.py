"""A spoken turn's timeline: the moments between the caller's last word and the agent's first.

Each moment (``paused``, ``decoded``, ``turn_ended``, ``model_first_text``, ...) is one
debug line of the logger ``runner.voice.timeline`` holding ``time.monotonic()``, which every
process on the machine reads from the same clock: a caller process (``bench/livekit_voice.py``)
lines them up with its own timestamps to show where each millisecond of a reply goes. Off
(the logger below debug, the default) a mark costs one level check.
"""

from __future__ import annotations

import logging
import time

__all__ = ["mark"]

_log = logging.getLogger("runner.voice.timeline")


def mark(moment: str) -> None:
    """Log that ``moment`` happened now (``runner.voice.timeline``, debug)."""
    if _log.isEnabledFor(logging.DEBUG):
        _log.debug("%s %.6f", moment, time.monotonic())
