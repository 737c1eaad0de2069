"""Modules small enough to read in one sitting, classes small enough to hold in mind.

Issue 28 measures it: no class of runner/ has more than 25 methods (every ``def`` directly in
its body: methods, properties, static methods), and no module reaches 700 lines.
A class or module that grows past the bound is split along its seams (a package of underscore
modules, a collaborator the class delegates to), not squeezed.
"""

import ast
from pathlib import Path

import pytest

RUNNER = Path(__file__).resolve().parent.parent / "runner"
MAX_METHODS = 25
MAX_LINES = 700


def _modules() -> list[Path]:
    return sorted(RUNNER.rglob("*.py"))


def _name(path: Path) -> str:
    return path.relative_to(RUNNER).as_posix()


def methods_per_class(source: str) -> dict[str, int]:
    """Each class of ``source`` (nested ones too) and how many methods its body defines."""
    return {
        node.name: sum(isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) for item in node.body)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ClassDef)
    }


def test_no_module_of_the_runner_reaches_700_lines() -> None:
    too_long = {
        _name(path): lines
        for path in _modules()
        if (lines := len(path.read_text().splitlines())) >= MAX_LINES
    }
    assert too_long == {}


def test_no_class_of_the_runner_has_more_than_25_methods() -> None:
    too_big = {
        f"{_name(path)}:{cls}": count
        for path in _modules()
        for cls, count in methods_per_class(path.read_text()).items()
        if count > MAX_METHODS
    }
    assert too_big == {}


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("class A:\n" + "".join(f"    def m{i}(self): ...\n" for i in range(26)), {"A": 26}),
        ("class A:\n    @property\n    def p(self): ...\n    async def m(self): ...\n    x = 1\n", {"A": 2}),
        ("class A:\n    class B:\n        def m(self): ...\n    def n(self): ...\n", {"A": 1, "B": 1}),
    ],
)
def test_methods_are_counted_as_the_bound_means(source: str, expected: dict[str, int]) -> None:
    assert methods_per_class(source) == expected
