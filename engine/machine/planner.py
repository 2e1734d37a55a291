"""The planner: a pure function from (hardware, model shape, preferences) to a frozen
Plan — GPU layers and their split, routed experts kept in RAM, context size, KV cache
type — with the bytes predicted on every device (memory.py), the forecast speed
(forecast.py) and the reasons in words."""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..catalog.shape import ModelShape
from ..settings import MAX_LANES
from .forecast import Forecast, forecast, image_seconds
from .hardware import Hardware
from .memory import (MiB, DeviceUse, Placement, Preferences, can_split_tensors, compute_bytes,
                     place, place_tensor_parallel, where_projector)


@dataclass(frozen=True)
class Plan:
    model: str
    n_gpu_layers: int
    gpus: tuple[str, ...]          # in llama.cpp's order, for llama_model_params.devices
    tensor_split: tuple[float, ...]
    n_ctx: int
    kv_type: str
    flash_attn: bool               # the plan requires it (a quantized KV cache, a tensor split)
    uses: tuple[DeviceUse, ...]
    fits: bool
    reasons: tuple[str, ...]
    cpu_moe_layers: int = 0        # leading layers with their routed experts in RAM
    forecast: Forecast | None = None
    n_layers: int = 0              # the model's, and whether it has routed experts
    moe: bool = False
    split_mode: str = "layer"      # or "tensor": every layer split across the GPUs
    expert_device: str = "CPU"     # where those routed experts are: RAM, or a worker's
    lanes: int = 1                 # requests generating at once (_lanes())
    lanes_why: str = ""
    # A KV stream of n_ctx cells for each lane and one spare, instead of one pool of
    # n_ctx cells for all (_lanes())
    kv_split: bool = False

    def as_dict(self) -> dict:
        return {"model": self.model, "n_gpu_layers": self.n_gpu_layers, "gpus": list(self.gpus),
                "tensor_split": list(self.tensor_split), "n_ctx": self.n_ctx,
                "kv_type": self.kv_type, "flash_attn": self.flash_attn, "fits": self.fits,
                "devices": [{"device": u.device, "budget": u.budget, "weights": u.weights,
                             "kv": u.kv, "compute": u.compute, "output": u.output,
                             "projector": u.projector, "mapped_gaps": u.mapped_gaps,
                             "total": u.total} for u in self.uses],
                "reasons": list(self.reasons), "cpu_moe_layers": self.cpu_moe_layers,
                "forecast": self.forecast.as_dict() if self.forecast else None,
                "n_layers": self.n_layers, "moe": self.moe, "split_mode": self.split_mode,
                "expert_device": self.expert_device, "lanes": self.lanes,
                "lanes_why": self.lanes_why, "kv_split": self.kv_split}

def _contexts(prefs: Preferences, shape: ModelShape) -> list[int]:
    wanted = min(prefs.ctx, shape.context_length or prefs.ctx)
    floor = min(prefs.min_ctx, wanted)
    sizes, n = [], wanted
    while n >= floor:
        sizes.append(n)
        n = (n // 2) // 256 * 256 if n > 512 else n // 2
    return sizes or [wanted]


# Lanes (requests generating at once) when one pool of KV cells serves them all (_lanes
# chooses the layout) and the user sets none: the pool serves them all (any one may use the whole context), so lanes cost no memory of their own;
# what bounds them is how many requests the pool holds at once. LANE_TOKENS is the share
# counted on for each (a chat turn's prompt and answer; a longer one takes more, evicting
# idle conversations first), MAX_LANES the cap: 16 clients at once on a 24 GB GPU at 32k.
# Four lanes had made 12 of 16 clients wait on an H200 with 130 GB free.
LANE_TOKENS = 512


def lanes(n_ctx: int, parallel: int | None = None) -> tuple[int, str]:
    """Requests at once for a context of n_ctx cells, and why, in words."""
    if parallel:
        return parallel, f"{parallel} request{'s' * (parallel > 1)} at once (--parallel)"
    held = n_ctx // LANE_TOKENS
    n = max(1, min(MAX_LANES, held))
    why = f"{n} request{'s' * (n > 1)} at once: the {n_ctx:,} KV cells they share hold " \
          f"{held:,} of {LANE_TOKENS} tokens"
    return n, why + (f", {MAX_LANES} at most" if held > MAX_LANES else "") + \
        " (--parallel sets another number)"


F16_PREFERENCE = 1.05  # a q8_0 KV cache must be forecast this much faster to be chosen

# Context when none is asked: agents (Claude Code, Codex) send 20-30k tokens of tools and
# files, so up to 32k where the model takes it (Ollama's choice at 24-48 GiB), never
# below 16k unless only less fits (a reasoning model writes thousands of tokens before
# its answer: speed is traded for 16k). Above that, taken only while it costs little:
# the forecast at least AUTO_SPEED_SHARE of the fastest context's (layers or experts
# pushed off the GPU for KV cost more), and its KV cache at most AUTO_KV_SHARE of the
# usable memory.
AUTO_CTX = 32768
AUTO_FLOOR = 16384
AUTO_SPEED_SHARE = 0.9
AUTO_KV_SHARE = 0.25


def auto_context(**preferences) -> Preferences:
    """Preferences that let the planner choose the context."""
    return Preferences(ctx=AUTO_CTX, min_ctx=2048, auto_ctx=True, **preferences)


@dataclass(frozen=True)
class _Choice:
    rank: tuple
    n_ctx: int
    kv_type: str
    placement: Placement
    forecast: Forecast


def plan(hw: Hardware, shape: ModelShape, prefs: Preferences = Preferences()) -> Plan:
    """The largest context up to the wanted one (not below the floor), or when none was
    asked the largest that costs little (_auto_choice); at that context the placement
    forecast to decode fastest among those predicted to fit under each device's budget
    (_candidates). An f16 KV cache unless q8_0 makes the context fit or
    is forecast over 5% faster (it keeps more on the GPU)."""
    if prefs.auto_ctx:
        best, traded = _auto_choice(shape, hw, prefs)
    else:  # the largest context that fits: a smaller one is never preferred
        best = next(filter(None, (_best_at(shape, hw, prefs, n_ctx)
                                  for n_ctx in _contexts(prefs, shape))), None)
        traded = None
    if best is None:
        return _no_fit(hw, shape, prefs)
    placement = best.placement
    speed = best.forecast
    if prefs.image_flops:
        speed = replace(speed, image_s=image_seconds(hw, where_projector(hw, prefs) or "CPU",
                                                     prefs.image_flops))
    n_lanes, why, split = _lanes(shape, hw, prefs, best)
    uses = split.uses if split else placement.uses
    return Plan(shape.name, placement.n_gpu_layers, placement.gpus, placement.split,
                best.n_ctx, best.kv_type,
                best.kv_type != "f16" or placement.split_mode == "tensor", uses, True,
                (*_reasons(shape, hw, prefs, best, uses[-1], traded), why), placement.cpu_moe, speed,
                shape.n_layers, shape.is_moe, placement.split_mode, lanes=n_lanes,
                lanes_why=why, kv_split=split is not None)


def _lanes(shape: ModelShape, hw: Hardware, prefs: Preferences,
           best: _Choice) -> tuple[int, str, Placement | None]:
    """Requests at once, why, and the placement with a KV stream of the whole context for
    each of them and a spare (None: one pool all share, lanes()). Split when the memory
    holds those streams without a layer leaving the GPU, and in RAM within AUTO_KV_SHARE
    of it (the desktop needs the rest) unless asked (--kv-layout split): a token then attends to its own stream's cells, not to every
    sequence's (16 streams of ~360 tokens: 0.98x of llama-server -np 16 on this CPU,
    0.77x with one pool)."""
    count = prefs.parallel or MAX_LANES
    placement = best.placement
    if prefs.kv_layout != "unified" and count > 1 and placement.split_mode == "layer":
        split = place(shape, hw, best.n_ctx, best.kv_type, prefs, placement.cpu_moe,
                      streams=count + 1)
        in_ram = split.uses[-1]
        light = in_ram.kv <= AUTO_KV_SHARE * in_ram.budget or prefs.kv_layout == "split"
        if split.fits() and split.n_gpu_layers == placement.n_gpu_layers and light:
            asked = " (--parallel)" if prefs.parallel else \
                f" ({MAX_LANES} at most; --parallel sets another number)"
            return count, (f"{count} requests at once, each in a KV stream of its own holding "
                           f"the whole {best.n_ctx:,}-token context{asked}"), split
    n, why = lanes(best.n_ctx, prefs.parallel)
    if prefs.kv_layout == "split":
        why += f" ({count + 1} KV streams of {best.n_ctx:,} cells do not fit: one pool)"
    return n, why, None


def _best_at(shape: ModelShape, hw: Hardware, prefs: Preferences, n_ctx: int) -> _Choice | None:
    """At this context, the placement and KV type forecast fastest among those that fit."""
    best = None
    for kv_type in ["f16", "q8_0"] if prefs.allow_quantized_kv else ["f16"]:
        for placement in _candidates(shape, hw, n_ctx, kv_type, prefs):
            if not placement.fits():
                continue
            speed = forecast(shape, placement.layout, hw, n_ctx, prefs.speed_calibration)
            preference = F16_PREFERENCE if kv_type == "f16" else 1.0
            rank = (speed.decode_tps * preference, placement.n_gpu_layers)
            if best is None or rank > best.rank:
                best = _Choice(rank, n_ctx, kv_type, placement, speed)
    return best


def _auto_choice(shape: ModelShape, hw: Hardware,
                 prefs: Preferences) -> tuple[_Choice | None, _Choice | None]:
    """The largest context that costs little (see AUTO_CTX), and the larger one it
    declined, if any (the plan says what that would have cost)."""
    sizes = _contexts(prefs, shape)
    fitting = [c for c in (_best_at(shape, hw, prefs, n) for n in sizes) if c]
    if not fitting:
        return None, None
    fastest = max(c.forecast.decode_tps for c in fitting)
    usable = sum(u.budget for u in fitting[0].placement.uses)

    def cheap(choice: _Choice) -> bool:
        kv = sum(u.kv for u in choice.placement.uses)
        return choice.n_ctx <= AUTO_FLOOR or (
            choice.forecast.decode_tps >= AUTO_SPEED_SHARE * fastest
            and kv <= AUTO_KV_SHARE * usable)

    chosen = next((c for c in fitting if cheap(c)), fitting[-1])
    at = sizes.index(chosen.n_ctx)
    larger = [c for c in fitting if at and c.n_ctx == sizes[at - 1]]  # the next size up
    return chosen, larger[0] if larger else None


def _candidates(shape: ModelShape, hw: Hardware, n_ctx: int, kv_type: str,
                prefs: Preferences):
    """Whole layers on the GPUs (as many as fit); for a mixture-of-experts model also
    every layer on the GPUs with the routed experts of the fewest leading layers in RAM
    that makes it fit (llama.cpp's --n-cpu-moe N), and with all of them in RAM
    (--cpu-moe) plus as many layers as fit. The user's expert count, when given, alone."""
    if prefs.cpu_moe_layers is not None:  # without experts or a GPU it changes nothing
        chosen = prefs.cpu_moe_layers if shape.is_moe and hw.gpus else 0
        yield place(shape, hw, n_ctx, kv_type, prefs, chosen)
        return
    yield place(shape, hw, n_ctx, kv_type, prefs)
    if can_split_tensors(shape, hw, kv_type, prefs):
        yield place_tensor_parallel(shape, hw, n_ctx, prefs)
    if shape.is_moe and hw.gpus and prefs.gpu_layers is None:
        yield place(shape, hw, n_ctx, kv_type, prefs, _fewest_cpu_moe(shape, hw, n_ctx, kv_type,
                                                                       prefs))
        yield place(shape, hw, n_ctx, kv_type, prefs, shape.n_layers)


def _fewest_cpu_moe(shape: ModelShape, hw: Hardware, n_ctx: int, kv_type: str,
                    prefs: Preferences) -> int:
    """The smallest N with every layer on the GPUs and the experts of layers 0..N-1 in
    RAM fitting (by bisection: more experts in RAM never needs more GPU memory)."""
    def fits(n: int) -> bool:
        placement = place(shape, hw, n_ctx, kv_type, prefs, n)
        return placement.n_gpu_layers == shape.n_layers + 1 and placement.fits()

    low, high = 0, shape.n_layers
    while low < high:
        middle = (low + high) // 2
        low, high = (low, middle) if fits(middle) else (middle + 1, high)
    return low


def _gib(size: float) -> str:
    return f"{size / (1 << 30):.1f} GiB"


def _layers_text(shape: ModelShape, placement: Placement, prefs: Preferences) -> str:
    if placement.split_mode == "tensor":
        return (f"every layer split across {' and '.join(placement.gpus)} "
                "(llama.cpp's tensor parallelism, experimental there; unmeasured here)")
    n_gpu = max(placement.n_gpu_layers - 1, 0)  # repeating layers
    gpus = "GPUs" if len(placement.gpus) > 1 else "GPU"
    if prefs.gpu_layers is not None:
        return (f"the output and {n_gpu} of {shape.n_layers} layers on the {gpus}, as chosen"
                if placement.n_gpu_layers else "no layers on the GPU, as chosen")
    if n_gpu == shape.n_layers:
        return f"all {shape.n_layers} layers and the output on the {gpus}"
    if placement.n_gpu_layers == 0:
        return "not even the output layer fits on the GPU: every layer runs on the CPU"
    return (f"the output and {n_gpu} of {shape.n_layers} layers on the {gpus}; the other "
            f"{shape.n_layers - n_gpu} on the CPU")


def _experts_text(shape: ModelShape, placement: Placement, n_ctx: int,
                  prefs: Preferences) -> str:
    n = placement.cpu_moe
    in_ram = sum(shape.experts(i) for i in range(n))
    on_gpu = sum(u.total for u in placement.uses if u.device != "CPU")
    shared = ", shared experts" if shape.shared_expert_bytes else ""
    chosen = ", as chosen" if prefs.cpu_moe_layers is not None else ""
    which = "all layers" if n == shape.n_layers else f"layers 0–{n - 1}"
    return (f"routed experts of {which} in RAM ({_gib(in_ram)}){chosen}; attention{shared} "
            f"and the {n_ctx // 1024}k KV cache on the GPU ({_gib(on_gpu)})")


def _context_text(shape: ModelShape, prefs: Preferences, best: _Choice,
                  declined: _Choice | None) -> str | None:
    """Why this context, in words (None: the one asked, unchanged)."""
    wanted = min(prefs.ctx, shape.context_length or prefs.ctx)
    if not prefs.auto_ctx:
        return (f"context reduced from {wanted} to {best.n_ctx} tokens to fit"
                if best.n_ctx < wanted else None)
    if best.n_ctx == wanted:
        most = "the most this model takes" if wanted < AUTO_CTX else "enough for coding agents"
        return f"context {best.n_ctx:,} tokens, {most}"
    if declined is None:
        sizes = _contexts(prefs, shape)
        return f"context {best.n_ctx:,} tokens: {sizes[sizes.index(best.n_ctx) - 1]:,} does not fit"
    if declined.forecast.decode_tps < AUTO_SPEED_SHARE * best.forecast.decode_tps:
        cost = (f"{declined.n_ctx:,} would run at about {declined.forecast.decode_tps:.1f} "
                f"tok/s instead of {best.forecast.decode_tps:.1f}")
    else:
        kv = sum(u.kv for u in declined.placement.uses)
        cost = f"{declined.n_ctx:,} would hold {_gib(kv)} of KV cache"
    return f"context {best.n_ctx:,} tokens: {cost} (asking for it still gets it)"


def _reasons(shape: ModelShape, hw: Hardware, prefs: Preferences, best: _Choice, cpu,
             declined: _Choice | None = None) -> tuple[str, ...]:
    """`cpu`: what RAM holds as planned, every lane's KV stream included (the status line
    and the Memory page say the same)."""
    placement, n_ctx = best.placement, best.n_ctx
    reasons = ["no GPU: every layer runs on the CPU" if not hw.gpus
               else _layers_text(shape, placement, prefs), *hw.same_gpu]
    if placement.cpu_moe or placement.split_mode == "tensor":
        if placement.cpu_moe:
            reasons.append(_experts_text(shape, placement, n_ctx, prefs))
        layers = place(shape, hw, n_ctx, best.kv_type, prefs)
        if layers.fits():
            speed = forecast(shape, layers.layout, hw, n_ctx, prefs.speed_calibration)
            gpus = "GPUs" if len(hw.gpus) > 1 else "GPU"
            reasons.append(f"whole layers on the {gpus} instead: about {speed.decode_tps:.1f} tok/s")
    fc = best.forecast
    reasons.append(f"forecast: about {fc.decode_tps:.1f} tok/s generating, "
                   f"{fc.prompt_tps:,.0f} tok/s reading the prompt"
                   + (" (calibrated by past loads here)" if fc.calibrated else ""))
    if context := _context_text(shape, prefs, best, declined):
        reasons.append(context)
    if best.kv_type != "f16":
        f16 = place(shape, hw, n_ctx, "f16", prefs, placement.cpu_moe)
        why = "it keeps more on the GPU" if f16.fits() else "to keep the context"
        reasons.append(f"KV cache quantized to q8_0, which requires flash attention: {why}")
    if placement.split_mode == "tensor":
        reasons.append("layers split across GPUs, which requires flash attention")
    elif best.kv_type == "f16":
        reasons.append("flash attention: llama.cpp's auto (on where the backend has it: the "
                       "CPU, CUDA, Metal); /health says what it chose")
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


def place_draft(main: Plan, draft: ModelShape, n_ctx: int,
                ram_free: int | None = None) -> tuple[str, int] | None:
    """Where a speculative-decoding draft model runs: on the GPU the main model left the
    most room on, when the whole draft (weights, KV cache, compute) fits there — it is the
    fastest place — else on the CPU, when `ram_free` (RAM free now, the main model loaded;
    None: not asked) holds it; None when nothing has room. Returns the device and
    llama.cpp's n_gpu_layers."""
    need = draft_bytes(draft, n_ctx)
    room = max(((u.budget - u.total, u.device) for u in main.uses if u.device != "CPU"),
               default=None)
    if room is not None and room[0] >= need:
        return room[1], draft.n_layers + 1
    return ("CPU", 0) if ram_free is None or ram_free >= need else None


def draft_bytes(draft: ModelShape, n_ctx: int) -> int:
    """What a draft holds: its weights, its KV cache at the target's context, compute."""
    return (draft.weights_bytes + int(draft.kv_bytes_per_token("f16") * n_ctx) * draft.n_layers
            + compute_bytes(draft, n_ctx, holds_output=True))


# A mixture-of-experts quant whose experts spill into RAM is chosen for quality while
# it runs at least this share of the fastest fitting quant's forecast speed.
MOE_SPEED_SHARE = 0.4


def choose_quant(hw: Hardware, base: ModelShape, candidates: list[tuple[str, int]],
                 prefs: Preferences = Preferences()) -> tuple[str, Plan] | None:
    """Among quant files (name, size) of one model, the largest (best quality) that runs
    with all layers on the GPU, else the one keeping the most GPU layers, at full context
    when possible; None when none fits. A mixture-of-experts model on a GPU keeps every
    layer there whichever quant, so there: the largest whose forecast is at least
    MOE_SPEED_SHARE of the fastest's. Unquantized files (F32/F16/BF16) come last unless
    wholly on a GPU: elsewhere they run at a fraction of Q8_0's speed for a quality
    difference nobody measures."""
    ranked = []
    for name, size in candidates:
        p = plan(hw, base.scaled(name, size), prefs)
        if p.fits:
            full_gpu = p.n_gpu_layers == base.n_layers + 1 and not p.cpu_moe_layers
            quantized = name.upper().removeprefix("UD-") not in ("F32", "F16", "BF16")
            ranked.append(((p.n_gpu_layers, p.n_ctx, quantized or full_gpu, size), name, p))
    if base.is_moe and hw.gpus and ranked:
        fastest = max(p.forecast.decode_tps for _, _, p in ranked)
        quick = [r for r in ranked if r[2].forecast.decode_tps >= MOE_SPEED_SHARE * fastest]
        return max(quick, key=lambda r: (r[0][1:], r[0][0]))[1:]
    return max(ranked)[1:] if ranked else None
