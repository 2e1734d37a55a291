"""How fast a placement will run, before it is loaded: a pure function of the model's
shape, where each tensor goes and how fast each device reads and computes.

- Generation is bound by memory: each token reads, on every device, the non-expert
  weights of the layers there, the top-k/n share of the routed experts there, the KV
  cache of those layers (at FILL_TOKENS of context) and the output matrix, at the
  device's bandwidth times what llama.cpp achieves of it (EFFICIENCY); each change of
  device along a token's path adds a hop (HOP_S), each layer on a GPU its kernel
  launches (GPU_LAYER_S).
- The prompt is bound by compute: 2 FLOPs per active weight per token on the device doing
  the matrix products. With a GPU present llama.cpp computes prompt batches there even for
  weights held in RAM (op offload), copying them over PCIe once per 512-token batch.
- Measured rates correct later forecasts (`calibration`: measured/forecast per phase,
  device kind and model kind, from calibration.py)."""

from __future__ import annotations

from dataclasses import dataclass

from ..catalog.shape import ModelShape
from .bandwidth import UNKNOWN_GPU
from .hardware import Hardware
from .memory import UBATCH, Layout

FILL_TOKENS = 2048          # context assumed filled when decoding
PCIE_BYTES_PER_S = 25e9     # PCIe 4.0 x16, as measured by users copying weights
HOP_S = 30e-6               # one activation row between devices, each way
# A GPU's kernel launches per layer and token: what keeps a 3 GB-a-token MoE on an RTX
# 3090 near the reported 110-140 tok/s instead of the 300 its bandwidth alone gives.
GPU_LAYER_S = 70e-6
# Tensor parallelism's two reductions a layer between GPUs over PCIe (a guess from
# published 2-GPU figures, +50-70% decode over whole layers per GPU; unmeasured here).
TENSOR_REDUCE_S = 40e-6
# What llama.cpp's decode reaches of a device's bandwidth (CPU: measured on the random
# Qwen3-MoE here; GPU: llama-bench tg on published cards against their bandwidth).
EFFICIENCY = {"cpu": 0.5, "gpu": 0.7}
RAM_PRIOR = 40e9            # bytes/s, a dual-channel DDR4 desktop, when not measured
CPU_FLOPS_PER_CORE = 40e9   # quantized matrix products per core, AVX2 (calibrated later)


@dataclass(frozen=True)
class Forecast:
    decode_tps: float
    prompt_tps: float
    key: str = ""               # "gpu/moe": the device and model kind it is calibrated by
    prior_decode_tps: float = 0.0  # before calibration
    prior_prompt_tps: float = 0.0
    image_s: float | None = None  # a 1024x768 picture through the vision tower (None: none)

    @property
    def calibrated(self) -> bool:
        return (self.decode_tps, self.prompt_tps) != (self.prior_decode_tps, self.prior_prompt_tps)

    def as_dict(self) -> dict:
        return {"decode_tokens_per_s": round(self.decode_tps, 1),
                "prompt_tokens_per_s": round(self.prompt_tps, 1), "calibrated": self.calibrated,
                "uncalibrated_decode_tokens_per_s": round(self.prior_decode_tps, 1),
                "uncalibrated_prompt_tokens_per_s": round(self.prior_prompt_tps, 1),
                **({"image_encode_s": round(self.image_s, 2)} if self.image_s else {})}


Speeds = dict[str, tuple[str, float, float]]


def speeds_of(hw: Hardware) -> Speeds:
    """Device name -> (kind, effective bytes/s, FLOP/s)."""
    ram = hw.ram_bandwidth or RAM_PRIOR
    out = {"CPU": ("cpu", ram * EFFICIENCY["cpu"], hw.cpu_cores * CPU_FLOPS_PER_CORE)}
    for device in hw.devices:
        if device.kind in ("gpu", "igpu"):
            if device.bandwidth:
                out[device.name] = ("gpu", device.bandwidth * EFFICIENCY["gpu"],
                                    device.flops or UNKNOWN_GPU[1])
            else:  # a remote worker or an unknown device: as fast as this RAM
                out[device.name] = ("cpu", out["CPU"][1], out["CPU"][2])
    return out


def _speed(speeds: Speeds, device: str) -> tuple[str, float, float]:
    return speeds.get(device, speeds["CPU"])


def model_kind(shape: ModelShape) -> str:
    return "moe" if shape.is_moe else "dense"


def _main_kind(layout: Layout, speeds: Speeds) -> str:
    """The kind of device that computes most: a GPU whenever one holds anything."""
    used = set(layout.layer_devices) | {layout.output_device}
    return "gpu" if any(_speed(speeds, d)[0] == "gpu" for d in used) else "cpu"


def _tensor_parallel_seconds(shape: ModelShape, layout: Layout, speeds: Speeds,
                             kv: float) -> float:
    """Every GPU reads its share of every layer at once, then they reduce."""
    reads = shape.weights_read_per_token() + kv * shape.n_layers
    slowest = max(share * reads / _speed(speeds, gpu)[1] for gpu, share in layout.tensor_shares)
    return slowest + 2 * HOP_S + shape.n_layers * (GPU_LAYER_S + TENSOR_REDUCE_S)


def _decode_seconds(shape: ModelShape, layout: Layout, speeds: Speeds, n_ctx: int) -> float:
    # A quantized KV cache saves memory, not time: dequantizing it costs what it saves.
    kv = shape.kv_bytes_per_token("f16") * min(n_ctx, FILL_TOKENS)
    if layout.tensor_shares:
        return _tensor_parallel_seconds(shape, layout, speeds, kv)
    reads: dict[str, float] = {}
    path = ["CPU"]  # the token embedding is looked up on the CPU
    for i, device in enumerate(layout.layer_devices):
        rest, experts = shape.read_per_token(i)
        reads[device] = reads.get(device, 0.0) + rest + kv
        expert_device = layout.expert_device(i)
        reads[expert_device] = reads.get(expert_device, 0.0) + experts
        path += [device, expert_device] if experts else [device]
    output = shape.output_bytes or shape.embd_bytes
    reads[layout.output_device] = reads.get(layout.output_device, 0.0) + output
    path.append(layout.output_device)
    hops = sum(a != b for a, b in zip(path, path[1:]))
    on_gpus = sum(_speed(speeds, d)[0] == "gpu" for d in layout.layer_devices)
    streaming = sum(read / _speed(speeds, d)[1] for d, read in reads.items())
    return streaming + hops * HOP_S + on_gpus * GPU_LAYER_S


def _prompt_seconds(shape: ModelShape, layout: Layout, speeds: Speeds) -> float:
    """Per prompt token."""
    params = shape.n_params or shape.weights_bytes * 2  # ~4 bits a weight when unknown
    active = params - shape.expert_params * (1 - shape.active_fraction)
    gpus = [_speed(speeds, d) for d in set(layout.layer_devices)
            if _speed(speeds, d)[0] == "gpu"]
    if not gpus:
        return 2 * active / speeds["CPU"][2]
    in_ram = sum(shape.layer_bytes[i] for i, d in enumerate(layout.layer_devices) if d == "CPU")
    in_ram += sum(shape.experts(i) for i in range(min(layout.cpu_moe, shape.n_layers))
                  if layout.layer_devices[i] != "CPU")
    flops = sum(g[2] for g in gpus) / len(gpus)
    return 2 * active / flops + in_ram / PCIE_BYTES_PER_S / UBATCH


def forecast(shape: ModelShape, layout: Layout, hw: Hardware, n_ctx: int,
             calibration: tuple[tuple[str, float], ...] = ()) -> Forecast:
    """Tokens a second for generation and for the prompt, corrected by the measured
    ratios for this device and model kind when there are any."""
    speeds, ratios = speeds_of(hw), dict(calibration)
    key = f"{_main_kind(layout, speeds)}/{model_kind(shape)}"
    decode = 1 / _decode_seconds(shape, layout, speeds, n_ctx)
    prompt = 1 / _prompt_seconds(shape, layout, speeds)
    return Forecast(decode * ratios.get(f"decode/{key}", 1.0),
                    prompt * ratios.get(f"prompt/{key}", 1.0), key, decode, prompt)


def image_seconds(hw: Hardware, device: str, flops: float) -> float:
    """A picture's pass through the vision tower on `device`: its FLOPs at the device's
    rate (a tower is compute-bound, as a prompt is)."""
    speeds = speeds_of(hw)
    return flops / speeds.get(device, speeds["CPU"])[2]
