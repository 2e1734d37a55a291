"""Speculative decoding speed, in one run, greedy, 128 tokens per prompt:

  plain   Gemma 3 270M requantized to all-F32 (the target) alone
  draft   the same target with Gemma 3 270M Q4_K_M as its draft
  lookup  the same target with prompt-lookup decoding
  anchor  llama.cpp's llama-server (vendored commit): -md DRAFT --spec-type draft-simple,
          8-token drafts, against llama-server without a draft

Prints tokens/s, speedups and acceptance on code and prose prompts.
Targets: draft >= 1.8x on code, ahead of the anchor; never below 0.95x (auto-off).

    python bench/speculative.py [--threads 2] [--tokens 128]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from app.engine_proc import EngineProcess  # noqa: E402
from build_tools import build, llama_server  # noqa: E402
from app.paths import paths  # noqa: E402
from engine.draft import requantize  # noqa: E402
from engine.gguf_file import GGUFInspector  # noqa: E402
from engine.models import ModelStore  # noqa: E402

DRAFT = "gemma-3-270m-q4_k_m"
TARGET = "gemma-3-270m-f32"
PROMPTS = {
    "code": ["def quicksort(items):\n    \"\"\"Sort a list with quicksort.\"\"\"\n",
             "import json\n\n\ndef load_config(path):\n",
             "class LinkedList:\n    def __init__(self):\n"],
    "prose": ["The history of the Roman Empire",
              "Once upon a time, in a small village by the sea,",
              "Photosynthesis is the process by which"],
}


def complete(url: str, token: str | None, prompt: str, tokens: int, extra: dict) -> dict:
    body = {"model": TARGET, "prompt": prompt, "max_tokens": tokens, "temperature": 0, "ignore_eos": True,
            "cache_prompt": False, **extra}
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    start = time.perf_counter()
    reply = httpx.post(f"{url}/v1/completions", json=body, headers=headers, timeout=600)
    if reply.status_code != 200:
        raise RuntimeError(f"{url}: {reply.status_code} {reply.text[:300]}")
    data = reply.json()
    data["elapsed"] = time.perf_counter() - start
    return data


def run_homerack(threads: int, tokens: int) -> dict:
    engine = EngineProcess(["--threads", str(threads), "--ctx", "2048", "--model", TARGET])
    address = engine.wait_ready()
    results: dict = {}
    try:
        complete(address.url, address.token, "Warm up", 16, {"speculation": "off"})
        for mode, extra in (("plain", {"speculation": "off"}),
                            ("draft", {"draft_model": DRAFT}),
                            ("lookup", {"speculation": "lookup"})):
            for kind, prompts in PROMPTS.items():
                rates, drafted, accepted = [], 0, 0
                for prompt in prompts:
                    data = complete(address.url, address.token, prompt, tokens, extra)
                    usage = data["usage"]
                    rates.append(usage["timings"]["decode_tokens_per_s"])
                    spec = usage.get("speculative") or {}
                    drafted += spec.get("drafted", 0)
                    accepted += spec.get("accepted", 0)
                results[(mode, kind)] = (statistics.median(rates),
                                         accepted / drafted if drafted else None)
    finally:
        engine.stop()
    return results


def run_anchor(bins: Path, models: Path, threads: int, tokens: int, draft: bool) -> dict:
    args = ["-m", str(models / f"{TARGET}.gguf"), "-c", "2048", "-np", "1", "-t", str(threads)]
    if draft:
        args += ["-md", str(models / f"{DRAFT}.gguf"), "--spec-type", "draft-simple",
                 "--spec-draft-n-max", "8", "-td", str(threads)]
    results = {}
    with llama_server(bins, args) as url:
        complete(url, None, "Warm up", 16, {})
        for kind, prompts in PROMPTS.items():
            rates, drafted, accepted = [], 0, 0
            for prompt in prompts:
                data = complete(url, None, prompt, tokens, {})
                timings = data.get("timings", {})
                rates.append(timings.get("predicted_per_second") or tokens / data["elapsed"])
                drafted += timings.get("draft_n", 0)
                accepted += timings.get("draft_n_accepted", 0)
            results[kind] = (statistics.median(rates), accepted / drafted if drafted else None)
    return results


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=min(os.cpu_count() or 2, 8))
    parser.add_argument("--tokens", type=int, default=128)
    args = parser.parse_args()

    bins = build()
    os.environ["HOMERACK_HOME"] = str(ROOT / ".cache" / "bench-home")
    models = paths().models
    ModelStore(models, GGUFInspector()).install_starters()
    if not (models / f"{TARGET}.gguf").exists():
        requantize(models / f"{DRAFT}.gguf", models / f"{TARGET}.gguf", ftype=0)

    ours = run_homerack(args.threads, args.tokens)
    anchor_plain = run_anchor(bins, models, args.threads, args.tokens, draft=False)
    anchor_draft = run_anchor(bins, models, args.threads, args.tokens, draft=True)

    print(f"\nspeculative decoding, {TARGET} target, greedy, {args.tokens} tokens, "
          f"{args.threads} threads (median over prompts)")
    print(f"{'':8}{'plain':>10}{'draft':>10}{'x':>7}{'accept':>8}{'lookup':>10}{'x':>7}"
          f"{'| llama-server':>16}{'+draft':>9}{'x':>7}{'accept':>8}")
    for kind in PROMPTS:
        plain, _ = ours[("plain", kind)]
        draft, acc = ours[("draft", kind)]
        lookup, _ = ours[("lookup", kind)]
        a_plain, _ = anchor_plain[kind]
        a_draft, a_acc = anchor_draft[kind]
        print(f"{kind:8}{plain:>10.1f}{draft:>10.1f}{draft / plain:>6.2f}x"
              f"{(acc or 0):>8.2f}{lookup:>10.1f}{lookup / plain:>6.2f}x"
              f"{a_plain:>16.1f}{a_draft:>9.1f}{a_draft / a_plain:>6.2f}x{(a_acc or 0):>8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
