"""The bytes a placement puts on every device: `place` (pure), with the user's
preferences and the budgets they leave. The planner (planner.py) compares placements.

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
- output buffer: one row of logits, on the CPU;
- mixture of experts: the routed experts of the first N layers stay in RAM wherever
  their layer runs (llama.cpp's --n-cpu-moe N, a tensor buffer override), mapped from the
  file like the CPU's layers.
"""


from __future__ import annotations

from dataclasses import dataclass, replace

from ..catalog.shape import ModelShape
from ..events import MAX_OUTPUTS
from .hardware import Hardware

UBATCH = 512
MiB = 1 << 20


@dataclass(frozen=True)
class Layout:
    """Where a placement put each piece: the device of every layer, of the output
    matrix, and how many leading layers keep their routed experts in RAM; with tensor
    parallelism, the GPUs' shares of every layer (the first GPU stands as each layer's
    device)."""
    layer_devices: tuple[str, ...]
    output_device: str
    cpu_moe: int = 0
    tensor_shares: tuple[tuple[str, float], ...] = ()

    def expert_device(self, layer: int) -> str:
        return "CPU" if layer < self.cpu_moe else self.layer_devices[layer]


@dataclass(frozen=True)
class Preferences:
    ctx: int = 4096
    min_ctx: int = 2048
    kv_layout: str = "auto"         # "split", "unified", or auto (planner._lanes)
    # ctx is a cap, not a wish (no context was asked): the planner takes the largest
    # context up to it that costs little speed and memory (planner.AUTO_* below)
    auto_ctx: bool = False
    margin: float = 0.08            # of each device's free memory, left unused
    allow_quantized_kv: bool = True
    draft: ModelShape | None = None  # counted on the CPU with its own KV
    calibration: tuple[tuple[str, float], ...] = ()  # (device kind, measured/predicted)
    caps: tuple[tuple[str, int], ...] = ()  # (device name, bytes): learnt from failed loads
    gpu_layers: int | None = None   # the user's choice; None: as many as fit
    # Leading layers whose routed experts stay in RAM (llama.cpp's --n-cpu-moe), the
    # user's choice; None: the planner picks by forecast speed.
    cpu_moe_layers: int | None = None
    speed_calibration: tuple[tuple[str, float], ...] = ()  # (phase/device/model, ratio)
    projector_bytes: int = 0        # a vision projector's weights and compute buffer
    image_flops: float = 0.0        # its work for a 1024x768 picture (the forecast's encode time)
    tensor_parallel: bool = False   # may split every layer across GPUs: llama.cpp's experimental
                                    # mode, unmeasured here, so only when asked (--split-mode tensor)
    parallel: int | None = None     # requests at once, the user's choice; None: the plan's lanes


@dataclass(frozen=True)
class DeviceUse:
    device: str
    budget: int
    weights: int = 0
    kv: int = 0
    compute: int = 0
    output: int = 0
    # File pages llama.cpp maps on the CPU between its tensors there (those of tensors
    # another device holds): in its buffer size, read once at load, then reclaimable
    # page cache, so not counted against the budget.
    mapped_gaps: int = 0
    projector: int = 0  # the vision projector, when it runs here

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.compute + self.output + self.projector

def compute_bytes(shape: ModelShape, n_ctx: int, holds_output: bool,
                  cpu_moe: int = 0) -> int:
    """With every expert in RAM and no dense layer, a GPU runs attention only: its layer
    stage is about 7 x n_embd floats per token (q, k, v, the output projection and the
    residual; fitted on the random Qwen3-MoE on an RPC device, see fixtures/shapes.py)."""
    attention_only = cpu_moe >= shape.n_layers and shape.expert_bytes and all(shape.expert_bytes)
    ffn = shape.n_embd if attention_only else shape.n_ff
    layers = UBATCH * (3 * ffn + 4 * shape.n_embd) * 4 + UBATCH * n_ctx * 2
    logits = (shape.n_vocab * MAX_OUTPUTS + UBATCH * shape.n_embd) * 4
    return max(logits, layers) if holds_output else layers


def budgets(hw: Hardware, prefs: Preferences) -> tuple[list[tuple[str, int]], int]:
    """Usable bytes per GPU, and on the CPU, for the model: where past loads measured
    more than was predicted (calibration), the budget shrinks by that ratio, and the
    device that takes the vision projector has its share taken out."""
    gpus, cpu = _free(hw, prefs)
    where = projector_device(gpus, prefs.projector_bytes)
    if where == "CPU":
        cpu -= prefs.projector_bytes
    return [(name, b - prefs.projector_bytes if name == where else b) for name, b in gpus], cpu


def _free(hw: Hardware, prefs: Preferences) -> tuple[list[tuple[str, int]], int]:
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


PROJECTOR_SHARE = 4  # a GPU takes the projector when it is under a quarter of its budget


def projector_device(gpus: list[tuple[str, int]], size: int) -> str | None:
    """Where a vision projector runs (None: there is none): the largest GPU when it
    leaves most of that GPU to the model, else the CPU (llama-server puts it on the
    GPU unless told not to; a small GPU is better spent on layers)."""
    if not size:
        return None
    largest = max(gpus, key=lambda g: g[1], default=None)
    return largest[0] if largest and largest[1] >= PROJECTOR_SHARE * size else "CPU"


def where_projector(hw: Hardware, prefs: Preferences) -> str | None:
    return projector_device(_free(hw, prefs)[0], prefs.projector_bytes)


def with_projector(uses: tuple[DeviceUse, ...], hw: Hardware,
                   prefs: Preferences) -> tuple[DeviceUse, ...]:
    """The uses with the projector counted on its device."""
    where = where_projector(hw, prefs)
    return tuple(replace(u, projector=prefs.projector_bytes) if u.device == where else u
                 for u in uses)


@dataclass(frozen=True)
class Placement:
    n_gpu_layers: int              # in llama.cpp's count: the output matrix is one
    gpus: tuple[str, ...]          # the GPUs used, in the order llama.cpp gets them
    split: tuple[float, ...]       # their shares of the GPU layers (with several)
    uses: tuple[DeviceUse, ...]    # every GPU, then the CPU
    layout: Layout                 # the device of each layer, the output and the experts

    @property
    def cpu_moe(self) -> int:
        return self.layout.cpu_moe

    @property
    def split_mode(self) -> str:
        """llama.cpp's: whole layers per GPU, or every layer split across them."""
        return "tensor" if self.layout.tensor_shares else "layer"

    def fits(self) -> bool:
        return all(u.total <= u.budget for u in self.uses)


def place(shape: ModelShape, hw: Hardware, n_ctx: int, kv_type: str,
          prefs: Preferences, cpu_moe: int = 0, streams: int = 1) -> Placement:
    """llama.cpp offloads the output matrix with the first GPU layer, then repeating
    layers from the last one down. The largest GPU takes the output and the last layers,
    the next largest the layers before them (so it comes before it in llama.cpp's device
    list); the rest stay on the CPU. With the user's layer count, that many, shared by
    budget, fitting or not. The routed experts of the first `cpu_moe` layers stay in RAM
    wherever their layer runs (llama.cpp's tensor buffer overrides). `streams`: KV
    streams of n_ctx cells each (a split KV cache; the compute and a draft's KV are a
    sequence's)."""
    gpu_budgets, cpu_budget = budgets(hw, prefs)
    kv_layer = int(shape.kv_bytes_per_token(kv_type) * n_ctx) * streams
    order = sorted(range(len(gpu_budgets)), key=lambda i: -gpu_budgets[i][1])
    fills = dict(zip(order, _fill_gpus(shape, [gpu_budgets[i][1] for i in order], kv_layer,
                                       n_ctx, prefs, cpu_moe)))
    placed = sum(fill.layers for fill in fills.values())
    uses = [DeviceUse(name, budget, fills[i].weights, fills[i].kv,
                      compute_bytes(shape, n_ctx, i == order[0], cpu_moe) if fills[i].layers else 0)
            for i, (name, budget) in enumerate(gpu_budgets)]
    cpu = _cpu_use(shape, hw, cpu_budget, kv_layer, n_ctx, kv_type, placed, prefs, cpu_moe)
    used = [i for i in reversed(order) if fills[i].layers]
    split = tuple(round(fills[i].layers / placed, 4) for i in used) if len(used) > 1 else ()
    layout = _layout(shape, [(gpu_budgets[i][0], fills[i].layers) for i in order], cpu_moe)
    return Placement(placed, tuple(gpu_budgets[i][0] for i in used), split,
                     with_projector((*uses, cpu), hw, prefs), layout)


def _layout(shape: ModelShape, filled: list[tuple[str, int]], cpu_moe: int) -> Layout:
    """The device of each layer: the GPUs in filling order took the output, then layers
    from the last one down; the rest is on the CPU."""
    devices, output, placed = ["CPU"] * shape.n_layers, "CPU", 0
    for name, count in filled:
        for _ in range(count):
            if placed:
                devices[shape.n_layers - placed] = name
            else:
                output = name
            placed += 1
    return Layout(tuple(devices), output, min(cpu_moe, shape.n_layers))


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
               prefs: Preferences, cpu_moe: int = 0) -> list[_Fill]:
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
        compute = compute_bytes(shape, n_ctx, n == 0, cpu_moe)
        while placed < wanted and fill.layers < share:
            layer_kv = kv_layer if placed else 0
            size = _gpu_bytes(shape, shape.n_layers - placed, cpu_moe) if placed else output
            if not forced and compute + fill.weights + fill.kv + size + layer_kv > budget:
                break
            fill.weights += size
            fill.kv += layer_kv
            fill.layers += 1
            placed += 1
        fills.append(fill)
    return fills


def _gpu_bytes(shape: ModelShape, layer: int, cpu_moe: int) -> int:
    """A layer's bytes on its GPU: all of them, less its routed experts when they stay
    in RAM."""
    return shape.layer_bytes[layer] - (shape.experts(layer) if layer < cpu_moe else 0)


def _cpu_use(shape: ModelShape, hw: Hardware, budget: int, kv_layer: int, n_ctx: int,
             kv_type: str, placed: int, prefs: Preferences, cpu_moe: int = 0) -> DeviceUse:
    """What stays in RAM when `placed` layers went to GPUs: the other layers (mapped from
    the file, plus their repacked copies), the routed experts of GPU layers below
    `cpu_moe`, the token embeddings, the output matrix when no GPU took it, a draft
    model's weights and KV cache."""
    layers = shape.n_layers - max(placed - 1, 0)
    experts = range(layers, max(min(cpu_moe, shape.n_layers), layers))
    weights = (sum(shape.layer_bytes[:layers]) + shape.embd_bytes + shape.other_bytes
               + sum(shape.experts(i) for i in experts) + (0 if placed else shape.output_bytes))
    span = shape.mapped_bytes(layers, not placed, cpu_moe)
    gaps = max(span - weights, 0) if span is not None else 0
    if hw.cpu_repack:
        weights += sum(shape.layer_repack[:layers]) + (0 if placed else shape.output_repack)
        weights += sum(shape.expert_repack[i] for i in experts) if shape.expert_repack else 0
    kv = kv_layer * layers
    if prefs.draft:
        weights += prefs.draft.weights_bytes
        kv += int(prefs.draft.kv_bytes_per_token(kv_type) * n_ctx) * prefs.draft.n_layers
    computes = layers or not placed or len(experts)
    # With nothing else here, the CPU still looks up the token embeddings of a ubatch.
    compute = compute_bytes(shape, n_ctx, not placed) if computes else UBATCH * 16 * shape.n_embd
    return DeviceUse("CPU", budget, weights, kv, compute, shape.n_vocab * 4, gaps)


# llama.cpp's tensor parallelism (split mode "tensor", experimental there): every layer's
# weights and KV cache split across the GPUs by share, reduced between them twice a
# layer. CUDA and ROCm only (a simulated card stands for them), flash attention and an
# f16 KV cache required, and refused for these architectures (llama.cpp's multi-GPU
# guide: MLA caches and recurrent states do not shard).
TENSOR_BACKENDS = ("CUDA", "ROCm", "GPU")
NO_TENSOR_PARALLEL = frozenset({
    "grok", "mpt", "olmoe", "deepseek2", "deepseek32", "deepseek4", "glm-dsa", "nemotron_h",
    "nemotron_h_moe", "granitehybrid", "lfm2moe", "minimax-m2", "mistral4", "kimi-linear",
    "jamba", "falcon-h1", "mamba", "mamba2", "rwkv6", "rwkv7", "plamo2", "minicpm3",
    "gemma3n", "olmo2", "bitnet", "t5"})


def can_split_tensors(shape: ModelShape, hw: Hardware, kv_type: str, prefs: Preferences) -> bool:
    return (len(hw.gpus) >= 2 and kv_type == "f16" and prefs.gpu_layers is None
            and prefs.tensor_parallel and shape.architecture not in NO_TENSOR_PARALLEL
            and all(g.name.startswith(TENSOR_BACKENDS) for g in hw.gpus))


def place_tensor_parallel(shape: ModelShape, hw: Hardware, n_ctx: int,
                          prefs: Preferences) -> Placement:
    """Every layer and the output split across all GPUs, each GPU's share of the weights
    and of the KV cache in proportion to the room its compute buffer leaves it."""
    gpu_budgets, cpu_budget = budgets(hw, prefs)
    compute = compute_bytes(shape, n_ctx, holds_output=True)
    rooms = [max(budget - compute, 1) for _, budget in gpu_budgets]
    shares = tuple(round(room / sum(rooms), 4) for room in rooms)
    weights = sum(shape.layer_bytes) + (shape.output_bytes or shape.embd_bytes)
    kv = int(shape.kv_bytes_per_token("f16") * n_ctx) * shape.n_layers
    uses = [DeviceUse(name, budget, int(weights * share), int(kv * share), compute)
            for (name, budget), share in zip(gpu_budgets, shares)]
    cpu = _cpu_use(shape, hw, cpu_budget, 0, n_ctx, "f16", shape.n_layers + 1, prefs)
    first = gpu_budgets[0][0]
    layout = Layout((first,) * shape.n_layers, first,
                    tensor_shares=tuple((name, share) for (name, _), share
                                        in zip(gpu_budgets, shares)))
    return Placement(shape.n_layers + 1, tuple(name for name, _ in gpu_budgets), shares,
                     (*uses, cpu), layout)
