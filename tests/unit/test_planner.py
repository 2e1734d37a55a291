"""The planner: table-driven over simulated machines and model shapes, and its
prediction against llama.cpp's measured buffers on this machine."""

from dataclasses import replace

import pytest

from support.models import GEMMA, STARTER
from engine.catalog.gguf_file import GGUFInspector
from engine.catalog.shape import ModelShape
from engine.machine.hardware import simulated
from engine.machine.planner import (AUTO_KV_SHARE, AUTO_SPEED_SHARE, Preferences,
                                     auto_context, choose_quant, plan)

GiB, MiB = 1 << 30, 1 << 20


def synthetic(name, n_layers, n_embd, n_ff, n_head_kv, head_dim, n_vocab, file_gib, ctx):
    """A model shape from its published hyperparameters and Q4_K_M file size."""
    embd = int(n_vocab * n_embd * 0.56)  # about 4.5 bits per weight
    layer = int((file_gib * GiB - 2 * embd) / n_layers)
    return ModelShape(name, n_layers, n_embd, n_ff, n_head_kv, head_dim, head_dim, n_vocab,
                      ctx, (layer,) * n_layers, embd, embd)


LLAMA_7B = synthetic("llama-7b", 32, 4096, 14336, 8, 128, 128256, 4.6, 131072)
LLAMA_70B = synthetic("llama-70b", 80, 8192, 28672, 8, 128, 128256, 40.0, 131072)
MIXTRAL = synthetic("mixtral-8x7b", 32, 4096, 14336, 8, 128, 32000, 26.4, 32768)

MACHINES = {
    "cpu laptop 8G": simulated((), 8),
    "gpu laptop 8G": simulated((8,), 16),
    "desktop 24G": simulated((24,), 64),
    "mac 16G unified": simulated((12,), 16, unified=True),
    "two gpus 12G+8G": simulated((12, 8), 32),
}


@pytest.fixture(scope="module")
def real_shapes(starters_dir):
    inspector = GGUFInspector()
    return {name: inspector.inspect(starters_dir / f"{name}.gguf").shape
            for name in (STARTER, GEMMA)}


@pytest.mark.parametrize("machine, model, layers, ctx, kv", [
    ("cpu laptop 8G", STARTER, 0, 8192, "f16"),
    ("gpu laptop 8G", GEMMA, 19, 8192, "f16"),
    ("cpu laptop 8G", "llama-7b", 0, 8192, "f16"),
    ("gpu laptop 8G", "llama-7b", 33, 8192, "f16"),
    ("desktop 24G", "llama-7b", 33, 8192, "f16"),
    ("desktop 24G", "llama-70b", 42, 8192, "f16"),
    ("desktop 24G", "mixtral-8x7b", 26, 8192, "f16"),
    ("mac 16G unified", "llama-7b", 33, 8192, "f16"),
    ("two gpus 12G+8G", "mixtral-8x7b", 21, 8192, "f16"),
])
def test_plans_for_simulated_machines(real_shapes, machine, model, layers, ctx, kv):
    shapes = {**real_shapes, "llama-7b": LLAMA_7B, "llama-70b": LLAMA_70B,
              "mixtral-8x7b": MIXTRAL}
    hardware = MACHINES[machine]
    result = plan(hardware, shapes[model], Preferences(ctx=8192))
    assert result.fits, result.reasons
    assert (result.n_gpu_layers, result.n_ctx, result.kv_type) == (layers, ctx, kv), result.reasons
    for use in result.uses:
        assert use.total <= use.budget, (use.device, use.total, use.budget)
    if len(hardware.gpus) > 1 and result.n_gpu_layers:
        assert len(result.tensor_split) == 2 and abs(sum(result.tensor_split) - 1) < 1e-3


def test_a_model_too_big_says_so():
    result = plan(MACHINES["cpu laptop 8G"], LLAMA_70B)
    assert not result.fits and "does not fit" in result.reasons[0]


def test_kv_is_quantized_only_when_the_context_needs_it():
    # 10 GiB of RAM: the 7B's weights plus a 64k-token f16 KV cache (8 GiB) do not fit,
    # with a q8_0 cache they do.
    result = plan(simulated((), 10), LLAMA_7B, Preferences(ctx=65536, min_ctx=4096))
    assert (result.n_ctx, result.kv_type) == (65536, "q8_0")
    assert any("q8_0" in r for r in result.reasons)
    roomy = plan(simulated((), 32), LLAMA_7B, Preferences(ctx=65536))
    assert (roomy.n_ctx, roomy.kv_type) == (65536, "f16")
    short = plan(simulated((), 6), LLAMA_7B, Preferences(ctx=65536, min_ctx=2048))
    assert short.fits and short.n_ctx < 65536 and any("context reduced" in r for r in short.reasons)


def test_draft_model_memory_is_counted(real_shapes):
    small = simulated((), 0.45)
    alone = plan(small, real_shapes[GEMMA], Preferences(ctx=4096, min_ctx=512))
    paired = plan(small, real_shapes[GEMMA], Preferences(ctx=4096, min_ctx=512,
                                                         draft=real_shapes[GEMMA]))
    assert paired.uses[-1].weights > alone.uses[-1].weights
    assert paired.n_ctx < alone.n_ctx or not paired.fits


def test_an_embedding_model_beside_the_chat_model_is_counted(real_shapes):
    machine = simulated((), 0.45)
    alone = plan(machine, real_shapes[GEMMA], Preferences(ctx=4096, min_ctx=512))
    beside = plan(machine.reserving({"CPU": 120 << 20}), real_shapes[GEMMA],
                  Preferences(ctx=4096, min_ctx=512))
    assert beside.uses[-1].budget < alone.uses[-1].budget - (100 << 20)  # less headroom
    assert beside.kv_type == "q8_0" and alone.kv_type == "f16"  # it makes room


def test_quant_choice_before_download():
    candidates = [("Q8_0", int(8.5 * GiB)), ("Q6_K", int(6.6 * GiB)),
                  ("Q4_K_M", int(4.9 * GiB)), ("Q2_K", int(3.2 * GiB))]
    assert choose_quant(MACHINES["gpu laptop 8G"], LLAMA_7B, candidates,
                        Preferences(ctx=8192))[0] == "Q6_K"
    assert choose_quant(MACHINES["desktop 24G"], LLAMA_7B, candidates,
                        Preferences(ctx=8192))[0] == "Q8_0"
    assert choose_quant(simulated((), 2), LLAMA_7B, candidates) is None


@pytest.mark.parametrize("model", [STARTER, GEMMA])
@pytest.mark.parametrize("ctx", [1024, 4096])
def test_prediction_matches_llama_cpp_buffers_within_5_percent(starters_dir, real_shapes,
                                                               model, ctx):
    from engine.llama.runtime import LlamaModel
    from engine.model.loader import by_plan
    from engine.settings import LoadSettings
    from engine.llama.probe import probe

    result = plan(probe(), real_shapes[model], Preferences(ctx=ctx, min_ctx=ctx))
    loaded = LlamaModel(starters_dir / f"{model}.gguf", by_plan(LoadSettings(), result))
    measured = sum(loaded.buffers.values())
    loaded.close()
    predicted = result.uses[-1].total
    print(f"\n{model} n_ctx {ctx}: predicted {predicted / MiB:.1f} MiB, "
          f"measured {measured / MiB:.1f} MiB ({predicted / measured:.3f})")
    assert abs(predicted / measured - 1) <= 0.05


@pytest.mark.parametrize("model", [STARTER, GEMMA])
def test_prediction_with_layers_on_an_rpc_worker_matches_llama_cpp(starters_dir, model):
    """A real llama.cpp RPC worker process on 127.0.0.1 as a second device: the plan for
    10 of the model's layers there, loaded, against llama.cpp's buffers per device. In a
    child process, because a registered RPC device stays in the process's device list."""
    import json
    import subprocess
    import sys

    from support import ROOT

    script = ROOT / "tests" / "support" / "rpc_offload_check.py"
    done = subprocess.run([sys.executable, str(script), str(starters_dir / f"{model}.gguf"),
                           "10"], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    devices = json.loads(done.stdout.splitlines()[-1])
    print(f"\n{model}: {devices}")
    assert {d["device"] for d in devices} == {"RPC0", "CPU"}
    for device in devices:
        assert abs(device["measured"] / device["predicted"] - 1) <= 0.05, device


def test_scaled_shape_keeps_the_attention_shape(real_shapes):
    base = real_shapes[GEMMA]
    double = base.scaled("x", 2 * base.weights_bytes)
    assert abs(double.weights_bytes / base.weights_bytes - 2) < 0.01
    assert replace(double, name=base.name, layer_bytes=base.layer_bytes,
                   embd_bytes=base.embd_bytes, output_bytes=base.output_bytes,
                   layer_spans=base.layer_spans, layer_repack=base.layer_repack,
                   expert_spans=base.expert_spans, expert_repack=base.expert_repack) == base


def test_engine_loads_by_the_plan_and_records_its_accuracy(starters_dir, tmp_path):
    import json

    from support.engines import run
    from engine.catalog.gguf_file import GGUFInspector
    from engine.catalog.models import ModelStore
    from engine.engine import Engine
    from engine.settings import EngineSettings
    from engine.settings import LoadSettings

    store = ModelStore(starters_dir, GGUFInspector())
    calibration = tmp_path / "calibration.json"
    engine = Engine(store, EngineSettings(LoadSettings(n_ctx=4096),
                                          calibration_file=calibration))
    run(engine, model=store.resolve(STARTER), prompt="Hello", max_tokens=2)
    # the load's first request is cold; the next measures the speed forecast
    run(engine, model=store.resolve(STARTER), prompt="Count to twenty:", max_tokens=20,
        ignore_eos=True)
    memory = engine.status()["memory"]
    engine.close()
    assert memory["plan"]["n_ctx"] == 4096 and memory["plan"]["fits"]
    [cpu] = memory["devices"]
    assert cpu["device"] == "CPU" and 0.95 <= cpu["ratio"] <= 1.05
    recorded = json.loads(calibration.read_text())
    assert 0.95 <= recorded["memory"]["cpu/llama"] <= 1.05
    decode = memory["speed"]["decode"]
    assert decode["measured"] > 0 and decode["uncalibrated_forecast"] == \
        memory["plan"]["forecast"]["uncalibrated_decode_tokens_per_s"]
    assert recorded["speed"]["decode/cpu/dense"] == \
        pytest.approx(decode["measured"] / decode["uncalibrated_forecast"], rel=0.01)


def test_calibration_shrinks_budgets_only_when_loads_measured_more():
    tight = simulated((), 6.5)
    plain = plan(tight, LLAMA_7B, Preferences(ctx=16384))
    cautious = plan(tight, LLAMA_7B, Preferences(ctx=16384, calibration=(("cpu", 1.1),)))
    generous = plan(tight, LLAMA_7B, Preferences(ctx=16384, calibration=(("cpu", 0.7),)))
    assert cautious.uses[-1].budget < plain.uses[-1].budget == generous.uses[-1].budget
    assert (plain.n_ctx, plain.kv_type) == (16384, "q8_0")
    assert cautious.fits and cautious.n_ctx == 8192


def test_calibration_keeps_the_bandwidth_its_speed_ratios_were_measured_against(tmp_path):
    from engine.machine.calibration import Calibration

    path = tmp_path / "calibration.json"
    first = Calibration(path).steady(simulated((), 16, ram_bandwidth_gbs=20))
    later = Calibration(path).steady(simulated((), 16, ram_bandwidth_gbs=17))
    assert first.ram_bandwidth == later.ram_bandwidth == 20e9
    unprobed = simulated((), 16)
    assert Calibration(path).steady(unprobed) == unprobed


def test_back_off_caps_the_failed_device_and_the_next_plan_is_smaller(real_shapes):
    from engine.machine.planner import back_off

    hardware = simulated((8,), 32)
    first = plan(hardware, LLAMA_7B, Preferences(ctx=32768))
    used = {u.device: u.total for u in first.uses if u.total}
    safer = plan(hardware, LLAMA_7B, back_off(Preferences(ctx=32768), used, "GPU0"))
    gpu = next(u for u in safer.uses if u.device == "GPU0")
    assert safer.fits and gpu.total <= 0.75 * used["GPU0"]
    assert (safer.n_gpu_layers, safer.n_ctx) < (first.n_gpu_layers, first.n_ctx) \
        or safer.kv_type == "q8_0"
    assert any("held to" in r for r in safer.reasons)
    # the CPU is untouched by a GPU failure
    assert dict(back_off(Preferences(), used, "GPU0").caps).keys() == {"GPU0"}


def test_user_layer_override_is_kept_and_its_consequence_shown():
    hardware = simulated((8,), 32)
    chosen = plan(hardware, LLAMA_7B, Preferences(ctx=8192, gpu_layers=10))
    assert chosen.fits and chosen.n_gpu_layers == 10
    assert "the output and 9 of 32 layers on the GPU, as chosen" in chosen.reasons
    auto = plan(hardware, LLAMA_7B, Preferences(ctx=8192))
    cpu = lambda p: next(u for u in p.uses if u.device == "CPU").weights
    assert cpu(chosen) > cpu(auto)
    # more layers than the GPU holds: no plan fits, and it says by how much
    too_many = plan(simulated((2,), 32), LLAMA_7B, Preferences(ctx=8192, min_ctx=8192,
                                                               gpu_layers=32))
    assert not too_many.fits and "more on GPU0" in too_many.reasons[0]


def test_two_gpus_share_user_chosen_layers_by_their_budgets():
    chosen = plan(simulated((12, 6), 64), LLAMA_70B, Preferences(ctx=4096, gpu_layers=30))
    assert chosen.n_gpu_layers == 30
    # the larger GPU holds the output and the last layers, so it comes last for llama.cpp
    assert chosen.gpus == ("GPU1", "GPU0") and chosen.tensor_split == (0.3333, 0.6667)


def test_unquantized_files_are_recommended_only_wholly_on_a_gpu():
    candidates = [("F16", int(14.5 * GiB)), ("Q8_0", int(7.7 * GiB)), ("Q4_K_M", int(4.6 * GiB))]
    assert choose_quant(simulated((), 64), LLAMA_7B, candidates)[0] == "Q8_0"
    assert choose_quant(simulated((24,), 64), LLAMA_7B, candidates)[0] == "F16"


def test_the_draft_goes_on_the_gpu_when_the_main_model_left_room(real_shapes):
    from engine.machine.planner import draft_bytes, place_draft

    draft = real_shapes[GEMMA]
    roomy = plan(simulated((24,), 64), LLAMA_7B, Preferences(ctx=8192, draft=draft))
    assert place_draft(roomy, draft, roomy.n_ctx) == ("GPU0", draft.n_layers + 1)
    tight = plan(simulated((5,), 64), LLAMA_7B, Preferences(ctx=8192, draft=draft))
    assert place_draft(tight, draft, tight.n_ctx) == ("CPU", 0)
    need = draft_bytes(draft, tight.n_ctx)  # and only where RAM holds it: else nowhere
    assert place_draft(tight, draft, tight.n_ctx, ram_free=need) == ("CPU", 0)
    assert place_draft(tight, draft, tight.n_ctx, ram_free=need - 1) is None
    # the main plan counted the draft's memory (on the CPU, where it may end up)
    alone = plan(simulated((5,), 64), LLAMA_7B, Preferences(ctx=8192))
    cpu = lambda p: p.uses[-1].total
    assert cpu(tight) - cpu(alone) >= draft.weights_bytes


# -- the context when none is asked ------------------------------------------------------

def _at(hardware, shape, n_ctx):
    return plan(hardware, shape, Preferences(ctx=n_ctx, min_ctx=n_ctx))


def test_without_a_context_asked_the_plan_takes_up_to_32k_where_it_costs_nothing(real_shapes):
    starter = plan(MACHINES["cpu laptop 8G"], real_shapes[STARTER], auto_context())
    assert starter.n_ctx == 8192  # all SmolLM2 takes
    assert any("the most this model takes" in r for r in starter.reasons), starter.reasons
    roomy = plan(simulated((), 64), LLAMA_7B, auto_context())
    assert roomy.n_ctx == 32768 and roomy.kv_type == "f16"
    assert any("enough for coding agents" in r for r in roomy.reasons), roomy.reasons


def test_a_context_that_would_push_layers_off_the_gpu_is_declined_and_its_cost_named():
    # a 6 GiB GPU: the 7B with a 16k q8_0 KV cache keeps every layer there; 32k would not
    hardware = simulated((6,), 16, gpu_bandwidth_gbs=900, ram_bandwidth_gbs=60)
    chosen = plan(hardware, LLAMA_7B, auto_context())
    fixed = {n: _at(hardware, LLAMA_7B, n) for n in (4096, 8192, 16384, 32768)}
    fastest = max(p.forecast.decode_tps for p in fixed.values() if p.fits)
    assert chosen.n_ctx == 16384 and chosen.n_gpu_layers == LLAMA_7B.n_layers + 1
    assert chosen.forecast.decode_tps >= AUTO_SPEED_SHARE * fastest
    bigger = fixed[32768]
    assert bigger.fits and bigger.forecast.decode_tps < AUTO_SPEED_SHARE * fastest
    assert any("32,768 would run at about" in r for r in chosen.reasons), chosen.reasons


def test_a_context_whose_kv_cache_would_take_over_a_quarter_of_memory_is_declined():
    # 12 GiB of RAM: the 7B (4.6 GiB) at 32k holds 4 GiB of f16 KV, over a quarter of it
    chosen = plan(simulated((), 12), LLAMA_7B, auto_context())
    assert chosen.fits and chosen.n_ctx < 32768
    kv = sum(u.kv for u in chosen.uses)
    assert kv <= AUTO_KV_SHARE * sum(u.budget for u in chosen.uses)
    assert any("of KV cache" in r for r in chosen.reasons), chosen.reasons


def test_below_4k_only_when_nothing_larger_fits():
    # the smallest RAM (in 50 MiB steps) the 7B fits in at all: there the plan takes
    # the largest context that fits, below 4k
    ram = next(g / 20 for g in range(100, 140)
               if plan(simulated((), g / 20), LLAMA_7B, auto_context()).fits)
    chosen = plan(simulated((), ram), LLAMA_7B, auto_context())
    assert chosen.n_ctx < 4096 and not _at(simulated((), ram), LLAMA_7B, 4096).fits
    assert any("does not fit" in r for r in chosen.reasons), chosen.reasons


# -- tensor parallelism across GPUs (simulated: no machine here has two) ------------------

TWO_CARDS = simulated((24, 24), 128, gpu_bandwidth_gbs=936, ram_bandwidth_gbs=60)
LLAMA_70B_ARCH = replace(LLAMA_70B, architecture="llama")


def test_two_gpus_split_every_layer_when_asked_and_forecast_faster():
    """llama.cpp's tensor split is experimental there and unmeasured here: never the
    default over a layer split (`serve --split-mode tensor` asks for it)."""
    layers = plan(TWO_CARDS, LLAMA_70B_ARCH, Preferences(ctx=8192))
    chosen = plan(TWO_CARDS, LLAMA_70B_ARCH, Preferences(ctx=8192, tensor_parallel=True))
    assert chosen.split_mode == "tensor" and layers.split_mode == "layer"
    assert chosen.forecast.decode_tps > layers.forecast.decode_tps
    assert chosen.kv_type == "f16" and chosen.n_gpu_layers == LLAMA_70B.n_layers + 1
    # each card holds its share of every layer's weights and of the KV cache
    weights = sum(LLAMA_70B.layer_bytes) + LLAMA_70B.output_bytes
    for use, share in zip(chosen.uses[:2], chosen.tensor_split):
        assert abs(use.weights - weights * share) <= 1 and use.total <= use.budget
    assert abs(sum(chosen.tensor_split) - 1) < 1e-3
    assert any("tensor parallelism" in r for r in chosen.reasons), chosen.reasons
    assert any(f"about {layers.forecast.decode_tps:.1f} tok/s" in r for r in chosen.reasons)


@pytest.mark.parametrize("why, hardware, shape, prefs", [
    ("one GPU", simulated((48,), 128, gpu_bandwidth_gbs=936), LLAMA_70B_ARCH, Preferences()),
    ("an architecture llama.cpp refuses", TWO_CARDS, replace(LLAMA_70B, architecture="deepseek2"),
     Preferences()),
    ("a quantized KV cache", simulated((22, 22), 128, gpu_bandwidth_gbs=936), LLAMA_70B_ARCH,
     Preferences(ctx=32768, min_ctx=32768)),
    ("the user's layer count", TWO_CARDS, LLAMA_70B_ARCH, Preferences(gpu_layers=60)),
])
def test_no_tensor_split_where_llama_cpp_cannot_or_the_user_chose_layers(why, hardware, shape,
                                                                        prefs):
    chosen = plan(hardware, shape, replace(prefs, tensor_parallel=True))
    assert chosen.fits and chosen.split_mode == "layer", (why, chosen.reasons)
    assert chosen.kv_type == ("q8_0" if "quantized" in why else "f16")


def test_no_tensor_split_on_backends_without_it():
    vulkan = replace(TWO_CARDS, devices=tuple(
        replace(d, name=d.name.replace("GPU", "Vulkan")) for d in TWO_CARDS.devices))
    asked = Preferences(ctx=8192, tensor_parallel=True)
    assert plan(vulkan, LLAMA_70B_ARCH, asked).split_mode == "layer"


def test_a_70b_on_two_24_gib_cards_gets_16k_by_default():
    """A reasoning answer and an agent's prompt need 16k: taken by default where the
    model and memory allow, speed traded for it (it used to plan 4k: the faster tensor
    split wanted an f16 KV cache)."""
    chosen = plan(simulated((24, 24), 64, gpu_bandwidth_gbs=936, ram_bandwidth_gbs=60),
                  LLAMA_70B_ARCH, auto_context())
    assert chosen.fits and chosen.n_ctx >= 16384 and chosen.split_mode == "layer"


def test_a_named_draft_must_be_small_beside_its_model():
    from pathlib import Path

    from engine.catalog.drafts import IncompatibleDraft, check_size
    from engine.catalog.models import LocalModel

    target = LocalModel("big", Path("big.gguf"), 10 * GiB, False)
    huge = LocalModel("huge", Path("huge.gguf"), 40 * GiB, False)
    with pytest.raises(IncompatibleDraft, match="400% of the model's size"):
        check_size(target, huge)
    check_size(target, LocalModel("small", Path("small.gguf"), 5 * GiB, False))


def test_lanes_come_from_the_context_and_parallel_overrides_them():
    from engine.machine.planner import LANE_TOKENS, lanes
    from engine.settings import MAX_LANES

    # an 8B model on a 24 GB GPU: 32k cells in one pool, more than 16 requests' worth
    planned = plan(simulated((24,), 64), LLAMA_7B, auto_context())
    assert planned.n_ctx == 32768 and planned.lanes == MAX_LANES and not planned.kv_split
    assert "16 requests at once" in planned.reasons[-1] == planned.lanes_why
    assert "64 of 512 tokens" in planned.reasons[-1]
    asked = plan(simulated((24,), 64), LLAMA_7B, replace(auto_context(), parallel=4))
    assert asked.lanes == 4 and asked.reasons[-1] == "4 requests at once (--parallel)"
    assert lanes(2048) == (2048 // LANE_TOKENS, lanes(2048)[1]) and lanes(300)[0] == 1
    assert lanes(1 << 20)[0] == MAX_LANES and lanes(4096, parallel=1)[0] == 1


def test_a_kv_stream_for_each_lane_where_the_memory_holds_them():
    """On an H200 an 8B model's 32k context fits 17 times over (16 lanes and the spare):
    each lane gets a stream of its own, counted in the plan's memory; on a 24 GB GPU
    they do not fit, and asking for them says so. In RAM, only within a quarter of it."""
    from engine.machine.planner import AUTO_KV_SHARE
    from engine.settings import MAX_LANES

    pool = plan(simulated((141,), 64), LLAMA_7B, replace(auto_context(), kv_layout="unified"))
    split = plan(simulated((141,), 64), LLAMA_7B, auto_context())
    assert not pool.kv_split and split.kv_split and split.lanes == MAX_LANES
    assert split.n_ctx == pool.n_ctx == 32768 and split.n_gpu_layers == pool.n_gpu_layers
    assert split.uses[0].kv == (MAX_LANES + 1) * pool.uses[0].kv
    assert "each in a KV stream of its own holding the whole 32,768-token context" \
        in split.lanes_why
    four = plan(simulated((141,), 64), LLAMA_7B, replace(auto_context(), parallel=4))
    assert four.kv_split and four.lanes == 4 and four.uses[0].kv == 5 * pool.uses[0].kv

    asked = plan(simulated((24,), 64), LLAMA_7B, replace(auto_context(), kv_layout="split"))
    assert not asked.kv_split and "do not fit: one pool" in asked.lanes_why

    for ctx in (1024, 8192):  # every layer in RAM: the streams within a quarter of it
        cpu = plan(simulated((), 64), LLAMA_7B, Preferences(ctx=ctx, min_ctx=ctx))
        kv = (MAX_LANES + 1) * plan(simulated((), 64), LLAMA_7B, Preferences(
            ctx=ctx, min_ctx=ctx, kv_layout="unified")).uses[-1].kv
        assert cpu.kv_split == (kv <= AUTO_KV_SHARE * cpu.uses[-1].budget)
        assert cpu.kv_split == (ctx == 1024)


def test_the_plans_cpu_memory_line_counts_every_lanes_kv_stream():
    """The Memory page's "CPU memory" line is the plan's own figure for RAM, the lanes'
    seventeen KV streams included, as the status line says (it had shown one stream's)."""
    split = plan(simulated((), 64), LLAMA_7B, Preferences(ctx=1024, min_ctx=1024))
    assert split.kv_split
    cpu = split.uses[-1]
    line = next(r for r in split.reasons if r.startswith("CPU memory"))
    assert line == f"CPU memory: {cpu.total / 2**20:,.0f} of {cpu.budget / 2**20:,.0f} MiB usable"


def test_one_gpu_seen_by_cuda_and_vulkan_is_planned_once_on_cuda():
    """With both GPU modules loaded (the packaged app), an NVIDIA card is CUDA0 and Vulkan0
    with one PCI id: planned once (its 12 GiB are not 24), on the first registered backend
    as llama.cpp picks, and the plan says which and why; another GPU (Vulkan1, its own id)
    and devices whose backend gives no id are kept."""
    from engine.machine.hardware import Device, Hardware, one_backend_per_gpu

    card, igpu = "0000:01:00.0", "0000:00:02.0"
    cuda = Device("CUDA0", "NVIDIA GeForce RTX 3060", "gpu", 12 * GiB, 12 * GiB, gpu_id=card)
    vulkan = Device("Vulkan0", "NVIDIA GeForce RTX 3060", "gpu", 12 * GiB, 12 * GiB, gpu_id=card)
    other = Device("Vulkan1", "Intel(R) UHD Graphics", "igpu", 2 * GiB, 8 * GiB, gpu_id=igpu)
    unknown = [Device(f"Vulkan{i}", "llvmpipe", "gpu", GiB, GiB) for i in (2, 3)]
    cpu = Device("CPU", "CPU", "cpu", 32 * GiB, 32 * GiB)
    kept, left = one_backend_per_gpu((cuda, vulkan, other, *unknown, cpu))
    assert [d.name for d in kept] == ["CUDA0", "Vulkan1", "Vulkan2", "Vulkan3", "CPU"]
    assert left == ("Vulkan0 is the GPU CUDA0 runs on (0000:01:00.0, NVIDIA GeForce RTX "
                    "3060): planned on CUDA0 only, the first backend llama.cpp registered "
                    "for it",)
    hardware = Hardware((cuda, cpu), 32 * GiB, 32 * GiB, 8, same_gpu=left,
                        gpu_backends=("CUDA", "Vulkan"))
    result = plan(hardware, LLAMA_7B, Preferences(ctx=4096))
    assert {u.device for u in result.uses} == {"CUDA0", "CPU"} and result.n_gpu_layers > 0
    assert left[0] in result.reasons
    assert not hardware.no_gpu_driver and hardware.cpu_only_why() is None


def test_a_gpu_build_that_finds_no_gpu_says_the_driver_is_missing():
    from engine.machine.hardware import Hardware, simulated

    cpu_only = simulated((), 16)
    built = Hardware(cpu_only.devices, GiB, GiB, 2, gpu_backends=("CUDA", "Vulkan"))
    assert built.no_gpu_driver and "no GPU driver found" in built.cpu_only_why()
    assert not cpu_only.no_gpu_driver  # a CPU build: nothing to say about drivers
    assert cpu_only.cpu_only_why() == "runs on the CPU: this llama.cpp build has no GPU backend"
