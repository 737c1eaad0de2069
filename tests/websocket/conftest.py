"""A runner of the speaking agent shared by the tests of this package that need no runner of their own."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .ino_client import Addresses, BackgroundRunner


@pytest.fixture(scope="session")
def speaking(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Addresses]:
    """The addresses of one ``runner serve tests.websocket.ino_agents:speaking`` (40 calls)."""
    runner = BackgroundRunner(Path(tmp_path_factory.mktemp("ino")) / "journal.db", "--max-sessions", "40")
    try:
        yield runner.addresses
    finally:
        runner.stop()
