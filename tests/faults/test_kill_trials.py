"""kill -9 at random moments of a mixed load: nothing acknowledged is lost, nothing repeats.

The load and the checks are ``kill_load``'s (``python -m bench.kill --trials N`` runs hundreds).
A failure names its seed: ``CURB_KILL_SEED=N`` runs the same trials again.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from .kill_load import Load, run_trials

pytestmark = pytest.mark.slow


# Requests are in flight at each kill; httpx then leaves their sockets and body streams to
# the garbage collector (encode/httpx#3777), which is its warning, not the runner's.
@pytest.mark.filterwarnings("ignore::ResourceWarning")
async def test_random_kills_under_load_lose_and_repeat_nothing(tmp_path: Path) -> None:
    seed = int(os.environ.get("CURB_KILL_SEED") or random.SystemRandom().randrange(2**32))
    tally = await run_trials(tmp_path / "j.db", trials=4, seed=seed, load=Load())
    summary = tally.summary()
    assert tally.ok, f"seed {seed} (CURB_KILL_SEED={seed} repeats it): {summary}"
    # The trials did what they are for: calls, messages and stops acknowledged, calls the
    # kills left open, and followers across every kill.
    assert tally.trials == 4 and tally.acknowledged > 0 and tally.crashed_calls > 0, f"seed {seed}: {summary}"
    assert tally.followed >= 4 * tally.records, f"seed {seed}: {summary}"
