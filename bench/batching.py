"""Continuous batching: aggregate decode tokens/s of 1, 2, 4 and 8 concurrent streaming
requests against the same requests one after another, in one run, through the API
(streaming, prompts interleaved with running streams), on Gemma 3 270M Q4_K_M and
SmolLM2; p50/p95 inter-token latency per stream; and the same workloads of 2 streams
and more through llama.cpp's own llama-server -np (the most streams; vendored commit) as
the anchor.

Targets: >= 1.7x at 4 and >= 2x at 8 streams on Gemma, >= 1.4x at 4 on SmolLM2, ahead
of llama-server in the same run.

    python -m bench.batching [--model ID] [--threads 2] [--tokens 128] [--quick]
"""

from __future__ import annotations

import statistics
import sys
import threading
import time

from .common import QUICK_NOTE, arguments, ratio, report, start_engine, stream_times

from app.paths import paths
from .build_tools import build, llama_server

MODELS = ("gemma-3-270m-q4_k_m", "smollm2-135m-instruct-q4_1")
PROMPTS = ["The history of Rome", "def fibonacci(n):", "Once upon a time", "The best way to cook rice",
           "In physics, energy", "SELECT name FROM", "My favourite animal is", "Dear Sir,"]


def one(url: str, headers: dict, prompt: str, tokens: int, model: str | None) -> list[float]:
    """One streamed completion of exactly `tokens` tokens; when each chunk arrived. From
    Homerack (`model` given) the answer's usage is checked: generated, all the tokens."""
    body = {"prompt": prompt, "cache_prompt": False, **({"model": model} if model else {})}
    return stream_times(url, headers, body, tokens, checked=model is not None)


def workload(url: str, headers: dict, streams: int, tokens: int, model: str | None) -> dict:
    """`streams` requests at once (each started a little after the previous, so prompts
    join running streams), against the same requests one after another."""
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(streams)]
    start = time.perf_counter()
    for prompt in prompts:
        one(url, headers, prompt, tokens, model)
    sequential = time.perf_counter() - start
    results: list[list[float]] = [[] for _ in prompts]

    def run(i):
        results[i] = one(url, headers, prompts[i], tokens, model)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(streams)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
        time.sleep(0.02)
    for thread in threads:
        thread.join()
    concurrent = time.perf_counter() - start
    gaps = sorted(b - a for times in results for a, b in zip(times, times[1:]))
    return {"streams": streams, "sequential_tps": streams * tokens / sequential,
            "concurrent_tps": streams * tokens / concurrent, "ratio": sequential / concurrent,
            "p50_ms": 1000 * statistics.median(gaps),
            "p95_ms": 1000 * gaps[int(0.95 * (len(gaps) - 1))]}


def homerack_rows(model: str, threads: int, counts: list[int], tokens: int) -> list:
    engine = start_engine(["--threads", str(threads), "--ctx", "4096", "--model", model,
                           "--parallel", str(max(counts)), "--no-prompt-cache"])
    try:
        one(engine.url, engine.headers, "warm up", 8, model)
        return [(model, "homerack", workload(engine.url, engine.headers, n, tokens, model))
                for n in counts]
    finally:
        engine.stop()


def anchor_rows(bins, model: str, threads: int, counts: list[int], tokens: int) -> list:
    server_args = ["-m", str(paths().models / f"{model}.gguf"), "-c", "4096", "-np",
                   str(max(counts)), "-t", str(threads)]
    with llama_server(bins, server_args) as anchor_url:
        one(anchor_url, {}, "warm up", 8, None)
        return [(model, f"llama-server -np {max(counts)}",
                 workload(anchor_url, {}, n, tokens, None)) for n in counts if n > 1]


def check(rows: list) -> None:
    """Batching cannot beat one stream per stream: a ratio over the stream count means
    the concurrent run did less work (as when answers were replayed from a cache)."""
    for model, server, r in rows:
        ratio(r["concurrent_tps"], r["sequential_tps"], f"{model} {server} at {r['streams']}",
              0.3, r["streams"] * 1.2)


def report_rows(rows: list) -> None:
    """Each count's gain (together ÷ one by one), against llama-server's at that count."""
    theirs = {(model, r["streams"]): r["ratio"] for model, server, r in rows
              if server != "homerack"}
    for model, server, r in rows:
        if server == "homerack" and r["streams"] > 1:
            report(model, f"{r['streams']} streams together ÷ one by one", r["ratio"], "x",
                   theirs.get((model, r["streams"])), "the same gain in llama-server",
                   ">= 1" if r["streams"] > 2 else ">= 1, and the gain >= 1")


def main() -> int:
    args = arguments(__doc__, {"tokens": (128, 4), "streams": ("1,2,4,8", "1,2")}, models=MODELS)
    counts = [int(n) for n in args.streams.split(",")]
    bins = None if args.quick else build()
    rows = []
    for model in args.models:
        rows += homerack_rows(model, args.threads, counts, args.tokens)
        if bins:
            rows += anchor_rows(bins, model, args.threads, counts, args.tokens)
    check(rows)
    report_rows(rows)
    print(f"\naggregate decode tokens/s, {args.tokens} tokens a stream, {args.threads} threads")
    print(f"{'model':<28}{'server':<20}{'streams':>8}{'one by one':>12}{'together':>10}"
          f"{'ratio':>8}{'p50 ms':>8}{'p95 ms':>8}")
    for model, server, r in rows:
        print(f"{model:<28}{server:<20}{r['streams']:>8}{r['sequential_tps']:>12.1f}"
              f"{r['concurrent_tps']:>10.1f}{r['ratio']:>7.2f}x{r['p50_ms']:>8.1f}{r['p95_ms']:>8.1f}")
    if args.quick:
        print(f"\n{QUICK_NOTE} (llama-server); the ratios above are one-by-one against together")
        return 0
    print("\ntargets: Gemma >= 1.7x at 4 and >= 2x at 8, SmolLM2 >= 1.4x at 4, "
          "ahead of llama-server -np at each count, 2 streams never slower than one")
    return 0


if __name__ == "__main__":
    sys.exit(main())
