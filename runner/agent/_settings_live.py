"""Live session settings: who may change what, whether a value fits, and what is in effect.

Deny by default, all or nothing: every path of an update must be adjustable for the
sender's origin (else ``not_adjustable`` naming the first), and every value must fit the
provider it would reach (else ``invalid_settings`` with issues). A refused update changes
nothing. An accepted value overrides the agent's and the active skill's props until the
next outside change of that path.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import attrs

from ..errors import InvalidRequest, InvalidSettings, NotAdjustable
from ..wire import (
    EffectiveLLM,
    EffectiveSettings,
    EffectiveSTT,
    EffectiveTTS,
    Issue,
)
from ._authoring import Offer
from ._settings import LLM, STT, TTS, Origin

_LLM_PROVIDERS = ("kugelaudio", "anthropic", "openai", "openai-compatible", "local")
_UPDATE_LLM_PROVIDERS = ("kugelaudio", "anthropic", "openai", "openai-compatible")
# The protocol names kugelaudio; this runner builds only these.
_BUILDABLE_LLM_PROVIDERS = ("anthropic", "openai", "openai-compatible")
_SHAPE: dict[str, tuple[str, ...]] = {
    "tts": ("voice", "model"),
    "stt": ("language",),
    "llm": ("provider", "model", "baseURL"),
}
_OPENAI_VOICES = (
    "alloy",
    "ash",
    "ballad",
    "coral",
    "echo",
    "fable",
    "nova",
    "onyx",
    "sage",
    "shimmer",
    "verse",
)


@attrs.frozen(kw_only=True)
class Overrides:
    """The values changed from outside, by path; absent paths follow the props."""

    voice: str | int | float | None = None
    tts_model: str | None = None
    language: str | None = None
    llm: LLM | None = None

    def apply(self, offer: Offer) -> tuple[LLM, TTS | None, STT | None]:
        llm = self.llm or offer.llm
        tts = offer.tts
        if tts is not None and (self.voice is not None or self.tts_model is not None):
            tts = attrs.evolve(
                tts,
                voice=self.voice if self.voice is not None else tts.voice,  # type: ignore[arg-type]  # evolve() is typed loosely per provider class; voice is each TTS's own voice field
                model=self.tts_model if self.tts_model is not None else tts.model,
            )
        stt = offer.stt
        if stt is not None and self.language is not None:
            stt = attrs.evolve(stt, language=self.language)
        return llm, tts, stt


def effective(llm: LLM, tts: TTS | None, stt: STT | None) -> EffectiveSettings:
    """What a call runs with, as the protocol reports it: never a credential."""
    return EffectiveSettings(
        tts=EffectiveTTS(
            provider=tts.provider if tts else "none",
            voice=tts.voice if tts else None,
            model=tts.model if tts else None,
            options={"voice": tts.voice} if tts and tts.voice is not None else {},
        ),
        stt=EffectiveSTT(provider=stt.provider if stt else "none", language=stt.language if stt else None),
        llm=EffectiveLLM(provider=llm.provider, model=llm.model, base_url=llm.base_url),
    )


def _paths(update: Mapping[str, Any]) -> list[str]:
    """The adjustable paths an update touches, in body order (an ``llm`` object is one path)."""
    paths = []
    for section, value in update.items():
        if section == "llm":
            paths.append("llm")
        elif section in ("tts", "stt") and isinstance(value, dict):
            paths.extend(f"{section}.{key}" for key in value if key in _SHAPE[section])
    return paths


def _voice_issue(tts: TTS | None, voice: Any) -> str | None:
    if tts is None:
        return "this agent has no voice"
    if not isinstance(voice, (str, int, float)) or isinstance(voice, bool):
        return "must be a string or a number"
    if tts.provider == "kugelaudio":
        if isinstance(voice, str) and not voice.isdigit():
            return "a KugelAudio voice is a numeric voice id"
        if isinstance(voice, float) and not voice.is_integer():
            return "a KugelAudio voice is a numeric voice id"
        return None
    if tts.provider == "espeak":
        from ..providers.espeak import EspeakTTS

        if not isinstance(voice, str) or not EspeakTTS.supports_voice(voice):
            return f"espeak has no voice {voice!r}"
        return None
    if tts.provider == "hibari":
        from ..providers.hibari import HibariTTS

        if not HibariTTS.supports_voice(voice):
            return (
                f"hibari has no voice {voice!r} here; this runner offers {', '.join(HibariTTS.list_voices())}"
            )
        return None
    if tts.provider == "openai" and voice not in _OPENAI_VOICES:
        return f"OpenAI speech has no voice {voice!r}"
    return None


def _language_issue(stt: STT | None, language: Any) -> str | None:
    if stt is None:
        return "this agent has no recognizer"
    if not isinstance(language, str) or not 2 <= len(language) <= 16:
        return "must be a language tag such as 'en' or 'de-DE'"
    if stt.provider == "pocketsphinx":
        from ..providers.pocketsphinx import PocketsphinxSTT

        if not PocketsphinxSTT.supports_language(language):
            return f"the offline recognizer takes no language but English, not {language!r}"
    if stt.provider == "whisper":
        from ..providers.whisper import WhisperSTT

        if not WhisperSTT.supports_language(language):
            return f"the offline recognizer (Whisper tiny.en) takes no language but English, not {language!r}"
    return None


def check_update(
    raw: object,
    *,
    origin: Origin,
    adjustable: tuple[str, ...],
    current: tuple[LLM, TTS | None, STT | None],
    author_llm: LLM,
) -> Overrides:
    """Check a SessionUpdate from ``origin`` against the current props; return the new overrides' changes.

    Raises:
        InvalidRequest: Not a JSON object.
        NotAdjustable: A path not adjustable for ``origin`` (the first one).
        InvalidSettings: A value that does not fit, or an unknown key, with issues.
    """
    if not isinstance(raw, dict):
        raise InvalidRequest("a settings update must be a JSON object")
    for path in _paths(raw):
        if path not in adjustable:
            raise NotAdjustable(path, f"{path} is not adjustable by the {origin}")
    issues: list[Issue] = []
    _, tts, stt = current
    changes: dict[str, Any] = {}
    for section, value in raw.items():
        if section not in _SHAPE:
            issues.append(Issue(path=[section], message="is not a setting"))
            continue
        if not isinstance(value, dict):
            issues.append(Issue(path=[section], message="must be an object"))
            continue
        for key in value:
            if key not in _SHAPE[section]:
                issues.append(Issue(path=[section, key], message="is not a setting"))
    tts_section = raw.get("tts")
    tts_update: dict[str, Any] = tts_section if isinstance(tts_section, dict) else {}
    if "voice" in tts_update:
        problem = _voice_issue(tts, tts_update["voice"])
        if problem:
            issues.append(Issue(path=["tts", "voice"], message=problem))
        changes["voice"] = tts_update["voice"]
    if "model" in tts_update:
        if not isinstance(tts_update["model"], str) or not tts_update["model"]:
            issues.append(Issue(path=["tts", "model"], message="must be a non-empty string"))
        elif tts is None:
            issues.append(Issue(path=["tts", "model"], message="this agent has no voice"))
        elif tts.provider in ("espeak", "hibari"):
            issues.append(
                Issue(path=["tts", "model"], message=f"{tts.provider} has no models to choose from")
            )
        changes["tts_model"] = tts_update["model"]
    stt_section = raw.get("stt")
    stt_update: dict[str, Any] = stt_section if isinstance(stt_section, dict) else {}
    if "language" in stt_update:
        problem = _language_issue(stt, stt_update["language"])
        if problem:
            issues.append(Issue(path=["stt", "language"], message=problem))
        changes["language"] = stt_update["language"]
    if isinstance(raw.get("llm"), dict):
        choice = raw["llm"]
        provider, model, base_url = choice.get("provider"), choice.get("model"), choice.get("baseURL")
        if provider not in _UPDATE_LLM_PROVIDERS:
            issues.append(
                Issue(path=["llm", "provider"], message=f"must be one of {', '.join(_UPDATE_LLM_PROVIDERS)}")
            )
        elif provider not in _BUILDABLE_LLM_PROVIDERS:
            issues.append(
                Issue(path=["llm", "provider"], message=f"this runner has no {provider} model provider")
            )
        if not isinstance(model, str) or not model:
            issues.append(Issue(path=["llm", "model"], message="must be a non-empty string"))
        if base_url is not None:
            if (
                not isinstance(base_url, str)
                or urlsplit(base_url).scheme not in ("http", "https")
                or not urlsplit(base_url).netloc
            ):
                issues.append(Issue(path=["llm", "baseURL"], message="must be an http(s) URL"))
            elif origin == "client" and not (
                author_llm.provider == "openai-compatible" and author_llm.base_url == base_url
            ):
                # The endpoint receives the agent's key: a client may not choose it.
                issues.append(
                    Issue(path=["llm", "baseURL"], message="a client may only use the agent's own endpoint")
                )
        if provider == "openai-compatible" and base_url is None:
            if author_llm.provider == "openai-compatible":
                base_url = author_llm.base_url
            else:
                issues.append(
                    Issue(path=["llm", "baseURL"], message="an openai-compatible model needs a baseURL")
                )
        if not issues:
            api_key_env = author_llm.api_key_env if base_url == author_llm.base_url else None
            changes["llm"] = LLM(provider=provider, model=model, base_url=base_url, api_key_env=api_key_env)
    if issues:
        raise InvalidSettings("the update does not fit this agent's providers", issues=issues)
    return Overrides(**changes)


def merge(old: Overrides, new: Overrides) -> Overrides:
    """Later outside changes win, path by path."""
    return Overrides(
        voice=new.voice if new.voice is not None else old.voice,
        tts_model=new.tts_model if new.tts_model is not None else old.tts_model,
        language=new.language if new.language is not None else old.language,
        llm=new.llm or old.llm,
    )
