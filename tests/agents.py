"""Agents the tests start runners with (``runner serve tests.agents:NAME``)."""

from __future__ import annotations

from runner.agent import Agent

# Writes nothing but what the call itself writes: curb.started, curb.messages, curb.ended.
quiet = Agent("quiet", instructions="You answer briefly.")
