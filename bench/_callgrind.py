"""Counting instructions with callgrind: the driver the ``*_instructions`` benchmarks share.

Wall-clock figures on a shared machine move with its other load; instruction counts do
not (a wait, an fsync's included, is not an instruction). A benchmark runs its measured
part in a child process of its own under ``valgrind --tool=callgrind --instr-atstart=no``;
the child switches counting on (:func:`counting`) only around what it measures, after
its start-up and warm-up. :func:`count` runs one child and reads the total back, and
optionally splits it by the object the instructions ran in (the interpreter, SQLite,
libc, the rest). Needs valgrind (``apt-get install valgrind``).
"""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import trio

TOTALS = re.compile(rb"^totals:\s+(\d+)", re.MULTILINE)
# The objects a count is split by (a line of callgrind_annotate names its object's file).
OBJECTS = ("libpython", "libsqlite3", "libc.so")
_ROOT = Path(__file__).resolve().parent.parent


def missing() -> str | None:
    """Why instructions cannot be counted here, or None when they can."""
    if shutil.which("valgrind") and shutil.which("callgrind_control"):
        return None
    return "valgrind is not installed (apt-get install valgrind)"


async def _toggle(state: str) -> None:
    await trio.run_process(["callgrind_control", "-i", state, str(os.getpid())], capture_stdout=True)


@asynccontextmanager
async def counting() -> AsyncIterator[None]:
    """Count this process's instructions inside the block (in a child that :func:`count` runs)."""
    await _toggle("on")
    try:
        yield
    finally:
        await _toggle("off")


def count(
    module: str,
    args: Sequence[str],
    data_dir: Path,
    *,
    by_object: bool = False,
    tree: Path | None = None,
) -> dict[str, Any]:
    """Run ``python -m module *args`` under callgrind; return the instructions it counted.

    Args:
        module: The benchmark module; ``args`` make it run as the child.
        data_dir: Where callgrind's output goes (deleted once read).
        by_object: Also split the count by object (``by_object``, ``other_by_object``).
        tree: Import the packages this source tree holds (an older build's, see
            :func:`source_tree`) from it rather than from this one.
    """
    out = data_dir / f"callgrind-{module.rsplit('.', 1)[-1]}-{os.getpid()}.out"
    command = [
        "valgrind",
        "--tool=callgrind",
        "--instr-atstart=no",
        f"--callgrind-out-file={out}",
        sys.executable,
        "-m",
        module,
        *args,
    ]
    env = dict(os.environ)
    if tree is not None:
        # The tree's packages first, then this one's: the harness stays this build's.
        env["PYTHONPATH"] = os.pathsep.join([str(tree), str(_ROOT)])
    # Not run from this tree, which would come first on the path.
    subprocess.run(command, check=True, capture_output=True, timeout=3600, cwd=data_dir, env=env)
    try:
        found = TOTALS.search(out.read_bytes())
        assert found, f"no totals in {out}"
        got: dict[str, Any] = {"instructions": int(found.group(1))}
        if by_object:
            annotated = subprocess.run(
                ["callgrind_annotate", "--threshold=100", str(out)],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            got |= _split_by_object(annotated)
    finally:
        out.unlink(missing_ok=True)
    return got


def _split_by_object(annotated: str) -> dict[str, Any]:
    by_object = dict.fromkeys((*OBJECTS, "other"), 0)
    others: dict[str, int] = {}
    for line in annotated.splitlines():
        match = re.match(r"^\s*([\d,]+)\s+\(\s*[\d.]+%\)\s+(.*)$", line)
        if not match or "PROGRAM TOTALS" in line:
            continue
        instructions = int(match.group(1).replace(",", ""))
        where = match.group(2)
        owner = next((name for name in OBJECTS if name in where), "other")
        if owner == "other" and "/Python-3." in where:
            owner = "libpython"  # the interpreter's inlined functions, shown by source file only
        by_object[owner] += instructions
        # The rest by its object's file name (a C extension module, the dynamic loader...).
        if owner == "other":
            found_object = re.search(r"\[([^\]]+)\]\s*$", where)
            name = Path(found_object.group(1)).name if found_object else "(unknown object)"
            others[name] = others.get(name, 0) + instructions
    top = dict(sorted(others.items(), key=lambda item: -item[1])[:8])
    return {"by_object": by_object, "other_by_object": top}


@contextmanager
def source_tree(rev: str, paths: Sequence[str] = ("journal", "migrations", "runner")) -> Iterator[Path]:
    """Some packages of this repository at commit ``rev``, exported to a temporary directory.

    An older build to count (or time) beside the current one in the same run, under the
    same harness: only ``paths`` are exported, and they go first on the child's path.
    ``git archive`` leaves the repository itself untouched.
    """
    with tempfile.TemporaryDirectory(prefix="bench-build-") as tmp:
        archive = subprocess.run(
            ["git", "-C", str(_ROOT), "archive", "--format=tar", rev, *paths], check=True, capture_output=True
        ).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(tmp, filter="data")
        yield Path(tmp)
