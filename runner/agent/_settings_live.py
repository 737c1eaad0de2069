"""Live session settings: who may change what, whether a value fits, and what is in effect.

Deny by default, all or nothing: every path of an update must be adjustable for the
sender's origin (else ``not_adjustable`` naming the first), and every value must fit the
provider it would reach (else ``invalid_settings`` with issues). A refused update changes
nothing. An accepted value overrides the agent's and the active skill's props until the
next outside change of that path.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any, get_args
from urllib.parse import urlsplit

import attrs

from ..errors import InvalidRequest, InvalidSettings, NotAdjustable
from ..providers import chat_model, recognizer, synthesizer
from ..wire import (
    EffectiveLLM,
    EffectiveSettings,
    EffectiveSTT,
    EffectiveTTS,
    Issue,
    LLMProvider,
)
from ._authoring import Offer
from ._settings import LLM, STT, TTS, Origin

#: The chat model providers a settings update may name: the host protocol's list.
_LIVE_LLM_PROVIDERS: tuple[str, ...] = get_args(LLMProvider)
_SHAPE: dict[str, tuple[str, ...]] = {
    "tts": ("voice", "model"),
    "stt": ("language",),
    "llm": ("provider", "model", "baseURL"),
}


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
    declared = synthesizer(tts.provider)
    return declared.voice_problem(voice) if declared else None


def _tts_model_issue(tts: TTS | None, model: Any) -> str | None:
    if not isinstance(model, str) or not model:
        return "must be a non-empty string"
    if tts is None:
        return "this agent has no voice"
    declared = synthesizer(tts.provider)
    if declared is not None and not declared.has_models:
        return f"{tts.provider} has no models to choose from"
    return None


def _language_issue(stt: STT | None, language: Any) -> str | None:
    if stt is None:
        return "this agent has no recognizer"
    if not isinstance(language, str) or not 2 <= len(language) <= 16:
        return "must be a language tag such as 'en' or 'de-DE'"
    declared = recognizer(stt.provider)
    return declared.language_problem(language) if declared else None


def _shape_issues(raw: Mapping[str, Any]) -> list[Issue]:
    """Sections and keys that are not settings, and sections that are not objects."""
    issues = []
    for section, value in raw.items():
        if section not in _SHAPE:
            issues.append(Issue(path=[section], message="is not a setting"))
        elif not isinstance(value, dict):
            issues.append(Issue(path=[section], message="must be an object"))
        else:
            issues.extend(
                Issue(path=[section, key], message="is not a setting")
                for key in value
                if key not in _SHAPE[section]
            )
    return issues


def _option_changes(
    raw: Mapping[str, Any], tts: TTS | None, stt: STT | None, issues: list[Issue]
) -> dict[str, Any]:
    """The voice, speech model and language an update sets, each checked by its provider's declaration."""
    checks = (
        ("tts", "voice", "voice", partial(_voice_issue, tts)),
        ("tts", "model", "tts_model", partial(_tts_model_issue, tts)),
        ("stt", "language", "language", partial(_language_issue, stt)),
    )
    changes = {}
    for section, key, change, problem_of in checks:
        update = raw.get(section)
        if not isinstance(update, dict) or key not in update:
            continue
        problem = problem_of(update[key])
        if problem:
            issues.append(Issue(path=[section, key], message=problem))
        changes[change] = update[key]
    return changes


def _base_url_issue(base_url: Any, origin: Origin, author_llm: LLM) -> str | None:
    if (
        not isinstance(base_url, str)
        or urlsplit(base_url).scheme not in ("http", "https")
        or not urlsplit(base_url).netloc
    ):
        return "must be an http(s) URL"
    own = chat_model(author_llm.provider)
    if origin == "client" and not (
        own is not None and own.needs_base_url and author_llm.base_url == base_url
    ):
        # The endpoint receives the agent's key: a client may only name the agent's own.
        return "a client may only use the agent's own endpoint"
    return None


def _llm_choice(choice: Mapping[str, Any], origin: Origin, author_llm: LLM, issues: list[Issue]) -> LLM:
    """The chat model an update chooses; it stands only if ``issues`` stays empty."""
    provider: Any = choice.get("provider")
    model: Any = choice.get("model")
    base_url: Any = choice.get("baseURL")
    if provider not in _LIVE_LLM_PROVIDERS:
        issues.append(
            Issue(path=["llm", "provider"], message=f"must be one of {', '.join(_LIVE_LLM_PROVIDERS)}")
        )
    if not isinstance(model, str) or not model:
        issues.append(Issue(path=["llm", "model"], message="must be a non-empty string"))
    problem = None if base_url is None else _base_url_issue(base_url, origin, author_llm)
    if problem:
        issues.append(Issue(path=["llm", "baseURL"], message=problem))
    declared = chat_model(provider) if provider in _LIVE_LLM_PROVIDERS else None
    if declared is not None and declared.needs_base_url and base_url is None:
        if author_llm.provider == provider:
            base_url = author_llm.base_url
        else:
            issues.append(Issue(path=["llm", "baseURL"], message=f"an {provider} model needs a baseURL"))
    api_key_env = author_llm.api_key_env if base_url == author_llm.base_url else None
    return LLM(provider=provider, model=model, base_url=base_url, api_key_env=api_key_env)


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
    _, tts, stt = current
    issues = _shape_issues(raw)
    changes = _option_changes(raw, tts, stt, issues)
    if isinstance(raw.get("llm"), dict):
        choice = _llm_choice(raw["llm"], origin, author_llm, issues)
        if not issues:
            changes["llm"] = choice
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
