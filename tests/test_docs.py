"""What the docs tell a reader: protocols by their own names, and shell blocks that run in ``sh``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import trio

from .runner_process import start_runner

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
SH_BLOCK = re.compile(r"```sh\n(.*?)```", re.S)
# A random seed (a flag, a variable, "random seed N") is a seed; any other is the protocols'
# working name, which a reader does not have.
RANDOM_SEED = re.compile(r"--seed\b|\b[A-Z_]+_SEED\b|\brandom seeds?\b", re.I)


def _reader_docs() -> list[Path]:
    docs = [README, REPO / "clients" / "typescript" / "README.md"]
    docs += sorted((REPO / "docs").rglob("*.md"))
    docs += sorted(p for p in (REPO / "examples").rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    return docs


def test_no_doc_cites_the_seed() -> None:
    found = []
    for path in _reader_docs():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if re.search("seed", RANDOM_SEED.sub("", line), re.I):
                found.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert not found, "name the protocol (host protocol 1.0, ino.v2) instead:\n" + "\n".join(found)


def test_the_docs_say_where_the_protocols_are() -> None:
    host = (REPO / "docs" / "host-protocol.md").read_text(encoding="utf-8")
    socket = (REPO / "docs" / "agent-websocket.md").read_text(encoding="utf-8")
    assert "host protocol 1.0" in host and "`runner/protocol.schema.json`" in host
    assert "`ino.v2`" in socket and "`runner/ino.schema.json`" in socket
    for schema in ("protocol.schema.json", "ino.schema.json"):
        assert (REPO / "runner" / schema).is_file()


def _sh_blocks() -> list[str]:
    return SH_BLOCK.findall(README.read_text(encoding="utf-8"))


def test_every_shell_block_of_the_readme_parses_in_posix_sh() -> None:
    blocks = _sh_blocks()
    assert len(blocks) >= 3
    for block in blocks:
        checked = subprocess.run(["sh", "-n", "-c", block], capture_output=True, text=True, check=False)
        assert checked.returncode == 0, f"{checked.stderr}\n{block}"


async def test_the_readme_acts_as_the_host_in_posix_sh(tmp_path: Path) -> None:
    """The README's host commands, run by ``sh`` as written, against ``runner serve`` on its defaults."""
    (place,) = [b for b in _sh_blocks() if "/v1/sessions" in b]
    (follow,) = [b for b in _sh_blocks() if "/v1/runner/events" in b]
    # The runner made its token (no CURB_MANAGEMENT_TOKEN) beside its journal, in the reader's directory.
    # The test's agent is importable from the clone, not from the reader's directory.
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    async with start_runner(
        tmp_path / "runner-journal.db", env={"CURB_MANAGEMENT_TOKEN": "", "PYTHONPATH": path}, cwd=tmp_path
    ) as runner:
        assert (tmp_path / "runner-journal.db.token").exists()
        env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
        # Only the port differs: the test's runner listens on a free one.
        follower = await trio.lowlevel.open_process(
            ["sh", "-eu", "-c", follow.replace("127.0.0.1:7071", runner.address)],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
        )
        followed = b""
        try:
            done = await trio.run_process(
                ["sh", "-eu", "-c", place.replace("127.0.0.1:7071", runner.address)],
                cwd=tmp_path,
                env=env,
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
            said = done.stdout.decode()
            assert done.returncode == 0, said + done.stderr.decode()
            assert '"ok":true' in said and '"sessionId":"call-1"' in said, said
            assert "curb.ended" in said and "stopped_by_host" in said, said
            assert follower.stdout is not None
            with trio.move_on_after(30):
                async for chunk in follower.stdout:
                    followed += chunk
                    if b"stopped_by_host" in followed:
                        break
        finally:
            follower.kill()
            await follower.wait()
    assert b"curb.started" in followed and b"stopped_by_host" in followed, followed.decode()
