"""One runner process per module of the generated-input suite."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from ..websocket.ino_client import BackgroundRunner


@contextmanager
def fuzzed_runner(
    tmp_path_factory: pytest.TempPathFactory, agent: str, *args: str
) -> Iterator[BackgroundRunner]:
    """A runner for a module's examples; it must not have printed a traceback by the end."""
    runner = BackgroundRunner(tmp_path_factory.mktemp("fuzz") / "journal.db", *args, agent=agent)
    try:
        yield runner
    finally:
        runner.stop()
    assert not any("Traceback" in line for line in runner.stderr), "\n".join(runner.stderr[-60:])
