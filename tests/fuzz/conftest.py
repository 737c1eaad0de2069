"""The generated-input suite's settings, and one runner per module (not per example).

The CI profile is small and deterministic; ``python -m bench.fuzz`` runs the same checks
longer, with a seed of its choice.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "fuzz-ci",
    max_examples=int(os.environ.get("CURB_FUZZ_EXAMPLES", "8")),
    deadline=None,  # each example is a real exchange with a process on a loaded machine
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    print_blob=True,
)
