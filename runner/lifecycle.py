"""Lifecycle records: journaled under producer ``runner``, then printed on stdout.

A host may rely on the exact prefix: ``curb-hosted `` then the JSON object with
``event`` as its first key.
"""

from __future__ import annotations

import json
import sys

from journal import Journal, Record

from .wire import Lifecycle, encode

PREFIX = "curb-hosted "


def print_lifecycle(body: dict[str, object]) -> None:
    sys.stdout.write(PREFIX + json.dumps(body, separators=(",", ":")) + "\n")
    sys.stdout.flush()


async def emit_lifecycle(journal: Journal, event: Lifecycle) -> Record:
    """Journal a lifecycle record, and print it once it is durable."""
    record = await journal.append("runner", "lifecycle", encode(event))
    print_lifecycle(dict(record.body))
    return record
