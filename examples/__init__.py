"""Example agents. ``runner serve`` with no argument runs :mod:`examples.concierge`."""
