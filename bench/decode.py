"""Decode speed of each starter model, three ways in one run, with the same thread count:

  api     Homerack's HTTP API, streaming, measured by the client (token arrival times)
  direct  llama-cpp-python's high-level API in this process
  anchor  llama.cpp's own llama-bench (tg128) from the commit llama-cpp-python vendors

Prints the ratios against the anchor. Target: api >= 0.95 x llama-bench.

    python bench/decode.py [--threads 2] [--tokens 128] [--reps 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.engine_proc import EngineProcess  # noqa: E402
from app.paths import paths  # noqa: E402
from engine.models import STARTERS  # noqa: E402

PROMPT = "Once upon a time"


def anchor_tps(bins: Path, model: Path, threads: int, tokens: int, reps: int) -> float:
    result = subprocess.run(
        [str(bins / "llama-bench"), "-m", str(model), "-t", str(threads), "-p", "0",
         "-n", str(tokens), "-r", str(reps), "-o", "json"],
        capture_output=True, text=True, check=True)
    return float(json.loads(result.stdout)[0]["avg_ts"])


def direct_tps(model: Path, threads: int, tokens: int, reps: int) -> float:
    from llama_cpp import Llama

    llm = Llama(str(model), n_ctx=2048, n_threads=threads, n_threads_batch=threads,
                verbose=False)
    rates = []
    for _ in range(reps):
        llm.reset()
        stamps = []
        for _chunk in llm.create_completion(PROMPT, max_tokens=tokens, temperature=0,
                                            stream=True, logit_bias=None):
            stamps.append(time.perf_counter())
        rates.append((len(stamps) - 1) / (stamps[-1] - stamps[0]))
    del llm
    return statistics.median(rates)


def api_tps(address, model_id: str, tokens: int, reps: int) -> tuple[float, float]:
    """(client-measured tok/s, engine-reported tok/s), medians over reps."""
    body = {"model": model_id, "prompt": PROMPT, "max_tokens": tokens, "temperature": 0,
            "stream": True, "ignore_eos": True, "stream_options": {"include_usage": True}}
    headers = {"Authorization": f"Bearer {address.token}"}
    client_rates, engine_rates = [], []
    with httpx.Client(base_url=address.url, headers=headers, timeout=300) as http:
        http.post("/v1/completions", json={**body, "stream": False, "max_tokens": 4})  # load
        for rep in range(reps):
            stamps, usage = [], None
            # A new prompt each rep, so no run reuses the previous one's KV memory.
            with http.stream("POST", "/v1/completions",
                             json={**body, "prompt": f"{PROMPT} ({rep})"}) as reply:
                for line in reply.iter_lines():
                    if not line.startswith("data: {"):
                        continue
                    chunk = json.loads(line[6:])
                    if chunk["choices"] and chunk["choices"][0]["text"]:
                        stamps.append(time.perf_counter())
                    usage = chunk.get("usage") or usage
            client_rates.append((len(stamps) - 1) / (stamps[-1] - stamps[0]))
            engine_rates.append(usage["timings"]["decode_tokens_per_s"])
    return statistics.median(client_rates), statistics.median(engine_rates)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=min(os.cpu_count() or 2, 8))
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()

    sys.path.insert(0, str(ROOT / "bench"))
    from build_tools import build

    bins = build()
    models = paths().models
    rows = []
    for starter in STARTERS:
        path = models / f"{starter.id}.gguf"
        engine = EngineProcess(["--threads", str(args.threads), "--ctx", "2048"])
        address = engine.wait_ready()
        try:
            api, engine_side = api_tps(address, starter.id, args.tokens, args.reps)
        finally:
            engine.stop()
        direct = direct_tps(path, args.threads, args.tokens, args.reps)
        anchor = anchor_tps(bins, path, args.threads, args.tokens, args.reps)
        rows.append((starter.id, anchor, direct, api, engine_side))

    print(f"\ndecode, {args.tokens} tokens, {args.threads} threads, median of {args.reps}")
    print(f"{'model':<28} {'llama-bench':>11} {'direct':>15} {'api (client)':>17} {'api (engine)':>14}")
    for name, anchor, direct, api, engine_side in rows:
        print(f"{name:<28} {anchor:8.1f} t/s {direct:6.1f} ({direct / anchor:4.2f}x) "
              f"{api:6.1f} ({api / anchor:4.2f}x) {engine_side:7.1f} t/s")
    worst = min(api / anchor for _, anchor, _, api, _ in rows)
    print(f"\napi / llama-bench, worst model: {worst:.2f} (target >= 0.95)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
