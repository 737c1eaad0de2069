"""The provider registry: every provider is declared once, in its own module, and listed once."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import runner.providers as providers
from runner.providers import _registry


def _declaring_modules() -> dict[str, object]:
    found = {}
    for info in pkgutil.iter_modules(providers.__path__):
        module = importlib.import_module(f"runner.providers.{info.name}")
        if hasattr(module, "PROVIDES"):
            found[f".{info.name}"] = module
    return found


def test_every_declared_provider_is_listed_once_where_it_is_declared() -> None:
    declared = {
        (p.kind, p.name, where) for where, module in _declaring_modules().items() for p in module.PROVIDES
    }
    listed = list(_registry._WHERE)
    assert len(set(listed)) == len(listed)
    assert set(listed) == declared


@pytest.mark.parametrize("name", providers.LLM_PROVIDERS)
def test_a_listed_chat_model_is_what_make_llm_builds(name: str) -> None:
    llm = providers.make_llm(name, "some-model", base_url="http://127.0.0.1:9/v1")
    assert llm.provider == name


def test_unknown_names_have_no_declaration() -> None:
    assert _registry.chat_model("gemini") is None
    assert _registry.chat_model("hibari") is None
    assert _registry.synthesizer("whisper") is None
    assert _registry.recognizer("hibari") is None


@pytest.mark.parametrize("name", providers.TTS_PROVIDERS)
def test_a_listed_synthesizer_is_what_make_tts_builds(name: str) -> None:
    voice = 7 if name == "kugelaudio" else None
    assert providers.make_tts(name, voice=voice).provider == name


@pytest.mark.parametrize("name", providers.STT_PROVIDERS)
def test_a_listed_recognizer_streams_as_declared(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AZURE_SPEECH_REGION", "westeurope")
    recognizer = providers.make_stt(name)
    declared = _registry.recognizer(name)
    assert recognizer.provider == name
    assert declared is not None
    assert declared.streams == (recognizer.open_stream(16_000) is not None)
