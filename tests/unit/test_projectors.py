"""Which model a projector belongs to, by the file names people give them, and what its
header says it costs (checked against libmtmd in tests/engine/test_vision_memory.py)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from engine.catalog.projectors import projector_for, read_projector
from engine.errors import InvalidModelFile
from fixtures.projectors import SMOLVLM, SMOLVLM_QUICK, write_projector

P = Path


@pytest.mark.parametrize("model, projectors, flat, paired", [
    ("SmolVLM-256M-Instruct-Q8_0.gguf", ["mmproj-SmolVLM-256M-Instruct-f16.gguf"], True,
     "mmproj-SmolVLM-256M-Instruct-f16.gguf"),
    ("gemma-3-4b-it-Q4_K_M.gguf", ["gemma-3-4b-it-mmproj-bf16.gguf"], True,
     "gemma-3-4b-it-mmproj-bf16.gguf"),
    ("Qwen2.5-VL-7B-Instruct-Q4_K_M.gguf", ["mmproj-Qwen2.5-VL-7B-Instruct-f16.gguf",
                                           "mmproj-Qwen2.5-VL-3B-Instruct-f16.gguf"], True,
     "mmproj-Qwen2.5-VL-7B-Instruct-f16.gguf"),
    ("llama-3-8b.gguf", ["mmproj-SmolVLM-256M-Instruct-f16.gguf"], True, None),  # another's
    ("model-Q4_K_M.gguf", ["mmproj-F16.gguf"], True, None),  # names nothing, in a flat folder
    ("model-Q4_K_M.gguf", ["mmproj-F16.gguf"], False, "mmproj-F16.gguf"),  # its repo's only
    ("a-Q4.gguf", ["mmproj-x.gguf", "mmproj-y.gguf"], False, None),  # which? none is guessed
])
def test_a_projector_pairs_by_name_or_as_its_folders_only_one(model, projectors, flat, paired):
    found = projector_for(P(model), [P(p) for p in projectors], flat)
    assert (found.name if found else None) == paired


def test_the_header_says_tiles_tokens_memory_and_fit(tmp_path):
    quick = read_projector(write_projector(SMOLVLM_QUICK, tmp_path / "mmproj-q.gguf"))
    assert (quick.projector_type, quick.n_out, quick.tokens_per_tile) == ("idefics3", 576, 64)
    assert quick.tiles(640, 480) == 2  # one tile and the overview
    full = replace(quick, preproc_size=SMOLVLM.preproc_size)  # SmolVLM's own: 2048
    assert full.tiles(1024, 768) == 13  # 2048x1536: 4x3 tiles and the overview
    assert quick.compute_bytes == 21 << 20  # as libmtmd reserves for SigLIP-B/16 at 512
    assert quick.misfit(576) is None and "belongs to another model" in quick.misfit(2048)


def test_a_file_that_is_no_projector_is_refused(tmp_path):
    text = tmp_path / "mmproj-fake.gguf"
    text.write_text("not a gguf")
    with pytest.raises(InvalidModelFile):
        read_projector(text)
