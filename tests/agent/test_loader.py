"""Finding an agent: any single Agent in a module, several named in the error."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.agent import load_agent


def _module(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / f"{name}.py"
    path.write_text("from runner.agent import Agent\n" + body, encoding="utf-8")
    return path


def test_the_one_agent_of_a_file_is_found_whatever_its_name(tmp_path: Path) -> None:
    path = _module(tmp_path, "pizza_one", 'bot = Agent("pizza")\n')
    assert load_agent(str(path)).name == "pizza"


def test_the_one_agent_of_a_module_is_found_by_module_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _module(tmp_path, "pizza_by_name", 'assistant = Agent("pizza")\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    assert load_agent("pizza_by_name").name == "pizza"


def test_several_agents_are_named_in_the_error(tmp_path: Path) -> None:
    path = _module(tmp_path, "pair", 'front = Agent("front")\nback = Agent("back")\n')
    with pytest.raises(ValueError) as excinfo:
        load_agent(str(path))
    assert "several agents (front, back)" in str(excinfo.value)
    assert load_agent(f"{path}:back").name == "back"


def test_among_several_the_one_called_agent_is_taken(tmp_path: Path) -> None:
    path = _module(tmp_path, "several", 'agent = Agent("main")\nother = Agent("other")\n')
    assert load_agent(str(path)).name == "main"


def test_a_factory_called_agent_is_called(tmp_path: Path) -> None:
    path = _module(tmp_path, "factory", 'def agent():\n    return Agent("made")\n')
    assert load_agent(str(path)).name == "made"


def test_a_module_without_an_agent_says_how_to_write_one(tmp_path: Path) -> None:
    path = _module(tmp_path, "empty", "x = 1\n")
    with pytest.raises(ValueError, match=r"defines no Agent .*agent = Agent\(\.\.\.\)"):
        load_agent(str(path))
    with pytest.raises(ValueError, match=r":x is not an Agent"):
        load_agent(f"{path}:x")
