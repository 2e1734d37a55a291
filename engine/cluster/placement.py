"""Where each layer runs when other machines help: a pure function from the model's shape,
this machine and the workers (their memory, measured speed and link round trip) to a
plan of contiguous layer ranges, as exo's placement and prima.cpp's solver do.

Decoding a token streams every weight once, so a stage's time is its bytes over its
device's bandwidth; each remote stage adds round trips on its link. Layers go to the
fastest devices first, within each one's memory; the token embeddings and the output
layer stay on this machine (only an activation row crosses a link, never the logits).
Every subset of workers is tried: a worker that would make tokens slower than the best
plan without it is left out, with the figures that say why."""

from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import combinations

from ..catalog.shape import ModelShape
from ..machine.hardware import Hardware
from ..machine.memory import DeviceUse, budgets, compute_bytes
from ..machine.planner import Plan, Preferences, _contexts, lanes, plan

THIS_MACHINE = "this machine"
ROUND_TRIPS_PER_STAGE = 2     # llama.cpp RPC per remote stage and token (measured: bench/cluster.py)
LINK_BYTES_PER_S = 125e6      # 1 Gbit/s, for the activation rows
GPU_BANDWIDTH_FACTOR = 8.0    # a GPU against its host's RAM, when not measured
# Decoding streams weights at about a third of a plain read's rate on these CPUs (SmolLM2
# 0.27, Gemma 3 270M 0.35 of machine.bandwidth.memory_bandwidth): the expected tokens/s shown uses it.
DECODE_EFFICIENCY = 0.3
MAX_SUBSETS = 64
# A worker joins only for at least this much more speed each: the bandwidth probes of two
# processes on one loaded machine differ by up to about 15% run to run, and a plan that
# leans on that noise gains nothing and adds a machine that can fail.
MIN_GAIN = 1.15
# With routed experts on a worker, llama.cpp's RPC sends each layer's graph and activations
# there and back every token: 23 KB out and 2 KB back a layer, one round trip (measured,
# tests/engine/test_moe_offload.py).
EXPERT_SPLIT_BYTES = 25_000


@dataclass(frozen=True)
class Machine:
    name: str
    devices: tuple[tuple[str, str, int], ...]  # (ggml device name here, kind, usable bytes)
    bandwidth: float                           # bytes/s its CPU reads (measured probe)
    rtt_s: float = 0.0                         # round trip of its link; 0 for this machine

    def speed(self, kind: str) -> float:
        """Bytes of weights a second its device of this kind gets through decoding."""
        gpu = kind in ("gpu", "igpu")
        return self.bandwidth * DECODE_EFFICIENCY * (GPU_BANDWIDTH_FACTOR if gpu else 1.0)


@dataclass(frozen=True)
class Stage:
    machine: str
    device: str
    first_layer: int
    last_layer: int     # inclusive; the output layer is counted as layer n_layers
    bytes: int          # weights, KV cache and compute buffer there


@dataclass(frozen=True)
class ClusterPlan:
    plan: Plan
    stages: tuple[Stage, ...]
    tokens_per_s: float               # expected decode speed
    left_out: tuple[tuple[str, str], ...]  # (worker, why)

    def as_dict(self) -> dict:
        return {**self.plan.as_dict(), "tokens_per_s": round(self.tokens_per_s, 1),
                "stages": [vars(s) for s in self.stages],
                "left_out": [{"worker": w, "why": why} for w, why in self.left_out]}


def local_machine(hw: Hardware, prefs: Preferences, bandwidth: float) -> Machine:
    """This machine's devices, the output device last (its largest GPU, else the CPU)."""
    gpus, cpu = budgets(_without_remote(hw), prefs)
    kinds = {d.name: d.kind for d in hw.devices}
    ordered = [("CPU", "cpu", cpu)] + [(n, kinds[n], b) for n, b in sorted(gpus, key=lambda g: g[1])]
    return Machine(THIS_MACHINE, tuple(ordered), bandwidth)


def _without_remote(hw: Hardware) -> Hardware:
    return replace(hw, devices=tuple(d for d in hw.devices if not d.name.startswith("RPC")))


def place_cluster(shape: ModelShape, hw: Hardware, here: Machine, workers: list[Machine],
                  prefs: Preferences, split: dict[str, int] | None = None) -> ClusterPlan:
    """The fastest plan that fits, over this machine and any subset of `workers` (with
    `split`, that many layers on each named worker, the rest here)."""
    subsets = [tuple(w for w in workers if w.name in split)] if split else \
        [s for n in range(len(workers) + 1) for s in combinations(workers, n)][:MAX_SUBSETS]
    for n_ctx in _contexts(prefs, shape):
        for kv_type in (["f16", "q8_0"] if prefs.allow_quantized_kv else ["f16"]):
            found = [c for s in subsets for balanced in (False, True)
                     if (c := _candidate(shape, hw, here, s, n_ctx, kv_type, prefs, split,
                                         balanced))]
            if not split:
                found += [c for w in workers
                          if (c := experts_on_worker(shape, hw, here, w, n_ctx, kv_type, prefs))]
            if found:
                best = max(found, key=_worth)
                return replace(best, left_out=_left_out(best, found, workers))
    alone = plan(_without_remote(hw), shape, prefs)
    return ClusterPlan(replace(alone, reasons=alone.reasons + (
        "not even this machine and every worker together hold it",)), (), 0.0,
        tuple((w.name, "the model does not fit even with it") for w in workers))


def _worth(plan: ClusterPlan) -> tuple[float, int]:
    """Expected speed, less MIN_GAIN for every worker the plan needs."""
    remote = len({s.machine for s in plan.stages} - {THIS_MACHINE})
    return plan.tokens_per_s / MIN_GAIN ** remote, -len(plan.stages)


def _left_out(best: ClusterPlan, found: list[ClusterPlan], workers: list[Machine]):
    used = {s.machine for s in best.stages}
    reasons = []
    for worker in workers:
        if worker.name in used:
            continue
        with_it = [c for c in found if worker.name in {s.machine for s in c.stages}]
        if with_it:
            faster = max(c.tokens_per_s for c in with_it)
            verdict = "would slow generation" if faster <= best.tokens_per_s else \
                f"gains under {MIN_GAIN - 1:.0%}, not worth another machine that can fail " \
                "(the speed probes are that noisy)"
            reasons.append((worker.name, f"{verdict}: {faster:.1f} tok/s expected with it, "
                                         f"{best.tokens_per_s:.1f} without"))
        else:
            reasons.append((worker.name, "no layers fit in its free memory"))
    return tuple(reasons)


def _candidate(shape, hw, here: Machine, remote: tuple[Machine, ...], n_ctx: int,
               kv_type: str, prefs: Preferences, split, balanced: bool) -> ClusterPlan | None:
    if not remote:
        if balanced:
            return None
        alone = plan(_without_remote(hw), shape, replace(prefs, ctx=n_ctx, min_ctx=n_ctx,
                                                         allow_quantized_kv=kv_type != "f16"))
        if not alone.fits or alone.kv_type != kv_type:
            return None
        stage = Stage(THIS_MACHINE, "CPU", 0, shape.n_layers, sum(u.total for u in alone.uses))
        return ClusterPlan(alone, (stage,), 1 / _seconds(shape, [(here, "cpu", shape.n_layers)]), ())
    devices = [(m, name, kind, budget) for m in (*remote, here) for name, kind, budget in m.devices]
    counts = _fill(shape, devices, n_ctx, kv_type, split, balanced)
    if counts is None:
        return None
    return _as_plan(shape, devices, counts, n_ctx, kv_type, prefs)


def _layer_cost(shape: ModelShape, n_ctx: int, kv_type: str) -> int:
    return max(shape.layer_bytes) + int(shape.kv_bytes_per_token(kv_type) * n_ctx)


def _fixed(shape: ModelShape, n_ctx: int, last: bool) -> int:
    """What a device holds besides its layers: the compute buffer; on the output device
    also the output matrix, the embeddings, the logits row."""
    if not last:
        return compute_bytes(shape, n_ctx, False)
    return (compute_bytes(shape, n_ctx, True) + shape.output_bytes + shape.embd_bytes
            + shape.other_bytes + shape.n_vocab * 4)


def _fill(shape, devices, n_ctx, kv_type, split, balanced) -> list[int] | None:
    """Layers per device (in device order): fastest devices first, each to its memory;
    or (`balanced`) first in proportion to their speeds, as llama.cpp's own split does."""
    cost = _layer_cost(shape, n_ctx, kv_type)
    room = []
    for i, (machine, _name, kind, budget) in enumerate(devices):
        spare = budget - _fixed(shape, n_ctx, i == len(devices) - 1)
        room.append(max(0, spare // cost))
    counts = [0] * len(devices)
    left = shape.n_layers
    if split:
        for i, (machine, *_rest) in enumerate(devices):
            if machine.name in split:
                counts[i] = min(split[machine.name], left)
                left -= counts[i]
        counts[-1] = left
        return counts if all(c <= r for c, r in zip(counts, room)) else None
    speeds = [m.speed(kind) for m, _name, kind, _budget in devices]
    if balanced:
        for i, speed in enumerate(speeds):
            counts[i] = min(room[i], int(shape.n_layers * speed / sum(speeds)))
        left -= sum(counts)
    order = sorted(range(len(devices)), key=lambda i: (-speeds[i], devices[i][0].rtt_s, -i))
    for i in order:
        more = min(room[i] - counts[i], left)
        counts[i] += more
        left -= more
    return None if left else counts


def _seconds(shape: ModelShape, parts: list[tuple[Machine, str, int]]) -> float:
    """Predicted seconds a token: each stage streams its layers' weights (of routed
    experts only the top-k share a token uses), each remote stage adds its link's round
    trips and an activation row each way."""
    read = [size - shape.experts(i) * (1 - shape.active_fraction)
            for i, size in enumerate(shape.layer_bytes)]
    per_layer = sum(read) / shape.n_layers
    seconds = (shape.output_bytes or shape.embd_bytes) / parts[-1][0].speed(parts[-1][1])
    machines = {}
    for machine, kind, layers in parts:
        seconds += layers * per_layer / machine.speed(kind)
        if layers and machine.name != THIS_MACHINE:
            machines[machine.name] = machine
    for machine in machines.values():
        seconds += ROUND_TRIPS_PER_STAGE * machine.rtt_s + 2 * shape.n_embd * 4 / LINK_BYTES_PER_S
    return seconds


def _as_plan(shape, devices, counts, n_ctx, kv_type, prefs) -> ClusterPlan | None:
    used = [(d, c) for d, c in zip(devices, counts) if c or d is devices[-1]]
    if all(m.name == THIS_MACHINE for (m, *_r), _c in used):
        return None  # no worker got a layer: that is the plan without them
    kv_layer = int(shape.kv_bytes_per_token(kv_type) * n_ctx)
    stages, uses, first = [], [], 0
    for index, ((machine, name, kind, budget), count) in enumerate(used):
        last = index == len(used) - 1
        weights = sum(shape.layer_bytes[first:first + count])
        if last:
            weights += shape.output_bytes + shape.embd_bytes + shape.other_bytes
        use = DeviceUse(name, budget, weights, kv_layer * count,
                        compute_bytes(shape, n_ctx, last), shape.n_vocab * 4 if last else 0)
        uses.append(use)
        stages.append(Stage(machine.name, name, first, first + count - (0 if last else 1),
                            use.total))
        first += count
    if any(u.total > u.budget for u in uses):
        return None
    machines = sorted({m.name for (m, *_r), _c in used} - {THIS_MACHINE})
    reasons = (f"layers spread over this machine and {', '.join(machines)}: "
               + "; ".join(f"{s.machine} ({s.device}) layers {s.first_layer}-{s.last_layer}"
                           for s in stages),
               "the output layer stays on this machine: only one activation row crosses "
               "each link per token")
    n_lanes, why = lanes(n_ctx, prefs.parallel)
    planned = Plan(shape.name, shape.n_layers + 1, tuple(u.device for u in uses),
                   tuple(float(c + (1 if i == len(used) - 1 else 0)) for i, (_d, c) in enumerate(used)),
                   n_ctx, kv_type, kv_type != "f16", tuple(uses), True, (*reasons, why),
                   lanes=n_lanes, lanes_why=why)
    seconds = _seconds(shape, [(m, kind, c) for (m, _n, kind, _b), c in used])
    return ClusterPlan(planned, tuple(stages), 1 / seconds, ())


def experts_on_worker(shape: ModelShape, hw: Hardware, here: Machine, worker: Machine,
                      n_ctx: int, kv_type: str, prefs: Preferences) -> ClusterPlan | None:
    """A mixture-of-experts model too big for this machine: the routed experts of the
    fewest leading layers on a worker with the RAM for them (it computes them; llama.cpp's
    tensor override to its RPC buffer), everything else here. None for a dense model, or
    when the worker cannot hold them or the rest does not fit here even so."""
    if not shape.is_moe or not worker.devices:
        return None
    device, _kind, budget = max(worker.devices, key=lambda d: d[2])
    local = _without_remote(hw)
    fixed = replace(prefs, ctx=n_ctx, min_ctx=n_ctx, allow_quantized_kv=kv_type != "f16")

    def rest_here(n: int) -> Plan:
        return plan(local, _without_experts(shape, n), replace(fixed, cpu_moe_layers=0))

    if plan(local, shape, fixed).fits or not rest_here(shape.n_layers).fits:
        return None  # needs no help, or more than experts can give
    low, high = 1, shape.n_layers  # the fewest layers whose experts leave: bisection
    while low < high:
        middle = (low + high) // 2
        low, high = (low, middle) if rest_here(middle).fits else (middle + 1, high)
    there = sum(shape.experts(i) for i in range(low))
    use = DeviceUse(device, budget, there, 0, compute_bytes(shape, n_ctx, False))
    if use.total > budget:
        return None
    return _experts_plan(shape, rest_here(low), here, worker, use, low)


def _without_experts(shape: ModelShape, n: int) -> ModelShape:
    """The model as this machine holds it when the routed experts of layers 0..n-1 live
    elsewhere."""
    return replace(shape, layer_bytes=tuple(b - (shape.experts(i) if i < n else 0)
                                            for i, b in enumerate(shape.layer_bytes)),
                   expert_bytes=tuple(0 if i < n else b for i, b in enumerate(shape.expert_bytes)),
                   expert_repack=tuple(0 if i < n else b
                                       for i, b in enumerate(shape.expert_repack)))


def _experts_plan(shape: ModelShape, rest: Plan, here: Machine, worker: Machine,
                  use: DeviceUse, n: int) -> ClusterPlan:
    host_kind = "gpu" if rest.n_gpu_layers else "cpu"
    active = sum(shape.experts(i) for i in range(n)) * shape.active_fraction
    seconds = (_without_experts(shape, n).weights_read_per_token() / here.speed(host_kind)
               + active / worker.speed("cpu")
               + n * (worker.rtt_s + EXPERT_SPLIT_BYTES / LINK_BYTES_PER_S))
    which = "all layers" if n == shape.n_layers else f"layers 0–{n - 1}"
    reasons = (f"routed experts of {which} on {worker.name} ({use.weights / 2**30:.1f} GiB), "
               "which computes them; everything else on this machine",
               f"each token makes {n} round trips to {worker.name} (one a layer)",
               *rest.reasons)
    planned = replace(rest, model=shape.name, uses=(*rest.uses, use), reasons=reasons,
                      cpu_moe_layers=n, expert_device=use.device, moe=True)
    if rest.n_gpu_layers:  # the worker is one of the model's devices, with no layers of
        # its own (else llama.cpp aborts: its buffer would have no backend to run on)
        planned = replace(planned, gpus=(*rest.gpus, use.device),
                          tensor_split=(*(rest.tensor_split or (1.0,)), 0.0))
    stages = (Stage(THIS_MACHINE, "CPU", 0, shape.n_layers, sum(u.total for u in rest.uses)),
              Stage(worker.name, use.device, 0, n - 1, use.total))
    return ClusterPlan(planned, stages, 1 / seconds, ())
