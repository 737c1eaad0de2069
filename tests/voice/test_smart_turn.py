from pathlib import Path

import pytest

from runner.voice.smart_turn import MODEL_SHA256, ModelRefused, SmartTurn, load, model_path
from tests.voice.turn_audio import cut_after, say


def test_the_model_is_the_installed_packages_and_its_hash_is_checked(tmp_path: Path) -> None:
    path = model_path()
    assert path is not None, "pipecat-ai is not installed: run .ci/install-smart-turn"
    assert path.name == "smart-turn-v3.2-cpu.onnx"
    assert load() is load(path)

    forged = tmp_path / path.name
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    forged.write_bytes(bytes(data))
    with pytest.raises(ModelRefused, match=MODEL_SHA256):
        SmartTurn(forged)


@pytest.mark.parametrize(
    ("text", "cut_word"),
    [("I would like to book a table for four people.", 6), ("What time do you open tomorrow?", 3)],
)
async def test_a_whole_sentence_rates_finished_and_one_cut_at_a_word_does_not(
    text: str, cut_word: int
) -> None:
    model = load()
    assert model is not None
    pcm, rate = await say(text)
    cut = cut_after(pcm, rate, cut_word)

    whole = await model.rate(pcm, rate)
    unfinished = await model.rate(pcm[:cut], rate)

    assert whole > 0.9
    assert unfinished < 0.1
