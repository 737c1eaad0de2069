"""What the client sends: the nine verbs, each checked against its limits as it is read."""

from __future__ import annotations

from typing import Any, ClassVar

import attrs

from ._limits import (
    MAX_APP_TOOLS,
    MAX_RECORDING_ID_CHARS,
    MAX_TEXT_CHARS,
    MAX_TOOL_ERROR_CHARS,
    check_at_most,
    check_length,
    check_rate,
)

# -- What the client sends: the nine verbs -----------------------------------------------------


@attrs.frozen(kw_only=True)
class Auth:
    TYPE: ClassVar[str] = "auth"
    key: str
    session_id: str
    tools: list[str] | None = attrs.field(default=None, validator=check_at_most(MAX_APP_TOOLS))


@attrs.frozen(kw_only=True)
class UserMessage:
    TYPE: ClassVar[str] = "user_message"
    text: str = attrs.field(validator=check_length(1, MAX_TEXT_CHARS))
    speech: bool | None = None
    thoughts: bool | None = None


@attrs.frozen(kw_only=True)
class UserAudioStart:
    TYPE: ClassVar[str] = "user_audio.start"
    rate: int | None = attrs.field(default=None, validator=check_rate)
    language: str | None = attrs.field(default=None, validator=check_length(2, 8))
    model: str | None = attrs.field(default=None, validator=check_length(1, 128))
    recording_id: str | None = attrs.field(default=None, validator=check_length(1, MAX_RECORDING_ID_CHARS))
    barge_in: bool | None = None
    speech: bool | None = None
    thoughts: bool | None = None


@attrs.frozen(kw_only=True)
class UserAudioEnd:
    TYPE: ClassVar[str] = "user_audio.end"
    transcribe_only: bool | None = None
    discard: bool | None = None


@attrs.frozen(kw_only=True)
class Cancel:
    TYPE: ClassVar[str] = "cancel"


@attrs.frozen(kw_only=True)
class Mute:
    TYPE: ClassVar[str] = "mute"


@attrs.frozen(kw_only=True)
class Ping:
    TYPE: ClassVar[str] = "ping"


@attrs.frozen(kw_only=True)
class ToolConfirmed:
    TYPE: ClassVar[str] = "tool.confirmed"
    call_id: str
    yes: bool
    speech: bool | None = None
    thoughts: bool | None = None


@attrs.frozen(kw_only=True)
class ToolResult:
    """The app's answer to a ``tool.call``: ``error`` when sent is the answer, else ``result``."""

    TYPE: ClassVar[str] = "tool.result"
    call_id: str
    result: Any = None
    error: str | None = attrs.field(default=None, validator=check_length(1, MAX_TOOL_ERROR_CHARS))


Verb = Auth | UserMessage | UserAudioStart | UserAudioEnd | Cancel | Mute | Ping | ToolConfirmed | ToolResult
VERBS: dict[str, type[Any]] = {
    cls.TYPE: cls
    for cls in (
        Auth,
        UserMessage,
        UserAudioStart,
        UserAudioEnd,
        Cancel,
        Mute,
        Ping,
        ToolConfirmed,
        ToolResult,
    )
}
