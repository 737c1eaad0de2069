"""docs/quickstart.md, run as written: every file written, every command run, its output checked.

The page's ``python`` blocks that start with ``# NAME`` are written to NAME; its ``console``
blocks run, in order, in a fresh virtual environment and an empty directory. The environment
sees nothing of the interpreter running the tests (no system site-packages): the page's own
install command brings everything its later commands use, as it would for a reader. Its
packages come from the registry through pip's cache, which ``.ci/run``'s own install of the
package has filled in the same run (about a minute to install here, no download). In a block, ``$ `` starts a command and the lines after
it are its output, checked in order (other lines may come between them); ``…`` stands for
anything, and the default ports for the free ones the test uses. A comment before a block
says how to run it: ``cwd=repo`` (in the clone), ``type="..."`` (a line typed once the
output before it showed) and ``then=ctrl-c`` (the command runs until its output showed,
then gets SIGINT).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import attrs
import pytest

REPO = Path(__file__).resolve().parent.parent
PAGE = REPO / "docs" / "quickstart.md"
BLOCK = re.compile(r"(?:<!-- quickstart: (?P<directive>.*?) -->\n)?```(?P<lang>\w+)\n(?P<body>.*?)```", re.S)
COMMAND_S = 240.0
# The page's install: some fifty packages into an empty environment, from pip's cache.
INSTALL_S = 900.0


@attrs.frozen
class Command:
    line: str
    expected: tuple[str, ...]
    cwd_repo: bool = False
    # Each line to type, with the output that must show before it is typed.
    typed: tuple[tuple[str, tuple[str, ...]], ...] = ()
    ctrl_c: bool = False


def _page() -> tuple[dict[str, str], list[Command]]:
    files: dict[str, str] = {}
    commands: list[Command] = []
    for block in BLOCK.finditer(PAGE.read_text(encoding="utf-8")):
        body, directive = block["body"], block["directive"] or ""
        if block["lang"] == "python":
            first, _, rest = body.partition("\n")
            if first.startswith("# ") and first.endswith(".py"):
                files[first[2:]] = rest
            continue
        if block["lang"] != "console":
            continue
        typed = re.findall(r'type="([^"]*)"', directive)
        for line in body.splitlines():
            if line.startswith("$ "):
                commands.append(
                    Command(line[2:], (), cwd_repo="cwd=repo" in directive, ctrl_c="then=ctrl-c" in directive)
                )
            elif not commands or line == "^C":
                continue
            elif line in typed:
                last = commands[-1]
                commands[-1] = attrs.evolve(last, typed=(*last.typed, (line, last.expected)))
            else:
                last = commands[-1]
                commands[-1] = attrs.evolve(last, expected=(*last.expected, line))
    return files, commands


def _pattern(expected: str) -> re.Pattern[str]:
    expected = expected.replace(":7080", ":…").replace(":7071", ":…")
    return re.compile(".*?".join(re.escape(part) for part in expected.split("…")))


def _missing(expected: tuple[str, ...], output: str) -> str | None:
    """The first expected line not found (in order) in the output; None when all were."""
    lines = output.splitlines()
    at = 0
    for want in expected:
        pattern = _pattern(want)
        while at < len(lines) and not pattern.search(lines[at]):
            at += 1
        if at == len(lines):
            return want
        at += 1
    return None


def _run_until(command: Command, cwd: Path, env: dict[str, str]) -> str:
    """Run a command that lasts: type its lines as their cue shows, then Ctrl-C once all showed."""
    process = subprocess.Popen(
        shlex.split(command.line),
        cwd=cwd,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    assert process.stdin is not None and process.stdout is not None
    os.set_blocking(process.stdout.fileno(), False)
    output = ""
    deadline = time.monotonic() + COMMAND_S
    typed = list(command.typed)
    try:
        while time.monotonic() < deadline and process.poll() is None:
            chunk = process.stdout.read()
            if chunk:
                output += chunk.decode(errors="replace")
            if typed and _missing(typed[0][1], output) is None:
                process.stdin.write((typed.pop(0)[0] + "\n").encode())
                process.stdin.flush()
            if not typed and _missing(command.expected, output) is None:
                break
            time.sleep(0.1)
        if command.ctrl_c:
            process.send_signal(signal.SIGINT)
        process.wait(timeout=30)
        os.set_blocking(process.stdout.fileno(), True)
        output += process.stdout.read().decode(errors="replace")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        process.stdin.close()
        process.stdout.close()
    assert process.returncode == 0, output
    return output


@pytest.mark.slow
def test_the_quickstart_runs_as_written(tmp_path: Path) -> None:
    files, commands = _page()
    assert set(files) == {"pizza.py", "test_pizza.py"}
    assert len(commands) == 5
    work = tmp_path / "work"
    work.mkdir()
    for name, text in files.items():
        (work / name).write_text(text, encoding="utf-8")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = {
        **os.environ,
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "VIRTUAL_ENV": str(venv),
        # Free ports: the test may run beside a runner on the default ones.
        "CURB_ADDRESS": "127.0.0.1:0",
        "CURB_PUBLIC_ADDRESS": "127.0.0.1:0",
    }
    env.pop("PYTHONPATH", None)  # the commands import what the page's install installed
    for command in commands:
        cwd = REPO if command.cwd_repo else work
        if command.ctrl_c:
            output = _run_until(command, cwd, env)
        else:
            done = subprocess.run(
                command.line,
                shell=True,
                cwd=cwd,
                env=env,
                capture_output=True,
                timeout=INSTALL_S if " pip install " in command.line else COMMAND_S,
                check=False,
            )
            output = done.stdout.decode(errors="replace") + done.stderr.decode(errors="replace")
            assert done.returncode == 0, f"$ {command.line}\n{output}"
        missing = _missing(command.expected, output)
        assert missing is None, f"$ {command.line}\nexpected a line like {missing!r} in:\n{output}"
    # The venv's runner is this checkout's, installed by the page's own command, and the venv
    # holds nothing of the interpreter running this test.
    where = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "import json, runner, sys; print(runner.__file__); print(json.dumps(sys.path))",
        ],
        env=env,
        capture_output=True,
        check=True,
        cwd=work,
    )
    found, path = where.stdout.decode().splitlines()
    assert found == str(REPO / "runner" / "__init__.py")
    outside = [p for p in json.loads(path) if "site-packages" in p and not p.startswith(str(venv))]
    assert outside == [], outside
