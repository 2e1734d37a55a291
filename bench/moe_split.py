"""Experts in RAM against a whole-layer split, at the same GPU memory: the device check of
the mixture-of-experts placement. A random-weight MoE of a real model's shape
(fixtures/shapes.py, default Qwen3-30B-A3B with the donor's smaller vocabulary) is planned
for a GPU held to --vram GiB two ways — the planner's choice (every layer on the GPU,
the routed experts of the first N layers in RAM) and the best whole-layer split — and
llama-bench runs both (-ngl/-ncmoe as planned), printing measured and forecast tokens/s.
Quick mode (make test) plans and forecasts only: llama-bench would first be built.

It needs a GPU build of llama-bench for figures that mean anything (--bins; the default
is the CPU build from build_tools.py, on which both runs are the same). Without a GPU
it plans for a simulated one of --vram GiB, so the script is exercised end to end.

    python -m bench.moe_split [--vram 8] [--shape qwen3-30b-a3b] [--bins DIR] [--quick]
"""

from __future__ import annotations

import sys
from pathlib import Path

from .common import QUICK_NOTE, BenchError, arguments, donor, ratio, report

from fixtures.shapes import RUNNABLE_MOE, SHAPES, cached

GiB = 1 << 30
QUICK_VRAM = 0.08  # GiB: the small MoE's attention and part of its experts fit


def options(parser) -> None:
    parser.add_argument("--vram", type=float, default=8.0, help="GPU memory to plan for, GiB")
    parser.add_argument("--shape", default="qwen3-30b-a3b", choices=sorted(SHAPES))
    parser.add_argument("--bins", type=Path, help="a folder with a GPU build of llama-bench")


def hardware(vram: float):
    """This machine with its first GPU held to `vram` GiB, or a simulated one."""
    from dataclasses import replace

    from engine.machine.bandwidth import UNKNOWN_GPU
    from engine.machine.hardware import simulated
    from engine.llama.probe import probe

    real = probe()
    if not real.gpus:  # a mid-range card's speed
        return simulated((vram,), real.ram_available_bytes / GiB, real.cpu_cores,
                         gpu_bandwidth_gbs=UNKNOWN_GPU[0] / 1e9, gpu_tflops=UNKNOWN_GPU[1] / 1e12,
                         ram_bandwidth_gbs=real.ram_bandwidth / 1e9), False
    gpu = real.gpus[0]
    held = replace(gpu, free_bytes=min(gpu.free_bytes, int(vram * GiB)))
    return replace(real, devices=tuple(held if d is gpu else d for d in real.devices)), True


def plans(model: Path, machine, ctx: int):
    """The planner's choice and the best whole-layer split for the same memory."""
    from engine.catalog.gguf_file import GGUFInspector
    from engine.machine.planner import Preferences, plan

    shape = GGUFInspector().inspect(model).shape
    chosen = plan(machine, shape, Preferences(ctx=ctx, min_ctx=ctx))
    split = plan(machine, shape, Preferences(ctx=ctx, min_ctx=ctx, cpu_moe_layers=0))
    if not (chosen.fits and split.fits):
        raise BenchError(f"{model.name} does not fit this machine with {ctx} tokens")
    return {"experts in RAM": chosen, "whole layers": split}


def bench(bins: Path, model: Path, threads: int, plan, tokens: int, prompt: int, reps: int):
    """llama-bench's (pp, tg) tokens/s with the plan's layers and experts."""
    from .build_tools import llama_bench

    rows = llama_bench(bins, model, threads, "-p", str(prompt), "-n", str(tokens),
                       "-r", str(reps), "-ngl", str(plan.n_gpu_layers),
                       "-ncmoe", str(plan.cpu_moe_layers))
    return (next(r["avg_ts"] for r in rows if r["n_prompt"]),
            next(r["avg_ts"] for r in rows if r["n_gen"]))


def measure(args, model: Path, planned: dict) -> dict[str, float]:
    """llama-bench on each plan: its generation tokens/s, printed with the prompt's."""
    if args.bins:
        bins = args.bins
    else:
        from .build_tools import build

        bins = build()
    measured = {}
    for name, plan in planned.items():
        pp, tg = bench(bins, model, args.threads, plan, args.tokens, args.prompt, args.reps)
        measured[name] = tg
        print(f"{name:<15} measured tg {tg:7.1f} t/s, pp {pp:7.1f} t/s")
    return measured


def main() -> int:
    args = arguments(__doc__, {"tokens": (128, 8), "prompt": (512, 32), "reps": (3, 1)}, options)
    spec = RUNNABLE_MOE if args.quick else SHAPES[args.shape]
    model = cached(spec, donor=donor())
    vram = QUICK_VRAM if args.quick else args.vram
    machine, real_gpu = hardware(vram)
    planned = plans(model, machine, 2048)
    print(f"\n{model.name}, {'a GPU' if real_gpu else 'a simulated GPU'} held to {vram} GiB, "
          f"{args.threads} threads")
    for name, plan in planned.items():
        print(f"{name:<15} ngl {plan.n_gpu_layers:3} experts of {plan.cpu_moe_layers:3} layers "
              f"in RAM: forecast tg {plan.forecast.decode_tps:7.1f} t/s, "
              f"pp {plan.forecast.prompt_tps:7.1f} t/s")
    for name, plan in planned.items():
        report(model.stem, f"forecast decode, {name}", plan.forecast.decode_tps, "tok/s")
    if args.quick:  # llama-bench is built from source: minutes a fresh checkout can skip
        print(QUICK_NOTE)
        return 0
    measured = measure(args, model, planned)
    if not real_gpu:
        print("no GPU here: both runs are on the CPU, no ratio")
        return 0
    gain = ratio(measured["experts in RAM"], measured["whole layers"], "experts / layers",
                 0.5, 50)
    print(f"experts in RAM / whole layers: {gain:.2f}x generating")
    report(model.stem, "decode, experts in RAM", measured["experts in RAM"], "tok/s",
           measured["whole layers"], "llama-bench, whole layers", "> 1")
    return 0


if __name__ == "__main__":
    sys.exit(main())
