"""Time to first token of follow-up questions in two long conversations that alternate,
on the starter model, in one run:

  cold      Homerack, no resident conversations and no prompt cache (each switch
            recomputes the history)
  resident  Homerack as it runs by default: both conversations stay in KV memory
  ram       Homerack, no resident conversations: each switch restores from the RAM tier
  disk      Homerack, disk tier, after an engine restart
  anchor    llama.cpp's llama-server (vendored commit), one slot, cache_prompt on, its
            host-memory prompt cache; cold = first visit, warm = coming back

Prints speedups against cold. Targets: resident >= 50x and at least the anchor's;
disk >= 20x.

    python bench/prompt_cache.py [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import shutil
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
from engine.models import DEFAULT_MODEL  # noqa: E402

TOPICS = {
    "A": "the history of bridges, rivers, and the towns that grew around river crossings",
    "B": "gardening: soil, compost, seeds, watering schedules and the seasons of vegetables",
}


def history(name: str, turns: int = 9) -> list[dict]:
    """A fixed ~1,500-token conversation (no generated text, so every run sees the same)."""
    topic = TOPICS[name]
    messages = [{"role": "system", "content": f"You are a helpful assistant who knows {topic}."}]
    for i in range(turns):
        messages.append({"role": "user", "content": f"Tell me fact number {i + 1} about {topic}."})
        messages.append({"role": "assistant", "content": (
            f"Fact {i + 1}: {topic} is a subject with many details. " * 3 +
            "People have studied it for centuries, writing books, drawing maps and "
            "passing knowledge from one generation to the next, and there is always more "
            "to learn about how it shaped daily life, trade and the landscape. " * 2)})
    messages.append({"role": "user", "content": "Summarise what we discussed."})
    return messages


def follow_up(messages: list[dict], n: int) -> list[dict]:
    return messages + [{"role": "assistant", "content": "Done."},
                       {"role": "user", "content": f"Question {n}: and what else?"}]


def ttft(url: str, token: str | None, messages: list[dict], model: str | None) -> tuple[float, int]:
    """Seconds to the first streamed token, and the prompt's token count."""
    body = {"messages": messages, "max_tokens": 1, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    if model:
        body["model"] = model
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    start, first, prompt_tokens = time.perf_counter(), None, 0
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, headers=headers,
                      timeout=600) as reply:
        for line in reply.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if first is None and chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                first = time.perf_counter()
            if chunk.get("usage"):
                prompt_tokens = chunk["usage"]["prompt_tokens"]
    return (first or time.perf_counter()) - start, prompt_tokens


def alternate(url, token, model, rounds: int) -> dict:
    """Visit A and B once (cold), then come back to each `rounds` times."""
    conv = {name: history(name) for name in TOPICS}
    first = {name: ttft(url, token, conv[name], model) for name in TOPICS}
    back = {name: [] for name in TOPICS}
    for n in range(rounds):
        for name in TOPICS:
            back[name].append(ttft(url, token, follow_up(conv[name], n), model)[0])
    return {"first": first, "back": {k: statistics.median(v) for k, v in back.items() if v}}


def homerack(threads: int, *extra: str):
    engine = EngineProcess(["--threads", str(threads), "--ctx", "4096",
                            "--model", DEFAULT_MODEL, *extra])
    address = engine.wait_ready()
    while not httpx.get(f"{address.url}/health").json()["model"]:  # loaded before timing
        time.sleep(0.05)
    return engine, address


def anchor(bins: Path, model: Path, threads: int, rounds: int) -> dict:
    args = ["-m", str(model), "-c", "4096", "-np", "1", "-t", str(threads), "--jinja"]
    with llama_server(bins, args) as url:
        return alternate(url, None, None, rounds)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=min(os.cpu_count() or 2, 8))
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    bins = build()
    # Its own home: the disk-tier run empties the prompt cache folder.
    os.environ["HOMERACK_HOME"] = str(ROOT / ".cache" / "bench-home")
    model_path = paths().models / f"{DEFAULT_MODEL}.gguf"

    runs = {}
    for name, flags in (("cold", ("--no-prompt-cache", "--resident", "0")),
                        ("resident", ("--no-prompt-cache",)),
                        ("ram", ("--cache-disk-mib", "0", "--resident", "0"))):
        engine, address = homerack(args.threads, *flags)
        try:
            runs[name] = alternate(address.url, address.token, DEFAULT_MODEL, args.rounds)
        finally:
            engine.stop()
    cold = runs["cold"]

    kv = paths().cache / "kv"
    shutil.rmtree(kv, ignore_errors=True)
    engine, address = homerack(args.threads)
    try:
        alternate(address.url, address.token, DEFAULT_MODEL, 0)  # writes both to disk
        time.sleep(2)  # the background writer
    finally:
        engine.stop()
    engine, address = homerack(args.threads)
    try:  # a new process: everything comes from the disk tier
        disk = {name: ttft(address.url, address.token, follow_up(history(name), 99),
                           DEFAULT_MODEL)[0] for name in TOPICS}
    finally:
        engine.stop()

    llama_server = anchor(bins, model_path, args.threads, args.rounds)

    print(f"\ntime to first token of a follow-up, {DEFAULT_MODEL}, {args.threads} threads")
    print(f"{'conv':<5}{'tokens':>7}{'cold':>9}{'resident':>10}{'x':>7}{'ram':>9}{'x':>7}"
          f"{'disk':>9}{'x':>7}{'anchor cold':>13}{'anchor back':>13}{'x':>7}")
    worst = {"resident": 1e9, "ram": 1e9, "disk": 1e9, "anchor": 1e9}
    for name in TOPICS:
        c = cold["back"][name]
        h, r, d = runs["resident"]["back"][name], runs["ram"]["back"][name], disk[name]
        ac, ab = llama_server["first"][name][0], llama_server["back"][name]
        tokens = cold["first"][name][1]
        print(f"{name:<5}{tokens:>7}{c:>8.2f}s{h:>9.3f}s{c / h:>6.0f}x{r:>8.3f}s{c / r:>6.0f}x"
              f"{d:>8.3f}s{c / d:>6.0f}x{ac:>12.2f}s{ab:>12.3f}s{ac / ab:>6.0f}x")
        for key, value in (("resident", c / h), ("ram", c / r), ("disk", c / d),
                           ("anchor", ac / ab)):
            worst[key] = min(worst[key], value)
    print(f"\nworst speedups: resident {worst['resident']:.0f}x (target >= 50x and >= anchor "
          f"{worst['anchor']:.0f}x), ram tier {worst['ram']:.0f}x, disk after restart "
          f"{worst['disk']:.0f}x (target >= 20x; the anchor loses its cache on restart: 1x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
