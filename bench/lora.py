"""LoRA adapters: what one costs per token, what switching them costs against reloading
the model, and mixed traffic, through the API of a real engine.

1. Decode tokens/s of one stream with an adapter against without. llama.cpp applies an
   adapter at run time (two thin products per adapted matrix), so it costs something:
   the anchor is the same cost in llama-server (--lora, --lora-init-without-apply, the
   request's "lora" field), measured in the same run.
2. Switching: the first token of a request that follows one under another adapter,
   against one that follows the same adapter (both prompts resident: only the switch
   differs), and a reload of the base model (what baking an adapter into a model, as
   Ollama's ADAPTER does, costs at each change). Target: a switch >= 100x faster.
3. Mixed traffic: 4 streams under 2 adapters (2 each) against 4 streams under one: each
   adapter set gets decode steps of its own, so mixing costs batching.

The adapter is written for the model (fixtures/adapter_files.py): rank 16 on every attention
and feed-forward matrix, as PEFT's usual target list.

    python -m bench.lora [--model ID] [--threads 2] [--tokens 64] [--quick]
"""

from __future__ import annotations

import statistics
import sys
import threading
import time

import httpx

from .common import (DONOR, QUICK_NOTE, BenchError, arguments, generated, ratio, report,
                    start_engine, stream_times)

from fixtures.adapter_files import LoraSpec, base_facts, write_shaped
from app.paths import paths
from .build_tools import build, llama_server

TARGETS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def adapters_for(model: str, n_layers: int) -> list[str]:
    """Two adapters for `model` in the models folder, written once."""
    names, facts = [], None
    for seed in (1, 2):
        name = f"{model}-bench-lora{seed}"
        path = paths().models / f"{name}.gguf"
        spec = LoraSpec(rank=16, alpha=32, targets=TARGETS, layers=tuple(range(n_layers)),
                        seed=seed, strength=0.02)
        if not path.exists():
            facts = facts or base_facts(spec, paths().models / f"{model}.gguf")
            write_shaped(path, *facts, spec)
        names.append(name)
    return names


def decode_rate(url: str, headers: dict, body: dict, tokens: int, checked: bool,
                repeats: int) -> float:
    rates = []
    for _ in range(repeats):
        times = stream_times(url, headers, {"prompt": PROMPT, **body}, tokens, checked)
        rates.append((tokens - 1) / (times[-1] - times[0]))  # from the first token to the end
    return statistics.median(rates)


def first_token_s(http: httpx.Client, model: str, lora: list) -> float:
    """Seconds to the first token of a one-token answer (the prompt resident)."""
    start = time.perf_counter()
    reply = http.post("/v1/completions", json={
        "model": model, "prompt": PROMPT, "max_tokens": 1, "temperature": 0, "lora": lora})
    reply.raise_for_status()
    generated(reply.json().get("usage"), "first token", 1)
    return time.perf_counter() - start


def switching(engine, model: str, adapters: list[str], repeats: int) -> dict:
    """A switch's cost: in each of `repeats` pairs, a first token under the adapter the
    last request used, then one under the other (both prompts resident, so only the
    switch differs); the median of the pairs' differences (the machine's drift, which
    moves a one-token request by more than a switch costs, cancels within a pair)."""
    lora = [[{"id": name, "scale": 1.0}] for name in adapters]
    with engine.client() as http:
        for one in lora:  # both prompts resident
            first_token_s(http, model, one)
        before = engine.health()["adapters"]["switches"]
        pairs, current = [], 1
        for _ in range(repeats):
            same = first_token_s(http, model, lora[current])
            current ^= 1
            pairs.append((same, first_token_s(http, model, lora[current])))
        if engine.health()["adapters"]["switches"] - before < repeats:
            raise BenchError("the engine did not switch adapters between the requests")
        reloads = []  # each a new context: the switch count starts again
        for n_ctx in (2048, 4096) * max(1, repeats // 8):
            start = time.perf_counter()
            http.post("/v1/models/load", json={"model": model, "n_ctx": n_ctx}).raise_for_status()
            reloads.append(time.perf_counter() - start)
    return {"same_s": statistics.median(same for same, _ in pairs),
            "switched_s": statistics.median(switched for _, switched in pairs),
            "switch_s": max(statistics.median(b - a for a, b in pairs), 0.0),
            "reload_s": statistics.median(reloads)}


def mixed(engine, model: str, sets: list[list], tokens: int) -> float:
    """Aggregate decode tokens/s of one stream per entry of `sets`, all at once."""
    done: list[list[float]] = [[] for _ in sets]

    def run(i):
        done[i] = stream_times(engine.url, engine.headers, {
            "prompt": PROMPT, "model": model, "lora": sets[i], "cache_prompt": False}, tokens, True)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(sets))]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return len(sets) * tokens / (time.perf_counter() - start)


def homerack(args, adapters: list[str]) -> dict:
    engine = start_engine(["--threads", str(args.threads), "--ctx", "4096", "--model", args.model,
                           "--parallel", "4"])
    try:
        body = {"model": args.model}
        stream_times(engine.url, engine.headers, {"prompt": PROMPT, **body}, 4, True)  # warm
        a, b = ([{"id": name, "scale": 1.0}] for name in adapters)
        out = {"plain": decode_rate(engine.url, engine.headers, body, args.tokens, True,
                                    args.repeats),
               "adapter": decode_rate(engine.url, engine.headers, {**body, "lora": a},
                                      args.tokens, True, args.repeats)}
        out |= switching(engine, args.model, adapters, 8 * args.repeats)  # 1-token answers
        out["mixed_tps"] = mixed(engine, args.model, [a, a, b, b], args.tokens)
        out["one_set_tps"] = mixed(engine, args.model, [a, a, a, a], args.tokens)
        return out
    finally:
        engine.stop()


def anchor(args, bins, adapter: str) -> dict:
    """llama-server's decode without an adapter, and with one (--lora)."""
    out = {}
    plain = ["-m", str(paths().models / f"{args.model}.gguf"), "-c", "4096", "-t",
             str(args.threads)]
    for key, extra in (("plain", []), ("adapter", ["--lora", str(paths().models /
                                                                 f"{adapter}.gguf")])):
        with llama_server(bins, plain + extra) as url:
            stream_times(url, {}, {"prompt": PROMPT}, 4, False)
            out[key] = decode_rate(url, {}, {}, args.tokens, False, args.repeats)
    return out


def main() -> int:
    args = arguments(__doc__, {"tokens": (64, 4), "repeats": (5, 1)}, models=(DONOR,))
    from engine.catalog.gguf_file import GGUFInspector

    args.model = args.models[0]  # one model a run
    info = GGUFInspector().inspect(paths().models / f"{args.model}.gguf")
    adapters = adapters_for(args.model, info.block_count)
    ours = homerack(args, adapters)
    theirs = None if args.quick else anchor(args, build(), adapters[0])
    cost = ours["adapter"] / ours["plain"]
    print(f"\n{args.model}, rank-16 adapter on {len(TARGETS)} matrices of {info.block_count} "
          f"layers, {args.tokens} tokens, {args.threads} threads")
    print(f"decode tokens/s   without {ours['plain']:.1f}   with the adapter "
          f"{ours['adapter']:.1f}   ({cost:.2f}x)")
    print(f"first token: same adapter {1000 * ours['same_s']:.1f} ms, after another "
          f"{1000 * ours['switched_s']:.1f} ms: a switch costs {1000 * ours['switch_s']:.1f} ms;"
          f" reloading the model {ours['reload_s']:.2f} s")
    print(f"4 streams: one adapter {ours['one_set_tps']:.1f} tok/s, two adapters (2 + 2) "
          f"{ours['mixed_tps']:.1f} tok/s ({ours['mixed_tps'] / ours['one_set_tps']:.2f}x)")
    report(args.model, "4 streams under 2 adapters ÷ under 1", ours["mixed_tps"] /
           ours["one_set_tps"], "x")
    if args.quick:
        report(args.model, "decode with an adapter", ours["adapter"], "tok/s")
        print(f"\n{QUICK_NOTE} (llama-server with --lora)")
        return 0
    report(args.model, "decode with an adapter", ours["adapter"], "tok/s", theirs["adapter"],
           "llama-server --lora", ">= 1")
    report(args.model, "adapter switch (ms) vs a reload", 1000 * ours["switch_s"], "ms",
           1000 * ours["reload_s"], "reloading the model", "<= 0.01")
    their_cost = ratio(theirs["adapter"], theirs["plain"], "llama-server's adapter cost", 0.2, 1.2)
    print(f"llama-server: without {theirs['plain']:.1f}, with the adapter "
          f"{theirs['adapter']:.1f} tok/s ({their_cost:.2f}x); Homerack's decode with the "
          f"adapter {ratio(ours['adapter'], theirs['adapter'], 'adapter decode', 0.3, 2):.2f}x "
          "llama-server's")
    faster = ours["reload_s"] / max(ours["switch_s"], 1e-4)
    print(f"switching is {'over ' if ours['switch_s'] < 1e-4 else ''}{faster:,.0f}x faster "
          "than reloading (target >= 100x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
