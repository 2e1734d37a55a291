"""The memory planner: a pure function from (hardware, model shape, preferences) to a
frozen Plan — GPU layers and their split, context size, KV cache type — with the bytes
predicted on every device and the reasons in words.

The byte model follows what llama.cpp allocates in this engine's contexts:
- weights: the tensors of each layer on the device holding the layer; the token
  embeddings stay on the CPU; the output matrix (a copy of the embeddings when they are
  tied) goes to the GPU once every layer is there;
- KV cache: n_ctx cells for every layer (sliding-window layers too: the engine's contexts
  keep a full-size window cache so they can be cut back to any prefix), K and V of
  n_head_kv x head_dim each, on the layer's device;
- compute buffer: the larger of the logits stage (the engine's 32 reserved outputs plus
  one ubatch-wide activation) and the feed-forward stage (about 4 x n_ff + 5 x n_embd
  floats per ubatch token) — the graph allocator reuses memory between stages; fitted
  on llama.cpp's measured buffers (SmolLM2: 17.5 MiB, Gemma 3: 33.3 MiB) — on every
  device that computes;
- output buffer: one row of logits, on the CPU.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .gguf_file import ModelShape
from .hardware import Hardware
from .llama_runtime import MAX_OUTPUTS

UBATCH = 512
MiB = 1 << 20


@dataclass(frozen=True)
class Preferences:
    ctx: int = 4096
    min_ctx: int = 2048
    margin: float = 0.08            # of each device's free memory, left unused
    allow_quantized_kv: bool = True
    draft: ModelShape | None = None  # counted on the CPU with its own KV
    calibration: tuple[tuple[str, float], ...] = ()  # (device kind, measured/predicted)
    caps: tuple[tuple[str, int], ...] = ()  # (device name, bytes): learnt from failed loads
    gpu_layers: int | None = None   # the user's choice; None: as many as fit


@dataclass(frozen=True)
class DeviceUse:
    device: str
    budget: int
    weights: int = 0
    kv: int = 0
    compute: int = 0
    output: int = 0

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.compute + self.output


@dataclass(frozen=True)
class Plan:
    model: str
    n_gpu_layers: int
    tensor_split: tuple[float, ...]
    n_ctx: int
    kv_type: str
    flash_attn: bool
    uses: tuple[DeviceUse, ...]
    fits: bool
    reasons: tuple[str, ...]

    def as_dict(self) -> dict:
        return {"model": self.model, "n_gpu_layers": self.n_gpu_layers,
                "tensor_split": list(self.tensor_split), "n_ctx": self.n_ctx,
                "kv_type": self.kv_type, "flash_attn": self.flash_attn, "fits": self.fits,
                "devices": [{"device": u.device, "budget": u.budget, "weights": u.weights,
                             "kv": u.kv, "compute": u.compute, "output": u.output,
                             "total": u.total} for u in self.uses],
                "reasons": list(self.reasons)}


def compute_bytes(shape: ModelShape) -> int:
    logits = (shape.n_vocab * MAX_OUTPUTS + UBATCH * shape.n_embd) * 4
    feed_forward = UBATCH * (4 * shape.n_ff + 5 * shape.n_embd) * 4
    return max(logits, feed_forward)


def budgets(hw: Hardware, prefs: Preferences) -> tuple[list[tuple[str, int]], int]:
    """Usable bytes per GPU, and on the CPU; where past loads measured more than was
    predicted (calibration), the budget shrinks by that ratio."""
    ratio, caps = dict(prefs.calibration), dict(prefs.caps)
    margin = prefs.margin

    def usable(name: str, kind: str, free: int) -> int:
        budget = int(free * (1 - margin) / max(ratio.get(kind, 1.0), 1.0))
        return min(budget, caps.get(name, budget))

    gpus = [(g.name, usable(g.name, g.kind, g.free_bytes)) for g in hw.gpus]
    cpu = usable("CPU", "cpu", hw.ram_available_bytes)
    if hw.unified_memory:  # the GPU draws on the same RAM
        cpu -= sum(b for _, b in gpus)
    return gpus, cpu


def place(shape: ModelShape, hw: Hardware, n_ctx: int, kv_type: str,
          prefs: Preferences) -> tuple[int, list[int], list[DeviceUse], DeviceUse]:
    """Fill the GPUs layer by layer (largest budget first), the rest on the CPU; with
    the user's layer count, that many in proportion to the budgets, fitting or not."""
    gpu_budgets, cpu_budget = budgets(hw, prefs)
    kv_layer = int(shape.kv_bytes_per_token(kv_type) * n_ctx)
    compute = compute_bytes(shape)
    per_gpu = [0] * len(gpu_budgets)
    layer = 0
    order = sorted(range(len(gpu_budgets)), key=lambda i: -gpu_budgets[i][1])
    wanted = shape.n_layers if prefs.gpu_layers is None else \
        max(0, min(prefs.gpu_layers, shape.n_layers)) if gpu_budgets else 0
    total_budget = sum(b for _, b in gpu_budgets) or 1
    for n, i in enumerate(order):
        used = compute
        share = wanted if prefs.gpu_layers is None or n == len(order) - 1 else \
            round(wanted * gpu_budgets[i][1] / total_budget)
        while layer < wanted and per_gpu[i] < share and (
                prefs.gpu_layers is not None
                or used + shape.layer_bytes[layer] + kv_layer <= gpu_budgets[i][1]):
            used += shape.layer_bytes[layer] + kv_layer
            per_gpu[i] += 1
            layer += 1
    n_gpu = sum(per_gpu)
    output_on_gpu = n_gpu == shape.n_layers and gpu_budgets
    uses = []
    for i, (name, budget) in enumerate(gpu_budgets):
        if not per_gpu[i]:
            uses.append(DeviceUse(name, budget))
            continue
        first = sum(per_gpu[j] for j in order[:order.index(i)])
        weights = sum(shape.layer_bytes[first:first + per_gpu[i]])
        if output_on_gpu and i == order[-1 if per_gpu[order[-1]] else 0]:
            weights += shape.output_bytes or shape.embd_bytes  # tied: a copy goes there
        uses.append(DeviceUse(name, budget, weights, kv_layer * per_gpu[i], compute))
    cpu_layers = shape.n_layers - n_gpu
    cpu_weights = (sum(shape.layer_bytes[n_gpu:]) + shape.embd_bytes + shape.other_bytes
                   + (0 if output_on_gpu else shape.output_bytes))
    cpu_kv = kv_layer * cpu_layers
    if prefs.draft:
        cpu_weights += prefs.draft.weights_bytes
        cpu_kv += int(prefs.draft.kv_bytes_per_token(kv_type) * n_ctx) * prefs.draft.n_layers
    cpu = DeviceUse("CPU", cpu_budget, cpu_weights, cpu_kv,
                    compute if cpu_layers or not gpu_budgets else 0, shape.n_vocab * 4)
    return n_gpu, per_gpu, uses, cpu


def _contexts(prefs: Preferences, shape: ModelShape) -> list[int]:
    wanted = min(prefs.ctx, shape.context_length or prefs.ctx)
    floor = min(prefs.min_ctx, wanted)
    sizes, n = [], wanted
    while n >= floor:
        sizes.append(n)
        n = (n // 2) // 256 * 256 if n > 512 else n // 2
    return sizes or [wanted]


def plan(hw: Hardware, shape: ModelShape, prefs: Preferences = Preferences()) -> Plan:
    """The largest context up to the wanted one (not below the floor), with the f16 KV
    cache unless only q8_0 makes that context fit, then the most layers on GPUs;
    everything predicted to fit under each device's budget."""
    kv_types = ["f16", "q8_0"] if prefs.allow_quantized_kv else ["f16"]
    best = None
    for n_ctx in _contexts(prefs, shape):
        for kv_type in kv_types:
            n_gpu, per_gpu, uses, cpu = place(shape, hw, n_ctx, kv_type, prefs)
            if any(u.total > u.budget for u in (*uses, cpu)):
                continue
            rank = (n_ctx, kv_type == "f16", n_gpu)
            if best is None or rank > best[0]:
                best = (rank, n_ctx, kv_type, n_gpu, per_gpu, uses, cpu)
    if best is None:
        return _no_fit(hw, shape, prefs)
    _, n_ctx, kv_type, n_gpu, per_gpu, uses, cpu = best
    split = tuple(round(c / n_gpu, 4) for c in per_gpu) if n_gpu and len(per_gpu) > 1 else ()
    return Plan(shape.name, n_gpu + (1 if n_gpu == shape.n_layers and n_gpu else 0), split,
                n_ctx, kv_type, kv_type != "f16", (*uses, cpu), True,
                _reasons(shape, hw, prefs, n_ctx, kv_type, n_gpu, cpu))


def _reasons(shape, hw, prefs, n_ctx, kv_type, n_gpu, cpu) -> tuple[str, ...]:
    reasons = []
    if not hw.gpus:
        reasons.append("no GPU: every layer runs on the CPU")
    elif prefs.gpu_layers is not None:
        reasons.append(f"{n_gpu} of {shape.n_layers} layers on the GPU, as chosen")
    elif n_gpu == shape.n_layers:
        reasons.append(f"all {shape.n_layers} layers and the output fit on the GPU"
                       + ("s" if len(hw.gpus) > 1 else ""))
    else:
        reasons.append(f"{n_gpu} of {shape.n_layers} layers fit on the GPU; the other "
                       f"{shape.n_layers - n_gpu} run on the CPU")
    wanted = min(prefs.ctx, shape.context_length or prefs.ctx)
    if n_ctx < wanted:
        reasons.append(f"context reduced from {wanted} to {n_ctx} tokens to fit")
    if kv_type != "f16":
        reasons.append("KV cache quantized to q8_0 (with flash attention) to keep the context")
    for device, cap in prefs.caps:
        reasons.append(f"{device} held to {cap / MiB:,.0f} MiB: a load asking for more "
                       "ran out of memory there")
    if prefs.draft:
        reasons.append(f"includes the draft model {prefs.draft.name} and its KV cache on the CPU")
    reasons.append(f"CPU memory: {cpu.total / MiB:,.0f} of {cpu.budget / MiB:,.0f} MiB usable")
    return tuple(reasons)


def _no_fit(hw: Hardware, shape: ModelShape, prefs: Preferences) -> Plan:
    n_ctx = min(prefs.min_ctx, shape.context_length or prefs.min_ctx)
    n_gpu, _, uses, cpu = place(shape, hw, n_ctx, "q8_0", prefs)
    short = [f"{(u.total - u.budget) / MiB:,.0f} MiB more on {u.device}"
             for u in (*uses, cpu) if u.total > u.budget]
    return Plan(shape.name, n_gpu, (), n_ctx, "q8_0", True, (*uses, cpu), False,
                (f"does not fit: even with {n_ctx} tokens of context and a q8_0 KV cache it "
                 f"needs {' and '.join(short)} than this machine can give",))


def back_off(prefs: Preferences, used: dict[str, int], device: str | None) -> Preferences:
    """The preferences for a retry after a load that planned `used` bytes per device ran
    out of memory on `device` (None: unknown): that device gets 3/4 of what the plan put
    there, so the next plan keeps fewer layers there, less context or a quantized KV."""
    caps = dict(prefs.caps)
    for name, size in used.items():
        if device in (None, name):
            caps[name] = int(size * 0.75)
    return replace(prefs, caps=tuple(sorted(caps.items())), gpu_layers=None,
                   min_ctx=min(prefs.min_ctx, 512))


def choose_quant(hw: Hardware, base: ModelShape, candidates: list[tuple[str, int]],
                 prefs: Preferences = Preferences()) -> tuple[str, Plan] | None:
    """Among quant files (name, size) of one model, the largest (best quality) that runs
    with all layers on the GPU, else the one keeping the most GPU layers, at full context
    when possible; None when none fits."""
    ranked = []
    for name, size in candidates:
        p = plan(hw, base.scaled(name, size), prefs)
        if p.fits:
            ranked.append(((p.n_gpu_layers, p.n_ctx, size), name, p))
    return max(ranked)[1:] if ranked else None
