"""Continuous batching: aggregate decode tokens/s of 1, 2, 4 and 8 concurrent streaming
requests against the same requests one after another, in one run, through the API
(streaming, prompts interleaved with running streams), on Gemma 3 270M Q4_K_M and
SmolLM2; p50/p95 inter-token latency per stream; and the same workloads of 2 streams
and more through llama.cpp's own llama-server -np (the most streams; vendored commit) as
the anchor.

Targets: >= 1.7x at 4 and >= 2x at 8 streams on Gemma, >= 1.4x at 4 on SmolLM2, ahead
of llama-server in the same run.

Then the many-clients proxy (issue 53's, for a GPU's sixteen conversations): on the first
model, 16 streams at once, each with a prompt of its own (~300 tokens, or a short one)
and 64 generated tokens, end to end, Homerack with its default settings (the plan's
lanes) against llama-server -np 16 on the same file, alternating, medians of 3; and the
engine's own milliseconds per step outside llama_decode (/health).

    python -m bench.batching [--model ID] [--threads 2] [--tokens 128] [--quick]
"""

from __future__ import annotations

import random
import statistics
import sys
import threading
import time
from contextlib import ExitStack

from .common import (QUICK_NOTE, arguments, at_once, ratio, report, start_engine,
                     stream_times)

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


VOCABULARY = ("river bridge garden window market winter candle harbor meadow lantern valley "
              "thunder orchard pepper silver forest mirror ladder copper basket").split()


def own_prompt(i: int, long: bool, run: str) -> str:
    """Stream i's prompt: about 300 tokens no other stream shares, or a short one; `run`
    makes them new to every prompt cache (the disk tier outlives the engine). The stream's
    number comes first: the short texts cycle, and a prompt that shared the run's tag (a
    dozen tokens) or an earlier one's text let llama-server's cache keep two thirds of
    it, so the comparison measured its cache, not its batching."""
    if not long:
        return f"Stream {i} of {run}: {PROMPTS[i % len(PROMPTS)]}"
    rng = random.Random(i)
    return f"{run}, note {i}. " + " ".join(rng.choice(VOCABULARY) for _ in range(290))


def all_at_once(url: str, headers: dict, prompts: list[str], tokens: int,
                model: str | None) -> float:
    """Seconds from the first request to the end of the last of these streams, sent
    together (each exactly `tokens` tokens; Homerack's checked as generated)."""
    start = time.perf_counter()
    at_once(lambda prompt: stream_times(
        url, headers, {"prompt": prompt, **({"model": model} if model else {})}, tokens,
        checked=model is not None), prompts)
    return time.perf_counter() - start


def many_clients(bins, model: str, threads: int, streams: int, tokens: int,
                 reps: int) -> None:
    """The proxy: `streams` clients at once, with long and short prompts, against
    llama-server -np `streams` (none in quick mode), alternating."""
    with ExitStack() as stack:
        engine = start_engine(["--threads", str(threads), "--model", model])  # defaults
        stack.callback(engine.stop)
        anchor_url = stack.enter_context(llama_server(bins, [
            "-m", str(paths().models / f"{model}.gguf"), "-c", "8192", "-np", str(streams),
            "-t", str(threads)])) if bins else None
        _compare(engine, anchor_url, model, streams, tokens, reps)


def _compare(engine, anchor_url: str | None, model: str, streams: int, tokens: int,
             reps: int) -> None:
    for url, headers, name in ((engine.url, engine.headers, model),
                               (anchor_url, {}, None)):
        if url:
            all_at_once(url, headers, ["warm up"], 8, name)
    lanes = engine.health()["batching"]
    print(f"\n{streams} clients at once, {tokens} tokens each, end to end; Homerack's "
          f"defaults: {lanes['parallel']} lanes ({lanes['lanes_why']})")
    print(f"{'prompts':<22}{'Homerack':>10}{'tok/s':>8}{'llama-server':>14}{'tok/s':>8}"
          f"{'ratio':>8}")
    run = f"Run {random.randrange(10 ** 9)}"
    for long in (True, False):
        ours, theirs = [], []
        for rep in range(reps):  # prompts new to both servers each time: no cache helps
            prompts = [own_prompt(rep * streams + i, long, run) for i in range(streams)]
            ours.append(all_at_once(engine.url, engine.headers, prompts, tokens, model))
            if anchor_url:
                theirs.append(all_at_once(anchor_url, {}, prompts, tokens, None))
        total = streams * tokens
        ours_s = statistics.median(ours)
        what = "~300-token prompts" if long else "short prompts"
        if not theirs:
            print(f"{what:<22}{ours_s:>9.2f}s{total / ours_s:>8.1f}")
            continue
        theirs_s = statistics.median(theirs)
        gain = ratio(total / ours_s, total / theirs_s, f"{what} against llama-server",
                     0.2, 5)
        print(f"{what:<22}{ours_s:>9.2f}s{total / ours_s:>8.1f}{theirs_s:>13.2f}s"
              f"{total / theirs_s:>8.1f}{gain:>7.2f}x")
        report(model, f"{streams} clients at once, {what}, end to end", total / ours_s,
               "tok/s", total / theirs_s, f"llama-server -np {streams}",
               ">= 0.9" if long else ">= 1")
    batching = engine.health()["batching"]
    host = batching["host_ms_per_step"]
    print(f"the engine's own time per step, outside llama_decode: {host:.2f} ms; llama.cpp "
          f"ran the last step's graph again in {batching['graphs_reused']} of "
          f"{batching['steps']} steps")
    report(model, "milliseconds per step outside llama_decode", host, "ms")


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
    args = arguments(__doc__, {"tokens": (128, 4), "streams": ("1,2,4,8", "1,2"),
                               "clients": (16, 2), "answer": (64, 4),
                               "reps": (3, 1)}, models=MODELS)
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
    many_clients(bins, args.models[-1], args.threads, args.clients, args.answer,
                 args.reps)
    if args.quick:
        print(f"\n{QUICK_NOTE} (llama-server); the ratios above are one-by-one against together")
        return 0
    print("\ntargets: Gemma >= 1.7x at 4 and >= 2x at 8, SmolLM2 >= 1.4x at 4, "
          "ahead of llama-server -np at each count, 2 streams never slower than one")
    return 0


if __name__ == "__main__":
    sys.exit(main())
