"""The pytest plugin ``runner.testing`` brings: agent tests run with no configuration of their own.

Installed with the package (the ``pytest11`` entry point ``curb_runner``; ``runner`` is pytest's own), it does two things:

* A test module that uses ``runner.testing`` has its ``async def`` tests run by pytest-trio
  (the ``testing`` extra installs it), as if marked ``pytest.mark.trio``: an author needs no
  ``trio_mode`` setting and no mark. Other modules are left as their project configured them.
* A Trio test's failure comes out as itself. pytest-trio runs each test inside a nursery, which
  wraps what the test raised in an ``ExceptionGroup`` of one, and pytest's summary then shows
  the group's repr cut short (``AssertionError("no call of ...``). A group of exactly one
  exception (at any depth) is unwrapped; a group of several stays a group.

It imports nothing of the runner, so loading it costs any pytest run nothing.
"""

from __future__ import annotations

import inspect
from collections.abc import Generator
from typing import Any

import pytest


def _uses_runner_testing(module: Any) -> bool:
    return any(getattr(value, "__module__", None) == "runner.testing" for value in vars(module).values())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.pluginmanager.has_plugin("trio"):
        return
    for item in items:
        function = getattr(item, "obj", None)
        module = getattr(item, "module", None)
        if (
            inspect.iscoroutinefunction(function)
            and module is not None
            and item.get_closest_marker("trio") is None
            and _uses_runner_testing(module)
        ):
            item.add_marker(pytest.mark.trio)


def only_exception(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The one exception a chain of single-exception groups holds, else the group itself."""
    error: BaseException = group
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return error


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> Generator[None, object, object]:
    try:
        return (yield)
    except BaseExceptionGroup as group:
        error = only_exception(group)
        if error is group:
            raise
    # Raised outside the handler, so the group does not become its context.
    raise error
