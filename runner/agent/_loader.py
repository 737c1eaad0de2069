"""Finding the agent a command names: ``module``, ``module:attr`` or a ``.py`` file."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

from ._authoring import Agent

DEFAULT_AGENT = "examples.concierge"


def load_agent(spec: str | None) -> Agent:
    """Load an agent: ``pkg.module`` (its ``agent`` attribute), ``pkg.module:attr``, or ``path/to/file.py[:attr]``.

    With no spec, the built-in example agent.

    Raises:
        ValueError: The spec names nothing that is an :class:`Agent`.
    """
    spec = spec or DEFAULT_AGENT
    target, _, attr = spec.partition(":")
    attr = attr or "agent"
    if target.endswith(".py"):
        path = Path(target).resolve()
        module_spec = importlib.util.spec_from_file_location(path.stem, path)
        if module_spec is None or module_spec.loader is None:
            raise ValueError(f"cannot load {target}")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[path.stem] = module
        module_spec.loader.exec_module(module)
    else:
        if "" not in sys.path and "." not in sys.path:
            sys.path.insert(0, "")
        module = importlib.import_module(target)
    agent = getattr(module, attr, None)
    if callable(agent) and not isinstance(agent, Agent):
        agent = agent()
    if not isinstance(agent, Agent):
        raise ValueError(f"{spec} is not an Agent (looked for {attr!r} in {module.__name__})")
    return agent
