"""The random-weight shapes (fixtures/shapes.py) stay inside half precision: every block
type decodes to weights of mean 0 and spread 1/sqrt(fan-in), and on real llama.cpp (the
CPU here, which computes in F32 and so cannot overflow) each architecture's logits come
out finite and near 1, as they must for CUDA's half-precision activations to hold them."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from fixtures.shapes import RUNNABLE_MOE, SHAPES, _QUANT_SPREAD, _random_block_bytes, cached
from support.models import STARTER


@pytest.mark.parametrize("kind", sorted(_QUANT_SPREAD))
@pytest.mark.parametrize("fan_in", [512, 4096])
def test_every_block_type_decodes_to_weights_of_mean_0_and_spread_1_over_sqrt_fan_in(
        kind, fan_in):
    import gguf
    from gguf.quants import dequantize

    qtype = gguf.GGMLQuantizationType[kind]
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    rows = 64
    raw = _random_block_bytes(np.random.default_rng(0), kind, rows * fan_in // block,
                              (fan_in, rows))
    weights = dequantize(np.frombuffer(raw, np.uint8).reshape(rows, -1), qtype)
    wanted = 1 / np.sqrt(fan_in)
    assert np.isfinite(weights).all()
    assert abs(weights.mean()) < 0.1 * wanted, kind
    assert 0.6 * wanted < weights.std() < 1.5 * wanted, (kind, weights.std() / wanted)


# The shapes that run, small: tiny MoE layouts llama.cpp loads (the others' tiny specs are
# headers for the planner), the MoE the benches run, and two layers of Qwen3-1.7B at its
# real width and vocabulary (the dense layout the GPU benches run, Qwen3-8B, is the same
# writer at a larger width).
ARCHITECTURES = [SHAPES[name] for name in ("qwen3moe-tiny", "mixtral-tiny", "llama4-tiny")] + \
    [RUNNABLE_MOE, replace(SHAPES["qwen3-1.7b"], name="qwen3-1.7b-2l", n_layers=2)]


@pytest.mark.parametrize("spec", ARCHITECTURES, ids=lambda spec: spec.name)
def test_each_architecture_computes_finite_logits_near_1(starters_dir, spec):
    from engine.llama.runtime import LlamaModel
    from engine.settings import LoadSettings

    path = cached(spec, donor=starters_dir / f"{STARTER}.gguf")
    model = LlamaModel(path, LoadSettings(n_ctx=256, n_batch=64, n_threads=2))
    try:
        tokens = model.tokenize("The quick brown fox jumps over the lazy dog. " * 3)
        model.decode(tokens, 0)
        logits = model.logits()  # NonFiniteLogits if any were NaN or infinite
        spread, peak = float(logits.std()), float(np.abs(logits).max())
        # the earlier writer's: a spread of 7.6 (the MoE) and 15.2 (two layers of 1.7B)
        assert 0.5 < spread < 2 and peak < 10, (spread, peak)
    finally:
        model.close()
