"""Mixture-of-experts models on shapes no one can download here: header-only GGUFs with
the real metadata and tensor infos (fixtures/shapes.py), read by the catalog and planned for
simulated machines. Every plan is checked against the bytes rule (recomputed here from
the shape, independently of the planner) and against the placements users report."""

import os

import pytest

from fixtures.shapes import SHAPES, write_header_only
from engine.catalog.gguf_file import GGUFInspector, open_gguf
from engine.machine.forecast import forecast
from engine.machine.hardware import simulated
from engine.machine.memory import place
from engine.machine.planner import Preferences, plan

GiB = 1 << 30
REAL = ["gpt-oss-120b", "qwen3-30b-a3b", "qwen3-235b-a22b", "glm-4.5-air", "llama-3.3-70b",
        "qwen3-8b", "qwen3-1.7b", "llama-3.2-3b"]
TINY = [name for name in SHAPES if name.endswith("-tiny")]
MACHINES = {
    "24G GPU + 64G": simulated((24,), 64, cores=8, gpu_bandwidth_gbs=936, ram_bandwidth_gbs=60,
                               gpu_tflops=71),
    "8G GPU + 64G": simulated((8,), 64, cores=8, gpu_bandwidth_gbs=448, ram_bandwidth_gbs=80,
                              gpu_tflops=40),
    "Mac 16G unified": simulated((12,), 16, cores=8, unified=True, gpu_bandwidth_gbs=120,
                                 ram_bandwidth_gbs=120, gpu_tflops=8),
    "CPU only 64G": simulated((), 64, cores=8, ram_bandwidth_gbs=60),
    "2x24G GPU + 128G": simulated((24, 24), 128, cores=16, gpu_bandwidth_gbs=936,
                                  ram_bandwidth_gbs=80, gpu_tflops=71),
}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("shapes")
    return {name: write_header_only(spec, folder / f"{name}.gguf") for name, spec in SHAPES.items()}


@pytest.fixture(scope="module")
def shapes(files):
    inspector = GGUFInspector()
    return {name: inspector.inspect(path).shape for name, path in files.items()}


@pytest.mark.parametrize("name", REAL + TINY)
def test_the_file_knows_its_experts(files, shapes, name):

    spec, shape = SHAPES[name], shapes[name]
    assert (shape.n_expert, shape.n_expert_used) == (spec.n_expert, spec.n_expert_used)
    routed = [0] * shape.n_layers
    for tensor in open_gguf(files[name]).tensors:
        parts = tensor.name.split(".")
        if parts[0] == "blk" and parts[2].endswith("_exps"):
            routed[int(parts[1])] += int(tensor.n_bytes)
    assert list(shape.expert_bytes) == routed
    moe_layers = [i for i in range(shape.n_layers) if spec.is_moe_layer(i)]
    assert [i for i, b in enumerate(shape.expert_bytes) if b] == moe_layers
    assert shape.dense_leading_layers == (moe_layers[0] if moe_layers else shape.n_layers)
    assert (shape.shared_expert_bytes > 0) == bool(spec.n_ff_shexp)
    assert shape.is_moe == bool(spec.n_expert)


@pytest.mark.parametrize("name", REAL)
def test_header_only_files_have_the_real_size_and_use_no_disk(files, shapes, name):
    stat = os.stat(files[name])
    assert abs(stat.st_size / (SHAPES[name].published_gb * 1e9) - 1) < 0.05
    assert stat.st_blocks * 512 < 1 << 20  # the data region is a hole
    assert abs(shapes[name].weights_bytes / stat.st_size - 1) < 0.01


def _gpu_weights(shape, placement) -> int:
    """What the GPUs hold by llama.cpp's rule, recomputed: the output matrix and every
    layer there, less the routed experts of layers below the expert count."""
    layout = placement.layout
    total = 0 if layout.output_device == "CPU" else (shape.output_bytes or shape.embd_bytes)
    for i, device in enumerate(layout.layer_devices):
        if device != "CPU":
            total += shape.layer_bytes[i] - (shape.experts(i) if i < layout.cpu_moe else 0)
    return total


# (model, machine, fits, every layer on the GPUs, routed experts in RAM: (low, high))
USERS_REPORT = [
    ("gpt-oss-120b", "24G GPU + 64G", True, True, (24, 28)),   # experts of 24-28 layers
    ("gpt-oss-120b", "8G GPU + 64G", True, True, (30, 36)),    # --n-cpu-moe 36 at 32k
    ("gpt-oss-120b", "2x24G GPU + 128G", True, True, (1, 20)),
    ("gpt-oss-120b", "CPU only 64G", False, False, (0, 0)),   # 65 GB of weights
    ("qwen3-30b-a3b", "24G GPU + 64G", True, True, (0, 0)),   # 18.6 GB: all on the GPU
    ("qwen3-30b-a3b", "8G GPU + 64G", True, True, (20, 47)),
    ("qwen3-30b-a3b", "CPU only 64G", True, False, (0, 0)),
    ("qwen3-235b-a22b", "24G GPU + 64G", False, False, (0, 0)),  # 142 GB
    ("qwen3-235b-a22b", "2x24G GPU + 128G", True, True, (50, 80)),
    ("glm-4.5-air", "24G GPU + 64G", True, True, (25, 45)),
    ("llama-3.3-70b", "24G GPU + 64G", True, False, (0, 0)),   # dense: a layer split
    ("llama-3.3-70b", "2x24G GPU + 128G", True, True, (0, 0)),
    ("qwen3-8b", "8G GPU + 64G", True, True, (0, 0)),
    ("qwen3-8b", "Mac 16G unified", True, True, (0, 0)),
    ("qwen3-30b-a3b", "Mac 16G unified", False, False, (0, 0)),
]


@pytest.mark.parametrize("name, machine, fits, all_layers, experts", USERS_REPORT)
def test_plans_follow_the_bytes_rule_and_what_users_report(shapes, name, machine, fits,
                                                           all_layers, experts):
    shape, hardware = shapes[name], MACHINES[machine]
    chosen = plan(hardware, shape, Preferences(ctx=4096))
    print(f"\n{name} on {machine}: " + "; ".join(chosen.reasons))
    assert chosen.fits == fits
    if not fits:
        return
    assert (chosen.n_gpu_layers == shape.n_layers + 1) == all_layers
    assert experts[0] <= chosen.cpu_moe_layers <= experts[1]
    for use in chosen.uses:
        assert use.total <= use.budget, use
    placement = place(shape, hardware, chosen.n_ctx, chosen.kv_type, Preferences(ctx=4096),
                      chosen.cpu_moe_layers)
    assert sum(u.weights for u in chosen.uses if u.device != "CPU") == \
        _gpu_weights(shape, placement)
    assert chosen.forecast.decode_tps > 0 and chosen.forecast.prompt_tps > 0
    if chosen.cpu_moe_layers:
        assert any(r.startswith("routed experts of") and "in RAM" in r for r in chosen.reasons)


def test_experts_in_ram_beat_whole_layers_where_they_are_chosen(shapes):
    """gpt-oss-120b on a 24 GiB GPU: the plan's forecast against the whole-layer split at
    the same memory (the forecast the plan's reasons quote)."""
    shape, hardware = shapes["gpt-oss-120b"], MACHINES["24G GPU + 64G"]
    chosen = plan(hardware, shape, Preferences(ctx=4096))
    layers = place(shape, hardware, chosen.n_ctx, chosen.kv_type, Preferences(ctx=4096))
    split = forecast(shape, layers.layout, hardware, chosen.n_ctx)
    assert layers.fits() and chosen.forecast.decode_tps > 1.5 * split.decode_tps
    assert any(r.startswith("whole layers on the GPU instead") for r in chosen.reasons)


def test_the_forecast_is_near_what_users_measured(shapes):
    """gpt-oss-120b with the experts of all 36 layers in RAM, 8 GB of VRAM and DDR5
    (80 GB/s): reported 25.6 tok/s generating (llama.cpp discussion of --n-cpu-moe)."""
    shape, hardware = shapes["gpt-oss-120b"], MACHINES["8G GPU + 64G"]
    chosen = plan(hardware, shape, Preferences(ctx=4096, cpu_moe_layers=36))
    assert 25.6 / 2 < chosen.forecast.decode_tps < 25.6 * 2


def test_the_user_chooses_the_experts_in_ram_and_the_forecast_moves(shapes):
    shape, hardware = shapes["qwen3-30b-a3b"], MACHINES["24G GPU + 64G"]
    speeds = []
    for n in (0, 12, 24, 48):
        chosen = plan(hardware, shape, Preferences(ctx=4096, cpu_moe_layers=n))
        assert chosen.fits and chosen.cpu_moe_layers == n
        assert n == 0 or any("as chosen" in r for r in chosen.reasons)
        speeds.append(chosen.forecast.decode_tps)
    assert speeds == sorted(speeds, reverse=True) and speeds[0] > speeds[-1]


def test_a_calibrated_forecast_says_so_and_moves(shapes):
    shape, hardware = shapes["qwen3-8b"], MACHINES["CPU only 64G"]
    prior = plan(hardware, shape, Preferences(ctx=4096)).forecast
    calibrated = plan(hardware, shape, Preferences(
        ctx=4096, speed_calibration=(("decode/cpu/dense", 0.5),))).forecast
    assert calibrated.calibrated and not prior.calibrated
    assert abs(calibrated.decode_tps / prior.decode_tps - 0.5) < 1e-6


def test_the_wizard_verdicts_name_the_experts_in_ram_and_a_speed(shapes):
    """Qwen3-30B-A3B's quants on an 8 GiB GPU: each verdict says where the experts go and
    about how fast it runs; the recommended one the best that is not much slower."""
    from engine.hub.repos import QuantFiles, judge

    base = shapes["qwen3-30b-a3b"]
    sizes = {"Q8_0": 32.5e9, "Q4_K_M": 18.6e9, "Q2_K": 11.3e9}
    quants = [QuantFiles(name, (f"m-{name}.gguf",), int(size), ("",)) for name, size in sizes.items()]
    verdicts = {v.quant.quant: v for v in judge(MACHINES["8G GPU + 64G"], base, quants)}
    for verdict in verdicts.values():
        print(f"\n{verdict.quant.quant}: {verdict.words}")
        assert "experts of" in verdict.words and "tok/s" in verdict.words
    speeds = [verdicts[q].plan.forecast.decode_tps for q in sizes]
    assert speeds == sorted(speeds)  # fewer bytes to read, faster
    # the best quality that keeps at least MOE_SPEED_SHARE of the fastest speed
    assert [v.quant.quant for v in verdicts.values() if v.recommended] == ["Q4_K_M"]


HOSTS_SHORT_OF_MEMORY = {  # for Qwen3-30B-A3B at Q4_K_M (18.6 GB)
    "CPU only 12G": simulated((), 12, cores=8, ram_bandwidth_gbs=60),
    "4G GPU + 12G": simulated((4,), 12, cores=8, gpu_bandwidth_gbs=224, ram_bandwidth_gbs=60,
                              gpu_tflops=10),
}


@pytest.mark.parametrize("host", HOSTS_SHORT_OF_MEMORY)
def test_routed_experts_go_to_a_worker_with_ram_to_spare(shapes, host):
    from engine.cluster.placement import Machine, _without_experts, experts_on_worker, local_machine

    shape, hardware, prefs = shapes["qwen3-30b-a3b"], HOSTS_SHORT_OF_MEMORY[host], \
        Preferences(ctx=4096, min_ctx=4096)
    assert not plan(hardware, shape, prefs).fits  # alone it cannot
    here = local_machine(hardware, prefs, 60e9)
    desktop = Machine("desktop", (("RPC0", "cpu", 60 * GiB),), 60e9, rtt_s=0.5e-3)
    chosen = experts_on_worker(shape, hardware, here, desktop, 4096, "f16", prefs)
    assert chosen is not None and chosen.plan.fits and chosen.plan.expert_device == "RPC0"
    n = chosen.plan.cpu_moe_layers
    on_worker = next(u for u in chosen.plan.uses if u.device == "RPC0")
    assert on_worker.weights == sum(shape.experts(i) for i in range(n))
    assert all(u.total <= u.budget for u in chosen.plan.uses)
    # the fewest: one layer's experts fewer and the rest no longer fits here
    rest = plan(hardware, _without_experts(shape, n - 1), Preferences(
        ctx=4096, min_ctx=4096, cpu_moe_layers=0, allow_quantized_kv=False))
    assert not rest.fits
    if hardware.gpus:  # the worker is a device of the model, with no layers of its own
        assert chosen.plan.gpus[-1] == "RPC0" and chosen.plan.tensor_split[-1] == 0.0
    assert any(f"{n} round trips" in r for r in chosen.plan.reasons), chosen.plan.reasons
    print(f"\n{host}: experts of {n} layers on the worker, about {chosen.tokens_per_s:.1f} tok/s")


def test_a_model_that_fits_alone_sends_no_experts_away(shapes):
    from engine.cluster.placement import Machine, experts_on_worker, local_machine

    hardware, prefs = MACHINES["CPU only 64G"], Preferences(ctx=4096, min_ctx=4096)
    here = local_machine(hardware, prefs, 60e9)
    desktop = Machine("desktop", (("RPC0", "cpu", 60 * GiB),), 60e9, rtt_s=0.5e-3)
    assert experts_on_worker(shapes["qwen3-30b-a3b"], hardware, here, desktop, 4096, "f16",
                             prefs) is None
    assert experts_on_worker(shapes["qwen3-8b"], MACHINES["CPU only 64G"], here, desktop, 4096,
                             "f16", prefs) is None  # dense: no experts to send
