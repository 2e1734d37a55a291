"""Decode speed with a long conversation already in context: a reasoning model writes
thousands of tokens and an agent sends tens of thousands, so what matters is the speed at
depth. Two ways in one run, the same thread count:

  api     Homerack's API: a prompt of DEPTH tokens, then TOKENS generated; the decode
          speed the engine reports in the answer's usage (the prompt's evaluation is not
          in it), and the client's own timing of the text's arrival beside it where the
          text came in enough pieces (random weights write bytes that stream together)
  anchor  llama.cpp's own llama-bench at that depth (-d DEPTH -n TOKENS)

Prints api / llama-bench at each depth. Target: >= 0.95 at 4k and 16k, at the Qwen3-1.7B
and 8B shapes.

    python -m bench.depth [--model qwen3-1.7b] [--depths 4096,16384] [--tokens 64]
                          [--reps 3] [--threads 2] [--quick]
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import httpx

from .common import QUICK_NOTE, arguments, ratio, report, start_engine, streamed_completion

from app.paths import paths

SENTENCE = "The river keeps its course through the valley while the town sleeps. "


def anchor_once(bins: Path, model: Path, threads: int, depth: int, tokens: int) -> float:
    from .build_tools import llama_bench

    return float(llama_bench(bins, model, threads, "-p", "0", "-n", str(tokens),
                             "-d", str(depth), "-r", "1")[0]["avg_ts"])


def api_once(http: httpx.Client, model_id: str, prompt: str, tokens: int,
             what: str) -> tuple[float, float | None]:
    """(the engine's decode tok/s, the client's from the text's arrival or None)."""
    stamps, usage = streamed_completion(http, model_id, prompt, tokens, what)
    client = (len(stamps) - 1) / (stamps[-1] - stamps[0]) if len(stamps) > tokens // 2 \
        else None
    return usage["timings"]["decode_tokens_per_s"], client


def prompt_of(http: httpx.Client, model_id: str, depth: int) -> str:
    """Text of `depth` tokens or a few less, in the model's own tokens."""
    per = len(http.post("/tokenize", json={"content": SENTENCE * 8, "model": model_id})
              .json()["tokens"]) / 8
    text = SENTENCE * int(depth / per)
    while len(http.post("/tokenize", json={"content": text, "model": model_id})
              .json()["tokens"]) > depth - 8:
        text = text[:-len(SENTENCE)]
    return text


def measure(bins: Path | None, model_id: str, depths: list[int], threads: int, tokens: int,
            reps: int) -> dict[int, dict]:
    """Medians at each depth, anchor and API interleaved rep by rep. The API's prompt is
    the same at every rep: its evaluation is cached, not timed, and the decode that
    follows runs at the same depth."""
    path = paths().models / f"{model_id}.gguf"
    engine = start_engine(["--threads", str(threads), "--ctx", str(max(depths) + tokens + 64),
                           "--model", model_id])
    out = {}
    try:
        with engine.client(timeout=3600) as http:
            for depth in depths:
                prompt = prompt_of(http, model_id, depth)
                api_once(http, model_id, prompt, 8, f"{model_id} warm-up at {depth}")
                runs = {"anchor": [], "api": [], "client": []}
                for rep in range(reps):
                    if bins:
                        runs["anchor"].append(anchor_once(bins, path.resolve(), threads,
                                                          depth, tokens))
                    engine_side, client = api_once(http, model_id, prompt, tokens,
                                                   f"{model_id} at {depth}, rep {rep}")
                    runs["api"].append(engine_side)
                    runs["client"] += [client] if client else []
                out[depth] = {k: statistics.median(v) if v else None for k, v in runs.items()}
    finally:
        engine.stop()
    return out


def main() -> int:
    # quick mode runs the starter: writing a shape's random weights takes longer than it
    shapes = ("smollm2-135m-instruct-q4_1",) if "--quick" in sys.argv else \
        ("qwen3-1.7b", "qwen3-8b")
    args = arguments(__doc__, {"tokens": (64, 8), "reps": (3, 1),
                               "depths": ("4096,16384", "256")}, models=shapes)
    from .build_tools import build

    bins = None if args.quick else build()
    depths = [int(d) for d in args.depths.split(",")]
    rows = []
    for model in args.models:
        for depth, result in measure(bins, model, depths, args.threads, args.tokens,
                                     args.reps).items():
            rows.append((model, depth, result["api"], result["anchor"], result["client"]))
            report(model, f"decode at depth {depth}", result["api"], "tok/s",
                   result["anchor"], "llama-bench -d", ">= 0.95")
    print(f"\ndecode after DEPTH tokens in context, {args.tokens} tokens, {args.threads} "
          f"threads, median of {args.reps}")
    if args.quick:
        for model, depth, api, _, _ in rows:
            print(f"{model:<28} depth {depth:>6}: api {api:6.1f} t/s")
        print(QUICK_NOTE)
        return 0
    print(f"{'model':<28} {'depth':>6} {'llama-bench':>12} {'api':>10} {'ratio':>6} "
          f"{'client':>10}")
    for model, depth, api, anchor, client in rows:
        x = ratio(api, anchor, f"{model} at {depth}", 0.2, 1.3)
        seen = f"{client:6.1f} t/s" if client else "   -"
        print(f"{model:<28} {depth:>6} {anchor:8.1f} t/s {api:6.1f} t/s {x:5.2f}x {seen}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
