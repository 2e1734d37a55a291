"""Decode speed of each starter model, three ways in one run, with the same thread count:

  api     Homerack's HTTP API, streaming, measured by the client (token arrival times)
  direct  llama-cpp-python's high-level API in this process
  anchor  llama.cpp's own llama-bench (tg128) from the commit llama-cpp-python vendors

Prints the ratios against the anchor. Target: api >= 0.97 x llama-bench at realistic
scale (the Qwen3-1.7B and 8B shapes).

    python -m bench.decode [--model qwen3-8b] [--threads 2] [--tokens 128] [--reps 7] [--quick]
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import httpx

from .common import QUICK_NOTE, arguments, ratio, report, start_engine, timed_completion

from app.paths import paths
from engine.catalog.gguf_file import GGUFInspector
from engine.catalog.models import EMBEDDING_MODEL, STARTERS
from engine.machine.bandwidth import memory_bandwidth

PROMPT = "Once upon a time"


def anchor_once(bins: Path, model: Path, threads: int, tokens: int) -> float:
    from .build_tools import llama_bench

    return float(llama_bench(bins, model, threads, "-p", "0", "-n", str(tokens),
                             "-r", "1")[0]["avg_ts"])


def direct_once(llm, tokens: int) -> float:
    llm.reset()
    stamps = [time.perf_counter() for _ in llm.create_completion(
        PROMPT, max_tokens=tokens, temperature=0, stream=True)]
    return (len(stamps) - 1) / (stamps[-1] - stamps[0])


def api_once(http: httpx.Client, model_id: str, tokens: int, rep: int) -> tuple[float, float]:
    """(client-measured tok/s, engine-reported tok/s)."""
    # A new prompt each rep, so no run reuses the previous one's KV memory.
    rate, usage = timed_completion(http, model_id, f"{PROMPT} ({rep})", tokens,
                                   f"{model_id}, rep {rep}")
    return rate, usage["timings"]["decode_tokens_per_s"]


def bytes_per_token(path: Path) -> float:
    """The weight bytes one token reads, by the speed forecast's rule
    (ModelShape.weights_read_per_token), from the inspector's cached shape."""
    return GGUFInspector().inspect(path).shape.weights_read_per_token()


def report_bound(model: str, path: Path, api: float, anchor: float, bandwidth: float) -> None:
    """Decode as a share of what this machine's memory bandwidth allows (each token
    reads every weight once), for both engines."""
    bound = bandwidth / bytes_per_token(path)
    print(f"{model}: bandwidth bound {bound:.1f} tok/s ({bandwidth / 1e9:.1f} GB/s); "
          f"api {api / bound:.0%} of it, llama-bench {anchor / bound:.0%}")
    report(model, "decode ÷ the memory-bandwidth bound", api / bound, "share", anchor / bound,
           "llama-bench", ">= 0.75 each")


def measure(bins: Path | None, model_id: str, path: Path, threads: int, tokens: int,
            reps: int):
    """Medians of the three, interleaved rep by rep so drift on a noisy machine hits all
    (without `bins`, no anchor)."""
    from llama_cpp import Llama

    engine = start_engine(["--threads", str(threads), "--ctx", "2048", "--model", model_id])
    llm = Llama(str(path), n_ctx=2048, n_threads=threads, n_threads_batch=threads,
                verbose=False)
    runs = {"anchor": [], "direct": [], "api": [], "engine": []}
    try:
        with engine.client(timeout=300) as http:
            api_once(http, model_id, 8, -1)  # warm-up
            direct_once(llm, 8)
            for rep in range(reps):
                if bins:
                    runs["anchor"].append(anchor_once(bins, path, threads, tokens))
                api, engine_side = api_once(http, model_id, tokens, rep)
                runs["api"].append(api)
                runs["engine"].append(engine_side)
                runs["direct"].append(direct_once(llm, tokens))
    finally:
        engine.stop()
        del llm
    return {name: statistics.median(values) if values else None for name, values in runs.items()}


def main() -> int:
    generating = tuple(s.id for s in STARTERS if s.id != EMBEDDING_MODEL)
    args = arguments(__doc__, {"tokens": (128, 8), "reps": (7, 1)}, models=generating)
    from .build_tools import build

    bins = None if args.quick else build()
    rows = []
    for model in args.models:
        result = measure(bins, model, paths().models / f"{model}.gguf", args.threads,
                         args.tokens, args.reps)
        rows.append((model, result["anchor"], result["direct"], result["api"],
                     result["engine"]))
        report(model, "decode, one stream through the API", result["api"], "tok/s",
               result["anchor"], "llama-bench tg", ">= 0.97")

    print(f"\ndecode, {args.tokens} tokens, {args.threads} threads, median of {args.reps}")
    if args.quick:
        for name, _, direct, api, engine_side in rows:
            print(f"{name:<28} direct {direct:6.1f} t/s, api {api:6.1f} t/s "
                  f"(engine {engine_side:6.1f} t/s)")
        print(QUICK_NOTE)
        return 0
    print(f"{'model':<28} {'llama-bench':>11} {'direct':>15} {'api (client)':>17} {'api (engine)':>14}")
    ratios = []
    for name, anchor, direct, api, engine_side in rows:
        # the API cannot decode much faster than llama.cpp's own loop on the same model
        direct_x = ratio(direct, anchor, f"{name} direct", 0.2, 1.3)
        api_x = ratio(api, anchor, f"{name} api", 0.2, 1.3)
        ratios.append(api_x)
        print(f"{name:<28} {anchor:8.1f} t/s {direct:6.1f} ({direct_x:4.2f}x) "
              f"{api:6.1f} ({api_x:4.2f}x) {engine_side:7.1f} t/s")
    print(f"\napi / llama-bench, worst model: {min(ratios):.2f} (target >= 0.97 at realistic scale)")
    bandwidth = memory_bandwidth(512 << 20, 4, args.threads)  # the threads decode reads with
    for name, anchor, _direct, api, _engine in rows:
        report_bound(name, paths().models / f"{name}.gguf", api, anchor, bandwidth)
    return 0


if __name__ == "__main__":
    sys.exit(main())
