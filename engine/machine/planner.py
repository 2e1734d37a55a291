"""The memory planner: a pure function from (hardware, model shape, preferences) to a
frozen Plan — GPU layers and their split, context size, KV cache type — with the bytes
predicted on every device and the reasons in words.

The byte model follows what llama.cpp allocates in this engine's contexts:
- weights: the tensors of each layer on the device holding the layer; the token
  embeddings stay on the CPU; the output matrix (a copy of the embeddings when they are
  tied) goes to the GPU with the first offloaded layer, as llama.cpp does; on the CPU
  llama.cpp maps the file span from its first to its last tensor there, gaps included,
  and on x86 with AVX2 also copies 4-bit matrices into a repacked buffer;
- KV cache: n_ctx cells for every layer (sliding-window layers too: the engine's contexts
  keep a full-size window cache so they can be cut back to any prefix), K and V of
  n_head_kv x head_dim each, on the layer's device;
- compute buffer: the graph allocator reuses memory between stages, so the largest
  stage: the logits (the engine's 32 reserved outputs plus one ubatch-wide activation)
  on the device holding the output matrix, and everywhere the layer stage (about
  3 x n_ff + 4 x n_embd floats per ubatch token, plus the f16 attention mask of
  ubatch x n_ctx); fitted on llama.cpp's buffers for SmolLM2 and Gemma 3, on the CPU
  and an RPC device, at 2k and 8k of context;
- output buffer: one row of logits, on the CPU.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..catalog.gguf_file import ModelShape
from ..events import MAX_OUTPUTS
from .hardware import Hardware

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
    gpus: tuple[str, ...]          # in llama.cpp's order, for llama_model_params.devices
    tensor_split: tuple[float, ...]
    n_ctx: int
    kv_type: str
    flash_attn: bool
    uses: tuple[DeviceUse, ...]
    fits: bool
    reasons: tuple[str, ...]

    def as_dict(self) -> dict:
        return {"model": self.model, "n_gpu_layers": self.n_gpu_layers, "gpus": list(self.gpus),
                "tensor_split": list(self.tensor_split), "n_ctx": self.n_ctx,
                "kv_type": self.kv_type, "flash_attn": self.flash_attn, "fits": self.fits,
                "devices": [{"device": u.device, "budget": u.budget, "weights": u.weights,
                             "kv": u.kv, "compute": u.compute, "output": u.output,
                             "total": u.total} for u in self.uses],
                "reasons": list(self.reasons)}


def compute_bytes(shape: ModelShape, n_ctx: int, holds_output: bool) -> int:
    layers = UBATCH * (3 * shape.n_ff + 4 * shape.n_embd) * 4 + UBATCH * n_ctx * 2
    logits = (shape.n_vocab * MAX_OUTPUTS + UBATCH * shape.n_embd) * 4
    return max(logits, layers) if holds_output else layers


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


@dataclass(frozen=True)
class Placement:
    n_gpu_layers: int              # in llama.cpp's count: the output matrix is one
    gpus: tuple[str, ...]          # the GPUs used, in the order llama.cpp gets them
    split: tuple[float, ...]       # their shares of the GPU layers (with several)
    uses: tuple[DeviceUse, ...]    # every GPU, then the CPU


def place(shape: ModelShape, hw: Hardware, n_ctx: int, kv_type: str,
          prefs: Preferences) -> Placement:
    """llama.cpp offloads the output matrix with the first GPU layer, then repeating
    layers from the last one down. The largest GPU takes the output and the last layers,
    the next largest the layers before them (so it comes before it in llama.cpp's device
    list); the rest stay on the CPU. With the user's layer count, that many, shared by
    budget, fitting or not."""
    gpu_budgets, cpu_budget = budgets(hw, prefs)
    kv_layer = int(shape.kv_bytes_per_token(kv_type) * n_ctx)
    order = sorted(range(len(gpu_budgets)), key=lambda i: -gpu_budgets[i][1])
    fills = dict(zip(order, _fill_gpus(shape, [gpu_budgets[i][1] for i in order], kv_layer,
                                       n_ctx, prefs)))
    placed = sum(fill.layers for fill in fills.values())
    uses = [DeviceUse(name, budget, fills[i].weights, fills[i].kv,
                      compute_bytes(shape, n_ctx, i == order[0]) if fills[i].layers else 0)
            for i, (name, budget) in enumerate(gpu_budgets)]
    cpu = _cpu_use(shape, hw, cpu_budget, kv_layer, n_ctx, kv_type, placed, prefs)
    used = [i for i in reversed(order) if fills[i].layers]
    split = tuple(round(fills[i].layers / placed, 4) for i in used) if len(used) > 1 else ()
    return Placement(placed, tuple(gpu_budgets[i][0] for i in used), split, (*uses, cpu))


@dataclass
class _Fill:
    """What one GPU holds so far."""
    layers: int = 0
    weights: int = 0
    kv: int = 0


def _wanted_layers(shape: ModelShape, n_gpus: int, prefs: Preferences) -> tuple[int, bool]:
    """How many layers to offload (the output matrix counts as one), and whether the user
    chose that number (then it is placed whether it fits or not)."""
    if prefs.gpu_layers is not None and n_gpus:
        return min(prefs.gpu_layers, shape.n_layers + 1), True
    return (shape.n_layers + 1 if n_gpus else 0), False


def _fill_gpus(shape: ModelShape, budgets_desc: list[int], kv_layer: int, n_ctx: int,
               prefs: Preferences) -> list[_Fill]:
    """GPUs filled largest first: the output matrix, then repeating layers from the last
    one down, each GPU until its budget is reached (with the user's count: its share)."""
    wanted, forced = _wanted_layers(shape, len(budgets_desc), prefs)
    output = shape.output_bytes or shape.embd_bytes  # tied embeddings: a copy goes there
    total_budget = sum(budgets_desc) or 1
    fills, placed = [], 0
    for n, budget in enumerate(budgets_desc):
        fill = _Fill()
        share = wanted - placed if not forced or n == len(budgets_desc) - 1 else \
            round(wanted * budget / total_budget)
        compute = compute_bytes(shape, n_ctx, holds_output=n == 0)
        while placed < wanted and fill.layers < share:
            layer_kv = kv_layer if placed else 0
            size = shape.layer_bytes[shape.n_layers - placed] if placed else output
            if not forced and compute + fill.weights + fill.kv + size + layer_kv > budget:
                break
            fill.weights += size
            fill.kv += layer_kv
            fill.layers += 1
            placed += 1
        fills.append(fill)
    return fills


def _cpu_use(shape: ModelShape, hw: Hardware, budget: int, kv_layer: int, n_ctx: int,
             kv_type: str, placed: int, prefs: Preferences) -> DeviceUse:
    """What stays in RAM when `placed` layers went to GPUs: the other layers (mapped from
    the file, plus their repacked copies), the token embeddings, the output matrix when
    no GPU took it, a draft model's weights and KV cache."""
    layers = shape.n_layers - max(placed - 1, 0)
    weights = shape.mapped_bytes(layers, not placed)
    if weights is None:
        weights = (sum(shape.layer_bytes[:layers]) + shape.embd_bytes + shape.other_bytes
                   + (0 if placed else shape.output_bytes))
    if hw.cpu_repack:
        weights += sum(shape.layer_repack[:layers]) + (0 if placed else shape.output_repack)
    kv = kv_layer * layers
    if prefs.draft:
        weights += prefs.draft.weights_bytes
        kv += int(prefs.draft.kv_bytes_per_token(kv_type) * n_ctx) * prefs.draft.n_layers
    compute = compute_bytes(shape, n_ctx, not placed) if layers or not placed else 0
    return DeviceUse("CPU", budget, weights, kv, compute, shape.n_vocab * 4)


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
            placement = place(shape, hw, n_ctx, kv_type, prefs)
            if any(u.total > u.budget for u in placement.uses):
                continue
            rank = (n_ctx, kv_type == "f16", placement.n_gpu_layers)
            if best is None or rank > best[0]:
                best = (rank, n_ctx, kv_type, placement)
    if best is None:
        return _no_fit(hw, shape, prefs)
    _, n_ctx, kv_type, placement = best
    return Plan(shape.name, placement.n_gpu_layers, placement.gpus, placement.split, n_ctx,
                kv_type, kv_type != "f16", placement.uses, True,
                _reasons(shape, hw, prefs, n_ctx, kv_type, placement))


def _reasons(shape, hw, prefs, n_ctx, kv_type, placement: Placement) -> tuple[str, ...]:
    reasons = []
    n_gpu = max(placement.n_gpu_layers - 1, 0)  # repeating layers
    cpu = placement.uses[-1]
    if not hw.gpus:
        reasons.append("no GPU: every layer runs on the CPU")
    elif prefs.gpu_layers is not None:
        reasons.append(f"the output and {n_gpu} of {shape.n_layers} layers on the GPU, as chosen"
                       if placement.n_gpu_layers else "no layers on the GPU, as chosen")
    elif n_gpu == shape.n_layers:
        reasons.append(f"all {shape.n_layers} layers and the output fit on the GPU"
                       + ("s" if len(placement.gpus) > 1 else ""))
    elif placement.n_gpu_layers == 0:
        reasons.append("not even the output layer fits on the GPU: every layer runs on the CPU")
    else:
        reasons.append(f"the output and {n_gpu} of {shape.n_layers} layers fit on the GPU; the other "
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
    placement = place(shape, hw, n_ctx, "q8_0", prefs)
    short = [f"{(u.total - u.budget) / MiB:,.0f} MiB more on {u.device}"
             for u in placement.uses if u.total > u.budget]
    return Plan(shape.name, placement.n_gpu_layers, placement.gpus, placement.split, n_ctx,
                "q8_0", True, placement.uses, False,
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


def place_draft(main: Plan, draft: ModelShape, n_ctx: int) -> tuple[str, int]:
    """Where a speculative-decoding draft model runs: on the GPU the main model left the
    most room on, when the whole draft (weights, KV cache, compute) fits there — it is the
    fastest place — else on the CPU. Returns the device and llama.cpp's n_gpu_layers."""
    need = (draft.weights_bytes + int(draft.kv_bytes_per_token("f16") * n_ctx) * draft.n_layers
            + compute_bytes(draft, n_ctx, holds_output=True))
    room = max(((u.budget - u.total, u.device) for u in main.uses if u.device != "CPU"),
               default=None)
    if room is not None and room[0] >= need:
        return room[1], draft.n_layers + 1
    return "CPU", 0


def choose_quant(hw: Hardware, base: ModelShape, candidates: list[tuple[str, int]],
                 prefs: Preferences = Preferences()) -> tuple[str, Plan] | None:
    """Among quant files (name, size) of one model, the largest (best quality) that runs
    with all layers on the GPU, else the one keeping the most GPU layers, at full context
    when possible; None when none fits. Unquantized files (F32/F16/BF16) come last
    unless wholly on a GPU: elsewhere they run at a fraction of Q8_0's speed for a
    quality difference nobody measures."""
    ranked = []
    for name, size in candidates:
        p = plan(hw, base.scaled(name, size), prefs)
        if p.fits:
            full_gpu = p.n_gpu_layers == base.n_layers + 1
            quantized = name.upper().removeprefix("UD-") not in ("F32", "F16", "BF16")
            ranked.append(((p.n_gpu_layers, p.n_ctx, quantized or full_gpu, size), name, p))
    return max(ranked)[1:] if ranked else None
