"""A GPU in one command: what Homerack plans and how it runs with its defaults, each
figure against llama.cpp's own tools on the same file in the same run (issue 53's table).

  plan      the planner's placement, context, lanes, flash attention and forecast
  1 stream  decode tok/s: Homerack's API against llama-server -np 1, and llama-bench tg
  4, 16     all streams' tok/s together, short prompts, against llama-server -np 16
  prompt    a ~3,000-token prompt's time to its first token, against llama-server -np 1
            (-np 16 gives each slot a sixteenth of the context), and llama-bench pp
  TTFT      the median time to first token of 16 clients with ~300-token prompts at once
  memory    what the driver says the engine holds on the GPU, against the plan's total

It runs on what llama.cpp was built for: on a GPU machine `../shared/device/run.sh`
builds it for CUDA and points HOMERACK_DEVICE_BINS at its llama-bench and llama-server
(`bash .device/run.sh 'python3 -m bench.gpu --model qwen3-8b'`); on a machine without one
it measures the CPU. Targets on a GPU: one stream >= 0.97x and 16 streams >= 0.9x of
llama-server, no request failing.

    python -m bench.gpu [--model qwen3-8b] [--tokens 128] [--quick]
"""

from __future__ import annotations

import random
import shutil
import statistics
import subprocess
import sys
import time

from .batching import VOCABULARY, all_at_once, own_prompt
from .build_tools import build, llama_bench, llama_server
from .common import QUICK_NOTE, arguments, at_once, ratio, report, start_engine, stream_times

from app.paths import paths

MODELS = ("smollm2-135m-instruct-q4_1",)  # a GPU run names a shape: --model qwen3-8b


def gpu_memory_mib() -> int | None:
    """GPU memory in use on the first GPU, as the driver reports it (None: no driver)."""
    if not shutil.which("nvidia-smi"):
        return None
    done = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,"
                           "nounits"], capture_output=True, text=True)
    return int(done.stdout.split()[0]) if done.returncode == 0 and done.stdout.strip() else None


def show_plan(model: str, health: dict, held_mib: int | None) -> None:
    """The plan as /health reports it, and the GPU memory measured against it."""
    plan, lanes = (health.get("memory") or {}).get("plan") or {}, health["batching"]
    forecast = plan.get("forecast") or {}
    gpus = [d for d in plan.get("devices", []) if d["device"] != "CPU"]
    planned = sum(d["total"] for d in gpus) / 2**20
    print(f"plan: {plan.get('n_gpu_layers')} of {plan.get('n_layers')} layers on the GPU, "
          f"{health['n_ctx']:,}-token context, KV {plan.get('kv_type')}, flash attention "
          f"{health.get('flash_attn')}, {lanes['parallel']} lanes ({lanes['lanes_why']}); "
          f"forecast {forecast.get('decode_tokens_per_s')} tok/s decode")
    if held_mib is None:
        print("GPU memory: no GPU driver here")
        return
    print(f"GPU memory: {held_mib:,} MiB held by the engine against {planned:,.0f} MiB planned")
    report(model, "GPU memory held, against the plan", held_mib, "MiB", planned or None,
           "the plan's GPU total")


def one_stream(url: str, headers: dict, model: str | None, tokens: int) -> float:
    times = stream_times(url, headers, {"prompt": f"Run {random.random()}: Once upon a time",
                                        **({"model": model} if model else {})},
                         tokens, checked=model is not None)
    return (len(times) - 1) / (times[-1] - times[0])


def first_token_s(url: str, headers: dict, model: str | None, prompt: str) -> float:
    start = time.perf_counter()
    times = stream_times(url, headers, {"prompt": prompt, **({"model": model} if model else {})},
                         2, checked=model is not None)
    return times[0] - start


def long_prompt(words: int) -> str:
    rng = random.Random(words)
    return f"Run {random.random()}. " + " ".join(rng.choice(VOCABULARY) for _ in range(words))


def median_ttft(url: str, headers: dict, model: str | None, clients: int) -> float:
    """The median first-token time of `clients` requests with prompts of their own, sent
    together."""
    run = f"Run {random.random()}"
    return statistics.median(at_once(
        lambda i: first_token_s(url, headers, model, own_prompt(i, True, run)),
        list(range(clients))))


def alone(url: str, headers: dict, model: str | None, args) -> dict:
    """One request at a time: decode tok/s (best of --reps) and a long prompt's time to
    its first token (the least of --reps)."""
    return {"1 stream": max(one_stream(url, headers, model, args.tokens)
                            for _ in range(args.reps)),
            "prompt": min(first_token_s(url, headers, model, long_prompt(args.prompt))
                          for _ in range(args.reps))}


def together(url: str, headers: dict, model: str | None, args) -> dict:
    """Streams at once: all their tok/s together (short prompts), and the median first
    token of --clients requests with ~300-token prompts."""
    figures = {}
    for n in sorted({min(4, args.clients), args.clients}):
        prompts = [own_prompt(i, False, f"Run {random.random()}") for i in range(n)]
        figures[f"{n} streams"] = n * args.tokens / all_at_once(url, headers, prompts,
                                                                args.tokens, model)
    figures["TTFT"] = median_ttft(url, headers, model, args.clients)
    return figures


def main() -> int:
    args = arguments(__doc__, {"tokens": (128, 4), "clients": (16, 2), "prompt": (2900, 200),
                               "reps": (3, 1)}, models=MODELS)
    model = args.models[-1]
    bins = None if args.quick else build()
    before = gpu_memory_mib()
    engine = start_engine(["--threads", str(args.threads), "--model", model])
    try:
        health = engine.health()
        held = gpu_memory_mib()
        show_plan(model, health, held - before if held is not None else None)
        ours = {**alone(engine.url, engine.headers, model, args),
                **together(engine.url, engine.headers, model, args)}
    finally:
        engine.stop()
    theirs, bench = {}, {}
    if bins:
        path = paths().models / f"{model}.gguf"
        server = ["-m", str(path), "-c", str(health["n_ctx"]), "-ngl", "999", "-t",
                  str(args.threads)]
        with llama_server(bins, [*server, "-np", "1"]) as url:  # its whole context
            theirs = alone(url, {}, None, args)
        with llama_server(bins, [*server, "-np", str(args.clients)]) as url:
            theirs |= together(url, {}, None, args)
        bench = {
            "1 stream": llama_bench(bins, path, args.threads, "-p", "0", "-n",
                                    str(args.tokens), "-ngl", "99")[0]["avg_ts"],
            "prompt": llama_bench(bins, path, args.threads, "-p", str(args.prompt),
                                  "-n", "0", "-ngl", "99")[0]["avg_ts"]}
    return print_table(model, args, ours, theirs, bench)


def print_table(model: str, args, ours: dict, theirs: dict, bench: dict) -> int:
    print(f"\n{model}, {args.tokens} tokens a stream, {args.clients} clients at most")
    print("streams in tok/s (all together), prompt and TTFT in seconds; llama-bench in t/s")
    print(f"{'':<12}{'Homerack':>12}{'llama-server':>14}{'ratio':>8}{'llama-bench':>13}")
    for name, ours_value in ours.items():
        seconds = name in ("prompt", "TTFT")
        unit = "s" if seconds else "tok/s"
        line = f"{name:<12}{ours_value:>12.2f}"
        if name in theirs:
            gain = ratio(*((1 / ours_value, 1 / theirs[name]) if seconds
                           else (ours_value, theirs[name])),
                         f"{name} against llama-server (speed)", 0.05, 20)
            line += f"{theirs[name]:>14.2f}{gain:>7.2f}x"
            report(model, f"{name} (Homerack's defaults)", ours_value, unit, theirs[name],
                   "llama-server -np " + ("1" if name in ("1 stream", "prompt")
                                          else str(args.clients)),
                   {"1 stream": ">= 0.97", f"{args.clients} streams": ">= 0.9"}.get(name, ""))
        if name in bench:
            line += f"{bench[name]:>13.1f}"
        print(line)
    if not theirs:
        print(f"\n{QUICK_NOTE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
