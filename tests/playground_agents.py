"""Agents the playground's browser tests run ``runner dev`` with."""

from __future__ import annotations

import copy

from examples.concierge import agent as concierge

# The built-in concierge, reporting a mood with every reply (``mood`` frames on the socket).
moody_concierge = copy.copy(concierge)
moody_concierge.moods = True

# The concierge with a long greeting: something to talk over.
talkative_concierge = copy.copy(concierge)
talkative_concierge.greeting = (
    "Good day, and welcome to Hotel Lumen. Breakfast is served from seven to eleven in the garden "
    "room, the spa is open from nine in the morning to nine in the evening, and checkout is at noon. "
    "Late checkout costs twenty euros. The lifts are to your left, and the bar on the roof opens at "
    "six. How may I help with your stay?"
)
