"""The protocol's constants and limits, and how a field outside them is refused."""

from __future__ import annotations

from typing import Any

import attrs

PROTOCOL = "ino.v2"
CODEC = "pcm_s16le"
RATES_HZ = (8000, 16000, 22050, 24000, 44100)
MAX_TEXT_CHARS = 32_000
AGENT_STREAM_PATH = "/v1/agent/stream"
# One recording's cap; past it the socket closes 4011 with this reason.
MAX_RECORDING_BYTES = 10_000_000
RECORDING_TOO_LONG = "the recording passed 10 MB: send long audio to POST /v1/transcriptions"
MAX_RECORDING_ID_CHARS = 64
MAX_APP_TOOLS = 50
MAX_TOOL_ERROR_CHARS = 2000

# -- Validation failures ---------------------------------------------------------------------


class LimitError(ValueError):
    """A field is of the right type but outside the protocol's limits (``validation_failed``)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field} {message}")
        self.field = field


class FrameRejected(Exception):
    """A frame that cannot be understood: the socket closes with 4009 and this reason."""


class FrameInvalid(Exception):
    """A verb that was understood but breaks a limit: answered with ``validation_failed``."""

    def __init__(self, verb: str, field: str, message: str, *, recording_id: str | None = None) -> None:
        super().__init__(f"{verb}.{field} {message}")
        self.verb = verb
        self.field = field
        # The recording a refused user_audio.start named (an error about it carries it).
        self.recording_id = recording_id


def check_length(low: int, high: int) -> Any:
    def check(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if value is not None and not low <= len(value) <= high:
            raise LimitError(attribute.name, f"must be {low} to {high} characters")

    return check


def check_rate(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and value not in RATES_HZ:
        raise LimitError(attribute.name, "must be one of " + ", ".join(map(str, RATES_HZ)))


def check_at_most(high: int) -> Any:
    def check(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if value is not None and len(value) > high:
            raise LimitError(attribute.name, f"may name at most {high}")

    return check
