"""Agents the playground's browser tests run ``runner dev`` with."""

from __future__ import annotations

import copy

from examples.concierge import agent as concierge

# The built-in concierge, reporting a mood with every reply (``mood`` frames on the socket).
moody_concierge = copy.copy(concierge)
moody_concierge.moods = True
