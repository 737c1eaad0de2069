"""The pytest plugin the package installs, seen as an agent's author sees it: pytest run in a
directory with no configuration of its own, on a test module that uses ``runner.testing``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

MODULE = '''
import trio

from runner.agent import Agent, Context
from runner.testing import open_agent_test

agent = Agent("pizzeria", instructions="We open at noon.")


@agent.tool
def order_pizza(ctx: Context, kind: str) -> str:
    """Order a pizza."""
    return f"One {kind} is in the oven."


async def test_passes() -> None:
    async with open_agent_test(agent) as test:
        (await test.say("I would like to order a pizza margherita")).called("order_pizza")


async def test_a_failed_check() -> None:
    async with open_agent_test(agent) as test:
        (await test.say("I would like to order a pizza margherita")).called("order_pizza", kind="quattro stagioni")


async def test_a_failed_assert() -> None:
    async with open_agent_test(agent) as test:
        turn = await test.say("When do you open?")
    assert turn.text == "We open at nine."


async def test_two_failures_stay_a_group() -> None:
    async def fail(message: str) -> None:
        raise ValueError(message)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(fail, "first")
        nursery.start_soon(fail, "second")
'''


@pytest.mark.slow
def test_an_authors_agent_test_runs_on_trio_and_fails_as_itself(tmp_path: Path) -> None:
    (tmp_path / "test_pizza.py").write_text(MODULE, encoding="utf-8")
    # A wide terminal, so the summary lines are not cut to 80 columns.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(tmp_path)]), "COLUMNS": "300"}
    # The plugin as installed (entry point "curb_runner"), loaded here by name: this checkout's.
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-rf",
        "-p",
        "no:curb_runner",
        "-p",
        "runner.pytest_plugin",
    ]
    done = subprocess.run(
        [*command, "-p", "no:cacheprovider", "test_pizza.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        timeout=240,
        check=False,
    )
    output = done.stdout.decode(errors="replace") + done.stderr.decode(errors="replace")
    # No mark and no trio_mode: the async tests ran (not "async def functions are not natively supported").
    assert "3 failed, 1 passed" in output, output
    summary = {line.split(" - ")[0]: line for line in output.splitlines() if line.startswith("FAILED ")}
    failed_check = summary["FAILED test_pizza.py::test_a_failed_check"]
    assert (
        "AssertionError: no call of order_pizza({'kind': 'quattro stagioni'}); the calls were" in failed_check
    )
    assert (
        "AssertionError: assert 'We open at noon.' == 'We open at nine.'"
        in summary["FAILED test_pizza.py::test_a_failed_assert"]
    )
    assert "Exceptions from Trio nursery (1 sub-exception)" not in output
    # Two errors are not one: the group is kept whole.
    assert "ExceptionGroup" in summary["FAILED test_pizza.py::test_two_failures_stay_a_group"]
