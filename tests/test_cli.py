"""The ``runner`` command as an operator meets it: version, warm-up checks, variables."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from runner.config import ENVIRONMENT

REPO = Path(__file__).resolve().parent.parent


async def run(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    environ = {
        **{k: v for k, v in os.environ.items() if not k.startswith("CURB_") and k != "OPENAI_API_KEY"},
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "CURB_MANAGEMENT_TOKEN": "t",
        **(env or {}),
    }
    with trio.fail_after(60):
        done = await trio.run_process(
            [sys.executable, "-m", "runner", *args],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            env=environ,
            cwd=cwd,
        )
    return subprocess.CompletedProcess(done.args, done.returncode, done.stdout.decode(), done.stderr.decode())


async def test_version_names_the_package_and_the_protocols() -> None:
    from importlib.metadata import version

    done = await run("--version")
    assert done.returncode == 0
    assert done.stdout.strip() == f"runner {version('curb-runner')} (host protocol 1, agent WebSocket ino.v2)"


async def test_a_missing_key_fails_warm_up_with_one_line_and_no_ready_line(tmp_path: Path) -> None:
    for command in ("serve", "dev", "console"):
        args = [command, "tests.agents:needs_openai"]
        if command != "console":
            args += ["--address", "127.0.0.1:0", "--public-address", "127.0.0.1:0", "--journal", "j.db"]
        done = await run(*args, cwd=tmp_path)
        assert done.returncode == 1, (command, done.stderr)
        assert "curb-hosted" not in done.stdout
        lines = done.stderr.splitlines()
        assert len(lines) == 1, (command, lines)
        assert re.fullmatch(
            r"\S+Z ERROR   runner: warm-up failed: agent 'needs-openai': "
            r"LLM provider 'openai' needs OPENAI_API_KEY, which is not set",
            lines[0],
        ), lines[0]
    # Nothing was started: no journal, no token file.
    assert not os.listdir(tmp_path)


async def test_check_warms_up_and_exits_without_serving(tmp_path: Path) -> None:
    done = await run("serve", "tests.agents:quiet", "--check", "--journal", "j.db", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    assert "agent quiet is warm" in done.stderr
    assert not os.listdir(tmp_path)
    failed = await run("serve", "tests.agents:needs_openai", "--check", cwd=tmp_path)
    assert failed.returncode == 1
    assert "OPENAI_API_KEY" in failed.stderr


async def test_a_bad_variable_is_named_with_its_value(tmp_path: Path) -> None:
    cases = {
        "CURB_MAX_SESSIONS": ("abc", "CURB_MAX_SESSIONS must be an integer, got 'abc'"),
        "CURB_RETENTION": ("0", "CURB_RETENTION must be from 1 to 1,000,000,000, got 0"),
        "CURB_CREDIT_POOL": ("lots", "CURB_CREDIT_POOL must be a number, got 'lots'"),
        "CURB_ADDRESS": ("localhost", "CURB_ADDRESS: expected HOST:PORT, got 'localhost'"),
        "CURB_METRICS_ADDRESS": ("nowhere", "CURB_METRICS_ADDRESS: expected HOST:PORT, got 'nowhere'"),
        "CURB_LOG_LEVEL": ("loud", "CURB_LOG_LEVEL must be one of debug, info, warning, error, got 'loud'"),
        "CURB_LOG_FORMAT": ("xml", "CURB_LOG_FORMAT must be one of text, json, got 'xml'"),
    }
    for name, (value, said) in cases.items():
        done = await run("serve", "tests.agents:quiet", env={name: value}, cwd=tmp_path)
        assert done.returncode == 2, (name, done.stderr)
        assert done.stderr.strip() == f"runner: {said}", name
    # A flag is named by its flag.
    done = await run("serve", "tests.agents:quiet", "--max-sessions", "0", cwd=tmp_path)
    assert done.stderr.strip() == "runner: --max-sessions must be from 1 to 10,000, got 0"


def _numeric_flags() -> list[tuple[str, str, str]]:
    """(command, flag, dest) for every numeric setting a serving command takes."""
    from runner.cli import _parser

    commands = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    found = []
    for command in ("serve", "join", "start", "dev"):
        for action in commands[command]._actions:
            flag = action.option_strings[0] if action.option_strings else ""
            if flag.endswith(("-ms", "-s", "-seconds", "-bytes", "-connections", "-minute")) or flag in (
                "--retention",
                "--max-sessions",
                "--credit-pool",
                "--configuration-version",
            ):
                found.append((command, flag, action.dest))
    return found


def test_every_numeric_flag_has_a_range_checked_at_start() -> None:
    from runner.cli import _config, _parser

    flags = _numeric_flags()
    assert len({flag for _, flag, _ in flags}) == 14, flags
    mode = {"serve": "managed", "join": "direct-join", "start": "worker", "dev": "dev"}
    for command, flag, _ in flags:
        extra = ["--url", "ws://127.0.0.1:9", "--token", "t"] if command == "join" else []
        for value in ("-1", "100000000000000000000", "nan", "inf", "1e20", "12abc"):
            args = _parser().parse_args([command, flag, value, *extra])
            with pytest.raises(ValueError) as refused:
                _config(args, mode[command])
            said = rf"{flag} must be (an integer|a number|from \S+ to \S+), got \S+"
            assert re.fullmatch(said, str(refused.value)), (command, flag, value, refused.value)


async def test_a_value_out_of_range_stops_the_runner_with_one_line_naming_it(tmp_path: Path) -> None:
    # The three the hostile probe found passing start-up, and two variables.
    cases = [
        (("--retention", "1e20"), {}, "--retention must be an integer, got '1e20'"),
        (("--heartbeat-ms", "0"), {}, "--heartbeat-ms must be from 100 to 3,600,000, got 0"),
        (("--drain-grace-ms", "-1"), {}, "--drain-grace-ms must be from 0 to 86,400,000, got -1"),
        ((), {"CURB_HEARTBEAT_MS": "0"}, "CURB_HEARTBEAT_MS must be from 100 to 3,600,000, got 0"),
        ((), {"CURB_CREDIT_POOL": "inf"}, "CURB_CREDIT_POOL must be from 0 to 1,000,000,000,000, got inf"),
    ]
    for flags, env, said in cases:
        done = await run("serve", "tests.agents:quiet", *flags, env=env, cwd=tmp_path)
        assert done.returncode == 2, (flags, env, done.stderr)
        assert done.stderr == f"runner: {said}\n"
    assert not os.listdir(tmp_path)


def _variables_read_by_the_runner() -> set[str]:
    found: set[str] = set()
    for path in (REPO / "runner").rglob("*.py"):
        found |= set(re.findall(r"\"(CURB_[A-Z_]+)\"", path.read_text(encoding="utf-8")))
    return found


async def test_every_variable_is_in_help_and_in_the_docs_table() -> None:
    variables = _variables_read_by_the_runner()
    assert {"CURB_ADDRESS", "CURB_JOURNAL", "CURB_MAX_SESSIONS", "CURB_LOG_LEVEL"} <= variables
    assert variables == set(ENVIRONMENT)
    helped = (await run("--help")).stdout
    table = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"^\| `(CURB_[A-Z_]+)` \|", table, re.MULTILINE))
    assert documented == variables
    for name in variables:
        assert re.search(rf"^  {name} +\S", helped, re.MULTILINE), name


async def test_tracing_is_configured_by_the_standard_variables(tmp_path: Path) -> None:
    done = await run(
        "serve", "tests.agents:quiet", "--check", env={"OTEL_TRACES_EXPORTER": "console"}, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert "tracing: spans go to the console exporter" in done.stderr
    bad = await run(
        "serve", "tests.agents:quiet", "--check", env={"OTEL_TRACES_EXPORTER": "zipkin"}, cwd=tmp_path
    )
    assert bad.returncode == 2
    assert bad.stderr.strip() == "runner: OTEL_TRACES_EXPORTER must be otlp, console or none, got 'zipkin'"
