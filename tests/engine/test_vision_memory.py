"""The projector in the plan: what the planner counts for it (its weights and its compute
buffer, read from its header) against what libmtmd allocates when it loads, and its
embeddings kept on disk for a restarted engine."""

from __future__ import annotations

import time

import numpy as np
import pytest
from PIL import Image

from engine.conversation.images import read_image
from engine.catalog.projectors import read_projector
from engine.llama.runtime import LlamaModel
from engine.llama.vision import Projector
from engine.model.vision import ImageCache
from engine.settings import LoadSettings
from fixtures.projectors import SMOLVLM, write_projector

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def decoder(vision_dir):
    model = LlamaModel(vision_dir / "smolvlm-256m.gguf", LoadSettings(n_ctx=1024, n_seq_max=2))
    yield model
    model.close()


@pytest.mark.parametrize("full", [False, True], ids=["2 blocks", "SmolVLM's 12 blocks"])
def test_the_plan_counts_the_projector_within_5_percent(decoder, vision_dir, tmp_path, full):
    path = write_projector(SMOLVLM, tmp_path / "mmproj.gguf") if full else \
        vision_dir / "mmproj-smolvlm-256m-f16.gguf"
    planned = read_projector(path).total_bytes
    projector = Projector(path, decoder, n_threads=2, device="CPU")
    try:
        allocated = sum(projector.buffers.values())
        kinds = {kind for _, kind in projector.buffers}
    finally:
        projector.close()
    assert kinds == {"model", "compute"}
    assert abs(planned / allocated - 1) < 0.05, (planned, allocated)


def test_an_image_is_tokenized_with_the_models_markers_and_kept_across_restarts(
        decoder, vision_dir, tmp_path):
    projector = Projector(vision_dir / "mmproj-smolvlm-256m-f16.gguf", decoder, 2, "CPU")
    picture = read_image(_png(tmp_path), "image")
    try:
        prompt = projector.tokenize(["<|im_start|>user\n", "What is it?<|im_end|>\n"],
                                    [picture], None)
        pieces = list(prompt.images.values())
        assert len(pieces) == 2 and all(p.n_tokens == 64 for p in pieces)
        assert len(prompt.tokens) == 128 + sum(1 for t in prompt.tokens if t >= 0)
        first = ImageCache(tmp_path / "images")
        kept = first.embeddings(projector, pieces[0])
        assert (first.encoded, first.found) == (1, 0)
        assert first.embeddings(projector, pieces[0]) is kept and first.found == 1
        restarted = ImageCache(tmp_path / "images")  # a new engine: the disk tier
        assert np.array_equal(restarted.embeddings(projector, pieces[0]), kept)
        assert (restarted.encoded, restarted.found) == (0, 1)
        digest = pieces[0].key.partition(":")[0]  # what the picture caps ask it
        assert first.knows(digest) and ImageCache(tmp_path / "images").knows(digest)
        assert not first.knows("0" * 64) and not ImageCache(None).knows(digest)
        assert oct((tmp_path / "images").stat().st_mode & 0o777) == "0o700"
        prompt.close()
    finally:
        projector.close()


def _png(folder, color=(10, 200, 30)):
    path = folder / "a.png"
    Image.new("RGB", (300, 200), color).save(path)
    return path.read_bytes()


def test_the_disk_tier_keeps_the_most_recently_used_within_its_bytes(decoder, vision_dir,
                                                                     tmp_path):
    projector = Projector(vision_dir / "mmproj-smolvlm-256m-f16.gguf", decoder, 2, "CPU")
    one_piece = 64 * 576 * 4 + 128  # a chunk's embeddings and the .npy header
    try:
        prompts = [projector.tokenize(["a ", " b"], [read_image(_png(tmp_path, color), "x")],
                                      None) for color in ((1, 2, 3), (4, 5, 6))]
        first, second = (list(p.images.values()) for p in prompts)
        cache = ImageCache(tmp_path / "images", disk_bytes=3 * one_piece)
        for piece in (*first, second[0]):
            cache.embeddings(projector, piece)
        time.sleep(0.05)
        ImageCache(tmp_path / "images").embeddings(projector, first[0])  # read: recent again
        time.sleep(0.05)
        cache.embeddings(projector, second[1])  # a fourth: the least recent goes
        kept = {p.stem for p in (tmp_path / "images").glob("*.npy")}
        assert len(kept) == 3
        assert first[1].key.replace(":", "-") not in kept  # written first, never read again
        assert first[0].key.replace(":", "-") in kept
        for prompt in prompts:
            prompt.close()
    finally:
        projector.close()
