"""Mixture-of-experts placement, measured on a random-weight Qwen3-MoE (fixtures/shapes.py:
16 experts, top-4, valid Q4_K/Q6_K blocks; it runs at the speed of real weights):

  decode, prompt   through the API (streaming, client-timed decode; the engine's prompt
                   rate) against llama-bench tg (after as many tokens as the API's
                   prompt, -d) and pp on the same file with the same expert override,
                   in the same run (target >= 0.95x); decode also against llama-server
                   streaming the same prompts to the same client (what HTTP costs it)
  forecast         the plan's tokens/s before any calibration, against the rates
                   measured; then an engine restarted on the same calibration file:
                   its corrected forecast against its own measurement (target <= 15%)
  planner          decision time for the six real shapes (header-only files; < 50 ms)

On a machine without a GPU every tensor is on the CPU and the expert override changes
nothing; it is passed all the same, and the plan says so.

    python -m bench.moe [--model qwen3-30b-a3b-8l] [--threads 2] [--tokens 128] [--prompt 256] [--reps 3] [--quick]
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from .common import (QUICK_NOTE, BenchError, arguments, ratio, report, start_engine,
                    stream_times, timed_completion)

from app.paths import paths
from fixtures.shapes import RUNNABLE_MOE, SHAPES, cached

REAL = ("gpt-oss-120b", "qwen3-30b-a3b", "qwen3-235b-a22b", "glm-4.5-air", "llama-3.3-70b",
        "qwen3-8b")
def experts_override(layers: int) -> list[str]:
    """llama-bench's -ot for the routed experts of the first `layers` layers in RAM (none:
    no override, which on a machine without a GPU also keeps the repacked CPU weights
    that an override to the plain CPU buffer would give up)."""
    if not layers:
        return []
    blocks = "|".join(str(i) for i in range(layers))
    return ["-ot", rf"blk\.({blocks})\.ffn_(up|down|gate_up|gate)_(ch|)exps=CPU"]


def anchor(bins: Path, model: Path, args, experts_in_ram: int) -> tuple[float, float, float]:
    """llama-bench's (pp tok/s, tg tok/s from an empty context, tg tok/s after `prompt`
    tokens), experts placed as the plan placed them. The API's tokens follow a prompt of
    that many: their like is the last (attention over 256 more cells costs this MoE
    about 7% here)."""
    from .build_tools import llama_bench

    rows = llama_bench(bins, model, args.threads, "-p", str(args.prompt), "-n", str(args.tokens),
                       "-d", f"0,{args.prompt}", "-r", str(args.reps),
                       *experts_override(experts_in_ram))
    return (next(r["avg_ts"] for r in rows if r["n_prompt"] and not r["n_depth"]),
            next(r["avg_ts"] for r in rows if r["n_gen"] and not r["n_depth"]),
            next(r["avg_ts"] for r in rows if r["n_gen"] and r["n_depth"]))


def new_prompt(prompt: int, rep: str) -> str:
    """About `prompt` tokens that no cache holds (`rep` makes them new)."""
    return f"({rep}) " + " ".join(f"word{i}{rep}" for i in range(prompt // 4))


def api_once(http, model: str, tokens: int, prompt: int, rep: str) -> tuple[float, float]:
    """(client-timed decode tok/s, engine-timed prompt tok/s) of one streamed answer."""
    rate, usage = timed_completion(http, model, new_prompt(prompt, rep), tokens, f"rep {rep}")
    return rate, usage["timings"]["prompt_tokens_per_s"]


def served_by_llama(bins: Path, model: Path, args, experts_in_ram: int) -> float:
    """llama-server's streamed decode tok/s on the same file, prompts and placement, timed
    by the same client: what streaming over HTTP costs llama.cpp itself on this machine
    (its HTTP threads and the client share the cores that the decode threads fill)."""
    from .build_tools import llama_server

    server = ["-m", str(model), "-t", str(args.threads), "-c", "2048", "-np", "1",
              *experts_override(experts_in_ram)]
    rates = []
    with llama_server(bins, server) as url:
        for rep in range(args.reps):
            body = {"prompt": new_prompt(args.prompt, f"server {rep}")}
            times = stream_times(url, {}, body, args.tokens, checked=False)[:args.tokens]
            if len(times) < args.tokens // 2:
                raise BenchError(f"llama-server streamed {len(times)} of {args.tokens} tokens")
            rates.append((len(times) - 1) / (times[-1] - times[0]))
    return statistics.median(rates)


def engine_run(home: Path, model: Path, args, run: int) -> dict:
    """One engine on `home` (its calibration file persists there): the plan's forecast
    when it loaded, the measured rates, and what the load's details say of the error."""
    engine = start_engine(["--threads", str(args.threads), "--ctx", "2048", "--parallel", "1",
                           "--model", str(model)], env={**os.environ, "HOMERACK_HOME": str(home)})
    try:
        with engine.client(timeout=600) as http:
            plan = engine.health()["memory"]["plan"]
            decode, prompt = [], []
            for rep in range(args.reps):
                d, p = api_once(http, model.stem, args.tokens, args.prompt, f"{run}.{rep}")
                decode.append(d)
                prompt.append(p)
            speed = engine.health()["memory"].get("speed", {})
    finally:
        engine.stop()
    return {"forecast": plan["forecast"], "cpu_moe_layers": plan["cpu_moe_layers"],
            "decode": statistics.median(decode), "prompt": statistics.median(prompt),
            "speed": speed}


def decision_times(rounds: int) -> dict[str, float]:
    from engine.catalog.gguf_file import GGUFInspector
    from engine.machine.hardware import simulated
    from engine.machine.planner import Preferences, plan

    machine = simulated((24,), 64, cores=8, gpu_bandwidth_gbs=936, ram_bandwidth_gbs=60)
    times = {}
    for name in REAL:
        shape = GGUFInspector().inspect(cached(SHAPES[name])).shape
        runs = []
        for _ in range(rounds):
            start = time.perf_counter()
            plan(machine, shape, Preferences(ctx=32768))
            runs.append(time.perf_counter() - start)
        times[name] = statistics.median(runs) * 1000
    return times


def error(forecast: float, measured: float) -> str:
    return f"{forecast:7.1f} vs {measured:7.1f} ({forecast / measured - 1:+.0%})"


def main() -> int:
    # quick: just enough for the engine to record rates (engine/model/host.py: not a load's first)
    args = arguments(__doc__, {"tokens": (128, 16), "prompt": (256, 128), "reps": (4, 2)},
                     models=(RUNNABLE_MOE.name,))
    name = args.models[0].removesuffix("-random")  # one model a run
    spec = SHAPES.get(name)
    model = (paths().models / f"{args.models[0]}.gguf").resolve()
    bins = None
    if not args.quick:
        from .build_tools import build

        bins = build()
    with tempfile.TemporaryDirectory(prefix="homerack-moe-") as home:
        first = engine_run(Path(home), model, args, 1)
        # llama-bench on either side of the measured engine: this machine's speed drifts
        # (10% between runs minutes apart), and their mean is what the engine ran beside
        anchor_before = bins and anchor(bins, model, args, first["cpu_moe_layers"])
        second = engine_run(Path(home), model, args, 2)
    where = (f"experts of {first['cpu_moe_layers']} layers in RAM" if first["cpu_moe_layers"]
             else "no GPU here: every tensor on the CPU")
    experts = f"{spec.n_expert} experts, top-{spec.n_expert_used}, " if spec else ""
    print(f"\n{model.name}: {experts}{args.threads} threads; plan: {where}")
    for phase, key in (("decode", "decode_tokens_per_s"), ("prompt", "prompt_tokens_per_s")):
        before = first["forecast"][f"uncalibrated_{key}"]
        after = second["forecast"][key]
        if not second["forecast"]["calibrated"]:
            raise BenchError("the second engine's forecast was not calibrated by the first")
        print(f"forecast {phase:6} before calibration {error(before, first[phase])}, "
              f"after {error(after, second[phase])}")
        report(name, f"{phase} forecast after calibration ÷ measured", after / second[phase],
               "x", target="within 15%")
    for shape_name, ms in decision_times(3 if args.quick else 20).items():
        print(f"planner {shape_name:<16} {ms:6.2f} ms")
    if args.quick:
        print(f"api decode {second['decode']:.1f} t/s, prompt {second['prompt']:.1f} t/s")
        print(QUICK_NOTE)
        return 0
    anchor_after = anchor(bins, model, args, second["cpu_moe_layers"])
    pp, tg_empty, tg = (statistics.mean(pair) for pair in zip(anchor_before, anchor_after))
    print(f"llama-bench tg @ d{args.prompt} before and after the engine: "
          f"{anchor_before[2]:.1f}, {anchor_after[2]:.1f} t/s")
    served = served_by_llama(bins, model, args, second["cpu_moe_layers"])
    decode_x = ratio(second["decode"], tg, "api decode", 0.3, 1.3)
    served_x = ratio(second["decode"], served, "api decode against llama-server", 0.3, 1.5)
    prompt_x = ratio(second["prompt"], pp, "api prompt", 0.3, 1.5)
    print(f"api decode {second['decode']:.1f} t/s vs llama-bench tg{args.tokens} @ d{args.prompt} "
          f"{tg:.1f}: {decode_x:.2f}x (target >= 0.95); from an empty context llama-bench "
          f"makes {tg_empty:.1f}: {second['decode'] / tg_empty:.2f}x")
    print(f"streamed by llama-server on the same prompts {served:.1f} t/s ({served / tg:.2f}x "
          f"llama-bench): the api makes {served_x:.2f}x llama-server's")
    print(f"api prompt {second['prompt']:.1f} t/s vs llama-bench pp{args.prompt} {pp:.1f}: "
          f"{prompt_x:.2f}x")
    report(name, f"decode after a {args.prompt}-token prompt, one stream through the API",
           second["decode"], "tok/s", tg, f"llama-bench tg @ d{args.prompt}", ">= 0.95")
    report(name, f"decode after a {args.prompt}-token prompt, streamed", second["decode"],
           "tok/s", served, "llama-server, streamed", ">= 1.0")
    report(name, f"prompt ({args.prompt} tokens)", second["prompt"], "tok/s", pp,
           "llama-bench pp", ">= 0.95")
    return 0


if __name__ == "__main__":
    sys.exit(main())
