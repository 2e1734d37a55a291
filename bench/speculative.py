"""Speculative decoding speed, in one run, greedy, 128 tokens per prompt:

  plain   Gemma 3 270M requantized to all-F32 (the target) alone
  draft   the same target with Gemma 3 270M Q4_K_M as its draft, its output layer cut
          to the 65,536 most used tokens (engine/speculation/cut_draft.py), as the engine runs it
  whole   the same with the draft run whole (`homerack serve --whole-drafts`)
  lookup  the same target with prompt-lookup decoding
  anchor  llama.cpp's llama-server (vendored commit): -md DRAFT --spec-type draft-simple,
          8-token drafts, against llama-server without a draft

Prints tokens/s, speedups and acceptance on code and prose prompts. All six run side by
side (both llama-servers stay up), prompt by prompt, and each speedup is the median of
ratios between neighbouring runs: the machine's speed drifts too much for separate blocks.
Targets: draft >= 1.8x on code, ahead of the anchor; never below 0.95x (auto-off).

Every timed answer is checked: generated (not replayed), all its tokens, and drafted by
the configuration it stands for (a speculative run that drafted nothing stops the bench).

    python -m bench.speculative [--threads 2] [--tokens 128] [--reps 2] [--quick]
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import time
from pathlib import Path

import httpx

from .common import BenchError, QUICK_NOTE, arguments, generated, ratio, report, start_engine

from .build_tools import build, llama_server
from app.paths import paths
from engine.llama.quantize import requantize
from engine.catalog.gguf_file import GGUFInspector
from engine.catalog.models import ModelStore

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


def rate_ours(address, prompt: str, tokens: int, extra: dict) -> tuple[float, int, int]:
    usage = generated(complete(address.url, address.token, prompt, tokens, extra)["usage"],
                      f"{extra} on {prompt[:20]!r}", tokens)
    spec = usage.get("speculative") or {}
    # a draft that drafted nothing must have been turned off by the engine's auto-off (it
    # measured a loss); a lookup may simply find nothing to propose
    if "draft_model" in extra and not spec.get("drafted") and spec.get("enabled") is not False:
        raise BenchError(f"{extra} on {prompt[:20]!r}: the draft drafted nothing ({spec})")
    return (usage["timings"]["decode_tokens_per_s"], spec.get("drafted", 0),
            spec.get("accepted", 0))


def rate_anchor(url: str, prompt: str, tokens: int) -> tuple[float, int, int]:
    data = complete(url, None, prompt, tokens, {})
    timings = data.get("timings", {})
    return (timings.get("predicted_per_second") or tokens / data["elapsed"],
            timings.get("draft_n", 0), timings.get("draft_n_accepted", 0))


def anchor_args(models: Path, threads: int, draft: bool) -> list[str]:
    args = ["-m", str(models / f"{TARGET}.gguf"), "-c", "2048", "-np", "1", "-t", str(threads)]
    if draft:
        args += ["-md", str(models / f"{DRAFT}.gguf"), "--spec-type", "draft-simple",
                 "--spec-draft-n-max", "8", "-td", str(threads)]
    return args


def measure(bins: Path | None, models: Path, threads: int, tokens: int, reps: int,
            prompts: dict) -> dict:
    """Every configuration on every prompt back to back, `reps` times over: this machine's
    speed drifts by tens of percent within minutes, so each speedup is a ratio of runs
    made side by side. Returns {(config, kind): [(rate, drafted, accepted), ...]} with
    one entry per prompt and repetition, in the same order for every config. Without
    `bins`, no anchors."""
    args = ["--threads", str(threads), "--ctx", "2048", "--model", TARGET]
    address = start_engine(args)
    whole = start_engine([*args, "--whole-drafts"], env=own_home("bench-home-whole", models))
    results: dict = {}
    try:
        wait_for_cut_draft(address)
        with contextlib.ExitStack() as anchors:
            configs = {
                "plain": lambda p: rate_ours(address, p, tokens, {"speculation": "off"}),
                "draft": lambda p: rate_ours(address, p, tokens, {"draft_model": DRAFT}),
                "whole": lambda p: rate_ours(whole, p, tokens, {"draft_model": DRAFT}),
                "lookup": lambda p: rate_ours(address, p, tokens, {"speculation": "lookup"}),
            }
            if bins:
                plain_url = anchors.enter_context(
                    llama_server(bins, anchor_args(models, threads, False)))
                draft_url = anchors.enter_context(
                    llama_server(bins, anchor_args(models, threads, True)))
                configs["server"] = lambda p: rate_anchor(plain_url, p, tokens)
                configs["server+draft"] = lambda p: rate_anchor(draft_url, p, tokens)
            for name, run in configs.items():  # warm up every path once
                run("Warm up")
            for _ in range(reps):
                for kind, texts in prompts.items():
                    for prompt in texts:
                        for name, run in configs.items():
                            results.setdefault((name, kind), []).append(run(prompt))
    finally:
        address.stop()
        whole.stop()
    return results


def own_home(name: str, models: Path) -> dict:
    """An environment whose engine has its own state (journal, caches) but these models,
    inside this run's HOMERACK_HOME."""
    home = Path(os.environ["HOMERACK_HOME"]) / name
    link = home / "data" / "models"
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink():  # from an earlier run, perhaps to another models folder
        link.unlink()
    link.symlink_to(models)
    return dict(os.environ, HOMERACK_HOME=str(home))


def wait_for_cut_draft(address, limit_s: float = 300) -> None:
    """The engine cuts the draft in the background on first use (cached afterwards)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        usage = complete(address.url, address.token, "Hi", 4, {"draft_model": DRAFT})["usage"]
        if usage["speculative"]["draft_vocab"] < 262144:
            return
        time.sleep(1)
    raise RuntimeError("the engine did not cut the draft in time")


def summary(results: dict, config: str, base: str, kind: str) -> tuple[float, float, float | None]:
    """Median rate, median of the side-by-side ratios to `base`, and acceptance."""
    runs, bases = results[(config, kind)], results[(base, kind)]
    ratios = [r[0] / b[0] for r, b in zip(runs, bases)]
    drafted = sum(r[1] for r in runs)
    return (statistics.median(r[0] for r in runs), statistics.median(ratios),
            sum(r[2] for r in runs) / drafted if drafted else None)


def main() -> int:
    args = arguments(__doc__, {"tokens": (128, 16), "reps": (2, 1)})
    prompts = PROMPTS
    if args.quick:
        prompts = {kind: texts[:1] for kind, texts in PROMPTS.items()}
    bins = None if args.quick else build()
    models = paths().models
    ModelStore(models, GGUFInspector()).install_starters()
    if not (models / f"{TARGET}.gguf").exists():
        requantize(models / f"{DRAFT}.gguf", models / f"{TARGET}.gguf", ftype=0)

    results = measure(bins, models, args.threads, args.tokens, args.reps, prompts)
    if args.quick:
        for (config, kind), runs in sorted(results.items()):
            print(f"{config:8}{kind:7}" + "  ".join(f"{r[0]:.1f} t/s ({r[2]}/{r[1]} accepted)"
                                                     for r in runs))
            report(TARGET, f"decode, {config} ({kind})", statistics.median(r[0] for r in runs),
                   "tok/s")
        print(QUICK_NOTE)
        return 0
    print(f"\nspeculative decoding, {TARGET} target, greedy, {args.tokens} tokens, "
          f"{args.threads} threads; medians over {len(PROMPTS['code'])} prompts x {args.reps} "
          "runs; x = median of side-by-side ratios")
    print(f"{'':8}{'plain':>8}{'draft':>8}{'x':>7}{'accept':>8}{'whole':>8}{'x':>7}"
          f"{'lookup':>8}{'x':>7}{'| llama-server':>15}{'+draft':>8}{'x':>7}{'accept':>8}")
    for kind in PROMPTS:
        plain = summary(results, "plain", "plain", kind)
        draft = summary(results, "draft", "plain", kind)
        whole = summary(results, "whole", "plain", kind)
        lookup = summary(results, "lookup", "plain", kind)
        server = summary(results, "server", "server", kind)
        server_draft = summary(results, "server+draft", "server", kind)
        print(f"{kind:8}{plain[0]:>8.1f}{draft[0]:>8.1f}{draft[1]:>6.2f}x{draft[2] or 0:>8.2f}"
              f"{whole[0]:>8.1f}{whole[1]:>6.2f}x{lookup[0]:>8.1f}{lookup[1]:>6.2f}x"
              f"{server[0]:>15.1f}{server_draft[0]:>8.1f}"
              f"{server_draft[1]:>6.2f}x{server_draft[2] or 0:>8.2f}")
        for config, (rate, _x, _accept) in (("draft", draft), ("whole", whole), ("lookup", lookup)):
            report(TARGET, f"decode, {config} ({kind})", rate, "tok/s", plain[0],
                   "plain decode, same engine", "> 1")
        report(TARGET, f"decode, llama-server +draft ({kind})", server_draft[0], "tok/s",
               server[0], "llama-server plain", "")
    for config in ("draft", "whole", "lookup"):
        # a draft of 8 tokens cannot give more than 9 tokens per target step
        ratios = [ratio(r[0], b[0], f"{config} ({kind})", 0.1, 9) for kind in PROMPTS
                  for r, b in zip(results[(config, kind)], results[("plain", kind)])]
        print(f"{config}: lowest single-run ratio {min(ratios):.2f}x, highest {max(ratios):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
