"""Time to first token of follow-up questions in two long conversations that alternate,
on the starter model (or --model), in one run:

  cold      Homerack, no resident conversations and no prompt cache (each switch
            recomputes the history)
  resident  Homerack as it runs by default: both conversations stay in KV memory
  ram       Homerack, no resident conversations: each switch restores from the RAM tier
  disk      Homerack, disk tier, after an engine restart
  anchor    llama.cpp's llama-server (vendored commit), one slot, cache_prompt on, its
            host-memory prompt cache; cold = first visit, warm = coming back

Prints speedups against cold. Targets: resident >= 30x and at least the anchor's;
disk >= 20x.

Each server is asked through one kept-alive client, as API clients do: a client made per
request (httpx's, loading its CA bundle) had put 18 ms here, more on slower machines,
into every figure, Homerack's and llama-server's alike, and shrunk every ratio.

Every timed answer is checked: generated (not replayed), and its prompt evaluated anew
(cold: at most a tenth from the cache) or taken from the cache (the others: at least
nine tenths).

    python -m bench.prompt_cache [--model ID] [--threads 2] [--quick]
"""

from __future__ import annotations

import statistics
import shutil
import sys
import time
from pathlib import Path

import httpx

from .common import (BenchError, QUICK_NOTE, arguments, chunks, generated, ratio, report,
                    start_engine)

from .build_tools import build, llama_server
from app.paths import paths
from engine.catalog.models import DEFAULT_MODEL

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


class Server:
    """Where the requests go: a server's address and token, and one kept-alive client."""

    def __init__(self, url: str, token: str | None = None):
        self.url = url
        self.client = httpx.Client(base_url=url, timeout=600, headers=(
            {"Authorization": f"Bearer {token}"} if token else {}))

    def __enter__(self):
        return self

    def __exit__(self, *_exc):
        self.client.close()


def ttft(server: Server, messages: list[dict], model: str | None,
         cached: bool | None = None) -> tuple[float, int]:
    """Seconds to the first streamed token, and the prompt's token count. From Homerack
    (`model` given) the answer is checked: generated, and its prompt `cached` or not."""
    body = {"messages": messages, "max_tokens": 1, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    if model:
        body["model"] = model
    for attempt in (1, 2):  # llama-server closes a kept-alive connection after a few
        start, first, usage = time.perf_counter(), None, {}  # requests: once more, anew
        try:
            with server.client.stream("POST", "/v1/chat/completions", json=body) as reply:
                for chunk in chunks(reply):
                    if first is None and chunk.get("choices") and \
                            chunk["choices"][0]["delta"].get("content"):
                        first = time.perf_counter()
                    usage = chunk.get("usage") or usage
            break
        except httpx.RemoteProtocolError:
            if attempt == 2:
                raise
    if model:
        check_prompt(generated(usage, f"{messages[-1]['content']!r}"), cached)
    return (first or time.perf_counter()) - start, usage.get("prompt_tokens", 0)


def check_prompt(usage: dict, cached: bool | None) -> None:
    share = usage["prompt_tokens_details"]["cached_tokens"] / usage["prompt_tokens"]
    if cached is False and share > 0.1:
        raise BenchError(f"a cold prompt came {share:.0%} from the cache")
    if cached and share < 0.9:
        raise BenchError(f"a warm prompt came only {share:.0%} from the cache")


def alternate(server: Server, model, rounds: int, turns: int,
              warm: bool | None = None) -> dict:
    """Visit A and B once (cold), then come back to each `rounds` times (`warm`: whether
    those find their prompt cached)."""
    conv = {name: history(name, turns) for name in TOPICS}
    first = {name: ttft(server, conv[name], model, cached=False) for name in TOPICS}
    back = {name: [] for name in TOPICS}
    for n in range(rounds):
        for name in TOPICS:
            back[name].append(ttft(server, follow_up(conv[name], n), model, warm)[0])
    return {"first": first, "back": {k: statistics.median(v) for k, v in back.items() if v}}


def homerack(model: str, threads: int, *extra: str):
    engine = start_engine(["--threads", str(threads), "--ctx", "4096", "--model", model, *extra])
    return engine, Server(engine.url, engine.token)


def cold_in_turn(bins: Path, model: str, threads: int, rounds: int) -> tuple[float, float]:
    """Time to the first token of a new conversation of the full length, Homerack and
    llama-server in turn, both up at once (medians): this machine's speed drifts by more
    than the gap between them within minutes. Each round starts with a new system line,
    so neither has any of its prompt cached."""
    engine, server = homerack(model, threads, "--no-prompt-cache", "--resident", "0")
    ours, theirs = [], []
    try:
        with llama_server(bins, server_args(paths().models / f"{model}.gguf", threads)) as url, \
                server, Server(url) as anchor_server:
            for n in range(rounds):
                conv = history("A")
                conv[0] = {"role": "system", "content": f"Session {n}. {conv[0]['content']}"}
                ours.append(ttft(server, conv, model, cached=False)[0])
                theirs.append(ttft(anchor_server, conv, None)[0])
    finally:
        engine.stop()
    return statistics.median(ours), statistics.median(theirs)


def server_args(model: Path, threads: int) -> list[str]:
    """llama-server with one slot, its prompt cache and its host-memory cache on."""
    return ["-m", str(model), "-c", "4096", "-np", "1", "-t", str(threads), "--jinja"]


def anchor(bins: Path, model: Path, threads: int, rounds: int) -> dict:
    with llama_server(bins, server_args(model, threads)) as url, Server(url) as server:
        return alternate(server, None, rounds, 9)


def main() -> int:
    args = arguments(__doc__, {"rounds": (5, 1)}, models=(DEFAULT_MODEL,))
    model = args.models[0]  # one model a run
    turns = 2 if args.quick else 9
    bins = None if args.quick else build()
    # Its own home: the disk-tier run empties the prompt cache folder.
    model_path = paths().models / f"{model}.gguf"

    runs = {}
    for name, flags, warm in (("cold", ("--no-prompt-cache", "--resident", "0"), False),
                              ("resident", ("--no-prompt-cache",), True),
                              ("ram", ("--cache-disk-mib", "0", "--resident", "0"), True)):
        engine, server = homerack(model, args.threads, *flags)
        try:
            with server:
                runs[name] = alternate(server, model, args.rounds, turns, warm)
        finally:
            engine.stop()
    cold = runs["cold"]

    kv = paths().cache / "kv"
    shutil.rmtree(kv, ignore_errors=True)
    engine, server = homerack(model, args.threads)
    try:
        with server:
            alternate(server, model, 0, turns)  # writes both to disk
        time.sleep(2)  # the background writer
    finally:
        engine.stop()
    engine, server = homerack(model, args.threads)
    try:  # a new process: everything comes from the disk tier
        with server:
            disk = {name: ttft(server, follow_up(history(name, turns), 99), model,
                               cached=True)[0] for name in TOPICS}
    finally:
        engine.stop()
    if args.quick:
        for name in TOPICS:
            print(f"{name}: cold {runs['cold']['back'][name]:.3f} s, resident "
                  f"{runs['resident']['back'][name]:.3f} s, ram {runs['ram']['back'][name]:.3f} s, "
                  f"disk {disk[name]:.3f} s")
            report(model, "back to a resident conversation", runs["resident"]["back"][name], "s")
        print(QUICK_NOTE)
        return 0

    llama_server = anchor(bins, model_path, args.threads, args.rounds)

    print(f"\ntime to first token of a follow-up, {model}, {args.threads} threads")
    print(f"{'conv':<5}{'tokens':>7}{'cold':>9}{'resident':>10}{'x':>7}{'ram':>9}{'x':>7}"
          f"{'disk':>9}{'x':>7}{'anchor cold':>13}{'anchor back':>13}{'x':>7}")
    worst = {"resident": 1e9, "ram": 1e9, "disk": 1e9, "anchor": 1e9}
    for name in TOPICS:
        c = cold["back"][name]
        h, r, d = runs["resident"]["back"][name], runs["ram"]["back"][name], disk[name]
        ac, ab = llama_server["first"][name][0], llama_server["back"][name]
        tokens = cold["first"][name][1]
        speedups = {"resident": ratio(c, h, f"{name} resident", 1, 10_000),
                     "ram": ratio(c, r, f"{name} ram", 1, 10_000),
                     "disk": ratio(c, d, f"{name} disk", 1, 10_000),
                     "anchor": ratio(ac, ab, f"{name} llama-server", 0.5, 10_000)}
        print(f"{name:<5}{tokens:>7}{c:>8.2f}s{h:>9.3f}s{speedups['resident']:>6.0f}x{r:>8.3f}s"
              f"{speedups['ram']:>6.0f}x{d:>8.3f}s{speedups['disk']:>6.0f}x{ac:>12.2f}s"
              f"{ab:>12.3f}s{speedups['anchor']:>6.0f}x")
        for key, value in speedups.items():
            worst[key] = min(worst[key], value)
        report(model, f"back to a resident {tokens:,}-token conversation", h, "s", ab,
               "llama-server's host cache", "<= 1")
    ours, theirs = cold_in_turn(bins, model, args.threads, args.rounds)
    print(f"a new conversation of {tokens:,} tokens, in turn: first token after {ours:.2f} s, "
          f"llama-server {theirs:.2f} s ({ratio(ours, theirs, 'cold', 0.5, 2):.2f}x; "
          "target <= 1.05x)")
    report(model, f"first token of a new {tokens:,}-token conversation", ours, "s", theirs,
           "llama-server, in turn", "<= 1.05")
    print(f"\nworst speedups: resident {worst['resident']:.0f}x (target >= 30x and >= anchor "
          f"{worst['anchor']:.0f}x), ram tier {worst['ram']:.0f}x, disk after restart "
          f"{worst['disk']:.0f}x (target >= 20x; the anchor loses its cache on restart: 1x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
