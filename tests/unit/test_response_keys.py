"""A picture's answer is cached under what saw it: the pictures' own hashes and the
projector file's fingerprint (a projector replaced at the same path answers anew)."""

from __future__ import annotations

from pathlib import Path

from engine.conversation.images import Picture
from engine.catalog.models import LocalModel
from engine.events import GenerationRequest

MODEL = LocalModel("seer", Path("/m/seer.gguf"), 1, False, projector=Path("/m/mmproj-seer.gguf"))


def key(pictures, projector):
    from engine.response_cache import request_key  # it loads llama.cpp (the build's id)

    request = GenerationRequest(MODEL, messages=({"role": "user", "content": "?"},),
                                pictures=pictures)
    return request_key(request, "prompt", "model-fp", 4096, projector=projector)


def test_the_key_follows_the_pictures_and_the_projector():
    red, blue = Picture("a" * 64, 2, 2), Picture("b" * 64, 2, 2)
    assert key((red,), "fp-1") == key((red,), "fp-1")
    assert key((red,), "fp-1") != key((blue,), "fp-1")
    assert key((red,), "fp-1") != key((red,), "fp-2")  # the same path, another file
    assert key((), None) != key((red,), "fp-1")
