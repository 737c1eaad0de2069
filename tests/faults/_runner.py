"""What the fault tests share: a runner that must refuse to start, and a journal's bytes."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from ..runner_process import start_runner


def start(session_id: str, **extra: Any) -> dict[str, Any]:
    return {"sessionId": session_id, "realtimeUrl": "loopback:", "realtimeToken": "t", **extra}


def digest(*paths: Path) -> dict[str, str | None]:
    """Each file's SHA-256, None for a file that is not there (a -wal that was never made)."""
    return {
        path.name: hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None for path in paths
    }


def journal_files(journal: Path) -> list[Path]:
    return [journal, Path(f"{journal}-wal"), Path(f"{journal}-shm")]


async def refused_start(
    journal: Path, *extra: str, env: dict[str, str] | None = None
) -> tuple[int, list[str]]:
    """Start a runner that must refuse; return its exit status and its stderr lines."""
    async with start_runner(journal, *extra, wait_ready=False, env=env) as runner:
        code = await runner.wait_exit(timeout=60)
        await runner.wait_for(lambda: True)
    return code, [line for line in runner.stderr if line.strip()]


def one_line_naming(lines: list[str], path: Path, words: str) -> str:
    """The runner said why in one line naming the file, with no traceback."""
    assert not any("Traceback" in line for line in lines), "\n".join(lines)
    said = [line for line in lines if line.startswith("runner: ")]
    assert len(said) == 1, "\n".join(lines)
    assert str(path) in said[0] and words in said[0], said[0]
    return said[0]
