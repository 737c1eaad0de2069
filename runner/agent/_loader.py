"""Finding the agent a command names: ``module``, ``module:attr`` or a ``.py`` file."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from ._authoring import Agent

DEFAULT_AGENT = "examples.concierge"


def load_agent(spec: str | None) -> Agent:
    """Load an agent: ``pkg.module``, ``pkg.module:attr``, or ``path/to/file.py[:attr]``.

    Without ``:attr``, the module's one :class:`Agent` (whatever its name), else its
    ``agent`` attribute (an Agent, or a function that makes one). With no spec, the
    built-in example agent.

    Raises:
        ValueError: The spec names nothing that is an :class:`Agent`, or the module holds
            several and names none ``agent`` (the error lists them).
    """
    spec = spec or DEFAULT_AGENT
    target, _, attr = spec.partition(":")
    module = import_target(target)
    if not attr:
        found = [name for name, value in vars(module).items() if isinstance(value, Agent)]
        if len(found) == 1:
            return getattr(module, found[0])  # type: ignore[no-any-return]  # found holds only names whose value isinstance-checked as an Agent
        if len(found) > 1 and "agent" not in found:
            names = ", ".join(found)
            raise ValueError(f"{target} holds several agents ({names}): name one, as {target}:{found[0]}")
        attr = "agent"
    agent = getattr(module, attr, None)
    if callable(agent) and not isinstance(agent, Agent):
        agent = agent()
    if not isinstance(agent, Agent):
        if spec.partition(":")[2]:
            raise ValueError(f"{target}:{attr} is not an Agent")
        raise ValueError(
            f"{target} defines no Agent (write one at module level, as agent = Agent(...), "
            "or a function named 'agent' that makes one)"
        )
    return agent


def import_target(target: str) -> ModuleType:
    """Import ``pkg.module`` (from the current directory too) or execute ``path/to/file.py`` afresh."""
    if target.endswith(".py"):
        path = Path(target).resolve()
        module_spec = importlib.util.spec_from_file_location(path.stem, path)
        if module_spec is None or module_spec.loader is None:
            raise ValueError(f"cannot load {target}")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[path.stem] = module
        module_spec.loader.exec_module(module)
        return module
    if "" not in sys.path and "." not in sys.path:
        sys.path.insert(0, "")
    return importlib.import_module(target)
