"""Building a call's providers from its settings, and checking them all before the first call."""

from __future__ import annotations

from typing import Any

import attrs
import trio

from ..providers import ChatModel, ProviderError, Recognizer, Synthesizer, make_llm, make_stt, make_tts
from ..voice.vad import silero_models
from ._authoring import Agent
from ._settings import LLM, STT, TTS


@attrs.define
class CallProviders:
    """Built providers, rebuilt only when their settings change."""

    models: dict[LLM, ChatModel] = attrs.Factory(dict)
    voices: dict[TTS, Synthesizer] = attrs.Factory(dict)
    recognizers: dict[STT, Recognizer] = attrs.Factory(dict)

    def llm(self, spec: LLM) -> ChatModel:
        if spec not in self.models:
            self.models[spec] = make_llm(
                spec.provider, spec.model, base_url=spec.base_url, api_key_env=spec.api_key_env
            )
        return self.models[spec]

    def tts(self, spec: TTS | None) -> Synthesizer | None:
        if spec is None:
            return None
        if spec not in self.voices:
            self.voices[spec] = build_tts(spec)
        return self.voices[spec]

    def stt(self, spec: STT | None) -> Recognizer | None:
        if spec is None:
            return None
        if spec not in self.recognizers:
            self.recognizers[spec] = build_stt(spec)
        return self.recognizers[spec]


class Unbuildable:
    """Stands in for a model that could not be built: its turn fails with a code."""

    provider = "unavailable"
    model = "unavailable"

    def __init__(self, why: str) -> None:
        self._why = why

    async def stream(self, messages: Any, tools: Any = ()) -> Any:
        raise ProviderError("unavailable", f"the model cannot be used: {self._why}")
        yield  # pragma: no cover - makes this an async generator


def build_tts(spec: TTS) -> Synthesizer:
    """A speech provider for a voice choice."""
    return make_tts(spec.provider, voice=spec.voice, model=spec.model)


def build_stt(spec: STT) -> Recognizer:
    """A recognizer for a recognition choice."""
    return make_stt(spec.provider, language=spec.language)


class WarmUpFailed(Exception):
    """The agent cannot take calls as it is: a provider it names cannot be built or has no key."""


async def warm_up(agent: Agent) -> None:
    """Build every provider the agent (and its skills) names and look up its key.

    A broken one fails the runner's warm-up (no ready line) rather than its first call,
    and the first call starts warm.

    Raises:
        WarmUpFailed: One line naming the agent, each provider that failed, and why (for a
            missing key, the variable to set).
    """
    problems: list[str] = []

    def build(kind: str, spec: LLM | TTS | STT) -> Any:
        provider: ChatModel | Synthesizer | Recognizer
        try:
            if isinstance(spec, LLM):
                provider = make_llm(
                    spec.provider, spec.model, base_url=spec.base_url, api_key_env=spec.api_key_env
                )
            else:
                provider = build_tts(spec) if isinstance(spec, TTS) else build_stt(spec)
        except (ProviderError, ValueError) as exc:
            problems.append(f"{kind} provider {spec.provider!r} cannot be built: {exc}")
            return None
        missing = getattr(provider, "missing_key", None)
        if missing:
            problems.append(f"{kind} provider {spec.provider!r} needs {missing}, which is not set")
            return None
        return provider

    for spec in _named(agent.llm, agent, "llm"):
        build("LLM", spec)
    voices = [build("TTS", spec) for spec in _named(agent.tts, agent, "tts")]
    hearing = [build("STT", spec) for spec in _named(agent.stt, agent, "stt")]
    if problems:
        raise WarmUpFailed(f"agent {agent.name!r}: " + "; ".join(problems))
    for kind, provider in [*(("TTS", p) for p in voices), *(("STT", p) for p in hearing)]:
        try:
            if hasattr(provider, "warm_up"):
                # The embedded engines load (and check) their models now, not on the first call.
                await provider.warm_up()
        except ProviderError as exc:
            problems.append(f"{kind} provider {provider.provider!r} cannot warm up: {exc}")
    if problems:
        raise WarmUpFailed(f"agent {agent.name!r}: " + "; ".join(problems))
    if agent.stt is not None and agent.vad == "silero":
        # The first call's detector is loaded now, not on its first audio frame.
        await trio.to_thread.run_sync(silero_models.fill, 1)


def _named(own: Any, agent: Agent, attr: str) -> list[Any]:
    """The agent's own choice and its skills', once each."""
    return [t for t in dict.fromkeys((own, *(getattr(s, attr) for s in agent.skills))) if t is not None]


def without_voice(agent: Agent) -> Agent:
    """A copy of ``agent`` (and its skills) that only writes: nobody hears it, so nothing is synthesized."""
    import copy

    quiet = copy.copy(agent)
    quiet.tts = None
    quiet.skills = [copy.copy(s) for s in agent.skills]
    for skill in quiet.skills:
        skill.tts = None
    return quiet
