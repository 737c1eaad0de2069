"""What an agent speaks with: provider choices as data, and the paths a call may adjust.

A choice (``LLM("openai", "gpt-4o-mini")``) is plain data: it becomes a provider per
call, and it is what ``EffectiveSettings`` reports. Keys never live here.
"""

from __future__ import annotations

from typing import Literal

import attrs

Origin = Literal["client", "host"]
ADJUSTABLE_PATHS = ("tts.voice", "tts.model", "stt.language", "llm")


class AuthoringError(ValueError):
    """An agent was written wrong: the seed's ``AGENT_INVALID_AUTHORING_PROP``.

    Raised when the agent is defined, and by ``ctx.send`` for an invalid key (a bug in
    the agent, not a delivery problem).
    """

    code = "AGENT_INVALID_AUTHORING_PROP"

    def __init__(self, message: str) -> None:
        super().__init__(f"{self.code}: {message}")


@attrs.frozen(kw_only=True)
class LLM:
    """A chat model: ``provider`` is ``local``, ``openai``, ``anthropic``, ``openai-compatible``
    or ``kugelaudio``; ``base_url`` is the endpoint of an OpenAI-compatible service.
    """

    provider: str
    model: str
    base_url: str | None = None
    api_key_env: str | None = None


@attrs.frozen(kw_only=True)
class TTS:
    """A voice: ``provider`` is ``hibari`` (offline, neural, English), ``espeak`` (offline, light,
    many languages), ``openai`` or ``kugelaudio``."""

    provider: str
    voice: str | int | None = None
    model: str | None = None


@attrs.frozen(kw_only=True)
class STT:
    """A recognizer: ``provider`` is ``whisper`` (offline, Whisper tiny.en; other languages with
    Whisper base, the ``multilingual`` extra), ``pocketsphinx`` (offline, light), ``openai`` or
    ``azure``."""

    provider: str
    language: str | None = None


def llm(provider: str, model: str, *, base_url: str | None = None, api_key_env: str | None = None) -> LLM:
    return LLM(provider=provider, model=model, base_url=base_url, api_key_env=api_key_env)


def tts(provider: str, *, voice: str | int | None = None, model: str | None = None) -> TTS:
    return TTS(provider=provider, voice=voice, model=model)


def stt(provider: str, *, language: str | None = None) -> STT:
    return STT(provider=provider, language=language)


def check_adjustable(adjustable: dict[str, list[str]] | None) -> dict[Origin, tuple[str, ...]]:
    """Validate an agent's ``adjustable`` declaration; nothing is adjustable unless listed."""
    result: dict[Origin, tuple[str, ...]] = {"client": (), "host": ()}
    for origin, paths in (adjustable or {}).items():
        if origin not in ("client", "host"):
            raise AuthoringError(f"adjustable origin must be 'client' or 'host', got {origin!r}")
        if isinstance(paths, str):
            raise AuthoringError(f"adjustable[{origin!r}] must be a list of paths, not a string")
        for path in paths:
            if path not in ADJUSTABLE_PATHS:
                raise AuthoringError(f"adjustable path {path!r} is not one of {', '.join(ADJUSTABLE_PATHS)}")
        result[origin] = tuple(paths)  # type: ignore[index]  # origin was checked against the Origin literals above
    return result
