"""The cost of grammar-constrained decoding: decode tokens/s of a chat answer held to a
JSON schema (llama.cpp's grammar sampler in the engine's chain) against the same prompt
unconstrained, in one run, side by side; and the same ratio for llama.cpp's llama-server
(vendored commit, `response_format` json_schema) as the anchor.

The schema asks for a string of at least 1,000 characters (the most a schema may ask,
conversation/json_schema.py), so both runs decode the full --tokens (a grammar that completes
early would end the answer sooner). Each ratio is the median of ratios between
neighbouring runs: the machine's speed drifts.

    python -m bench.grammar [--model ID] [--threads 2] [--tokens 128] [--reps 5] [--quick]
"""

from __future__ import annotations

import statistics
import sys

import httpx

from .common import BenchError, QUICK_NOTE, arguments, generated, ratio, report, start_engine

from app.paths import paths
from .build_tools import build, llama_server

MODELS = ("smollm2-135m-instruct-q4_1", "gemma-3-270m-q4_k_m")  # 49k and 262k tokens
PROMPT = [{"role": "user", "content": "Write a long story about a lighthouse keeper, as JSON."}]
SCHEMA = {"type": "object", "properties": {
    "title": {"type": "string", "maxLength": 40},
    "story": {"type": "string", "minLength": 1000}}, "required": ["title", "story"]}


def decode_rate(url: str, headers: dict, tokens: int, constrained: bool, seed: int) -> float:
    body = {"messages": PROMPT, "max_tokens": tokens, "temperature": 0.8, "seed": seed,
            "cache_prompt": False}
    if constrained:
        body["response_format"] = {"type": "json_schema",
                                   "json_schema": {"name": "story", "schema": SCHEMA}}
    else:
        body["ignore_eos"] = True
    reply = httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=600)
    if reply.status_code != 200:
        raise BenchError(f"{url}: {reply.status_code} {reply.text[:300]}")
    data = reply.json()
    what = f"{url} {'constrained' if constrained else 'free'}"
    if headers:  # Homerack's answer: generated, not replayed
        generated(data["usage"], what)
    produced = data["usage"]["completion_tokens"]
    if produced < tokens - 1:
        raise BenchError(f"{what}: only {produced} tokens")
    timings = data.get("timings") or data["usage"]["timings"]
    return timings.get("predicted_per_second") or timings["decode_tokens_per_s"]


def measure(url: str, headers: dict, tokens: int, reps: int) -> dict:
    decode_rate(url, headers, 8, True, 0)  # warm up (and compile the grammar path once)
    free, held, ratios = [], [], []
    for rep in range(reps):
        a = decode_rate(url, headers, tokens, False, rep)
        b = decode_rate(url, headers, tokens, True, rep)
        free.append(a)
        held.append(b)
        ratios.append(ratio(b, a, f"{url} constrained/free", 0.05, 1.5))
    return {"free": statistics.median(free), "constrained": statistics.median(held),
            "ratio": statistics.median(ratios)}


def main() -> int:
    args = arguments(__doc__, {"tokens": (128, 8), "reps": (5, 1)}, models=MODELS)
    bins = None if args.quick else build()
    rows = []
    for model in args.models:
        engine = start_engine(["--threads", str(args.threads), "--ctx", "4096", "--model", model,
                               "--parallel", "1", "--no-prompt-cache"])
        try:
            rows.append((model, "homerack", measure(engine.url, engine.headers, args.tokens,
                                                    args.reps)))
        finally:
            engine.stop()
        if not bins:
            continue
        server_args = ["-m", str(paths().models / f"{model}.gguf"), "-c", "4096", "-np", "1",
                       "-t", str(args.threads), "--jinja"]
        with llama_server(bins, server_args) as anchor_url:
            rows.append((model, "llama-server", measure(anchor_url, {}, args.tokens, args.reps)))
    theirs = {model: r["ratio"] for model, server, r in rows if server == "llama-server"}
    for model, server, r in rows:
        if server == "homerack":
            report(model, "JSON-schema decode ÷ free decode", r["ratio"], "x",
                   theirs.get(model), "the same in llama-server", ">= 1")
    print(f"\ndecode tokens/s, {args.tokens} tokens, temperature 0.8, {args.threads} threads, "
          f"median of {args.reps}")
    print(f"{'model':<30}{'server':<14}{'free':>8}{'json schema':>13}{'ratio':>8}")
    for model, server, r in rows:
        print(f"{model:<30}{server:<14}{r['free']:>8.1f}{r['constrained']:>13.1f}"
              f"{r['ratio']:>7.2f}x")
    print(f"\n{QUICK_NOTE} (llama-server); the ratios above are constrained against free"
          if args.quick else
          "\ntarget: constrained at >= 0.9x of free, and no further behind than llama-server")
    return 0


if __name__ == "__main__":
    sys.exit(main())
