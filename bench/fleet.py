"""The home fleet: several models in one engine, and replicas on other machines.

1. An agent's mix: 4 clients at once, each asking a large model, then a small one, then
   for embeddings, for `--rounds` rounds. Homerack keeps both chat models loaded
   (engine/fleet.py). The anchor is the same engine swapping on every change of model
   (`--max-models 1`, what a one-model server does), measured in the same run.
2. Replicas (`serve --replicas`): this host and `--replicas` workers started with
   `--replica` on loopback, every machine sharing this one's cores (each engine gets
   1 thread; the figures say how the machine was shared).
   - Aggregate decode tokens/s of 8 streams against this host alone.
   - Time to first token of follow-up turns of 4 conversations of about 2k tokens,
     cache-aware (a turn goes back to the machine holding its KV) against round-robin
     (as LocalAI's federation spreads requests). Target: cache-aware >= 5x faster.

    python -m bench.fleet [--large ID] [--small ID] [--model ID] [--replicas 1] [--quick]
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from .common import DONOR, BenchError, arguments, chunks, generated, report, start_engine

from app.paths import paths
from engine.catalog.models import DEFAULT_MODEL

ROOT = Path(__file__).resolve().parents[1]
GEMMA = "gemma-3-270m-q4_k_m"
EMBEDDER = "all-minilm-l6-v2-f16"
CODE = "616161"


def agent_round(engine, large: str, small: str, tokens: int, client: int, rnd: int) -> None:
    """One client's round: the large model, the small one, embeddings (each checked)."""
    with engine.client() as http:
        for model in (large, small):
            reply = http.post("/v1/chat/completions", json={
                "model": model, "max_tokens": tokens, "temperature": 0, "ignore_eos": True,
                "messages": [{"role": "user", "content": f"Client {client}, round {rnd}: "
                                                         "plan the next step."}]})
            reply.raise_for_status()
            generated(reply.json()["usage"], f"{model} for client {client}", tokens)
        vectors = http.post("/v1/embeddings", json={"model": EMBEDDER,
                                                    "input": [f"file {client}.{rnd}"] * 4})
        vectors.raise_for_status()
        if len(vectors.json()["data"]) != 4:
            raise BenchError("the embeddings answer is short")


def agent_mix(args, max_models: int) -> tuple[float, int]:
    """Seconds for every client's rounds, and the loads it took."""
    engine = start_engine(["--threads", str(args.threads), "--ctx", "2048", "--model",
                           args.large, "--max-models", str(max_models)])
    try:
        agent_round(engine, args.large, args.small, 2, 0, -1)  # warm: both files read once
        start = time.perf_counter()
        threads = [threading.Thread(target=lambda c=c: [agent_round(
            engine, args.large, args.small, args.tokens, c, r) for r in range(args.rounds)])
            for c in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        took = time.perf_counter() - start
        loads = sum(m["loads"] for m in engine.health()["models"])
    finally:
        engine.stop()
    return took, loads


# -- replicas ---------------------------------------------------------------------------

class Machines:
    """`n` workers with --replica (homes of their own under one folder, the models folder
    shared), paired with a host home, and the host engines started on them."""

    def __init__(self, n: int, threads: int):
        self.root = Path(tempfile.mkdtemp(prefix="homerack-fleet-"))
        self.workers, self.names = [], []
        for i in range(n):
            name = f"replica{i + 1}"
            home = self._home(name)
            process = subprocess.Popen(
                [sys.executable, "-m", "app", "worker", "--host", "127.0.0.1", "--port", "0",
                 "--name", name, "--code", CODE, "--no-advertise", "--threads", str(threads),
                 "--replica"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                cwd=ROOT, env=dict(os.environ, HOMERACK_HOME=str(home)))
            line = process.stdout.readline()
            if "listening on" not in line:
                raise BenchError(f"worker {name} did not start: {line}")
            threading.Thread(target=process.stdout.read, daemon=True).start()
            paired = subprocess.run([sys.executable, "-m", "app", "pair",
                                     line.split("listening on ")[1].strip(), "--code", CODE],
                                    capture_output=True, text=True, cwd=ROOT,
                                    env=dict(os.environ, HOMERACK_HOME=str(self._home("host"))))
            if paired.returncode:
                raise BenchError(f"pairing {name} failed: {paired.stderr}")
            self.workers.append(process)
            self.names.append(name)

    def _home(self, name: str) -> Path:
        home = self.root / name
        if not home.exists():
            (home / "data").mkdir(parents=True)
            (home / "data" / "models").symlink_to(paths().models)
        return home

    def host(self, args, extra: list[str]):
        """This host's engine (1 thread, as each replica's), with `extra` options."""
        engine = start_engine(["--threads", "1", "--ctx", "4096", "--model", args.model,
                               "--parallel", "4", *extra],
                              env=dict(os.environ, HOMERACK_HOME=str(self._home("host"))))
        deadline = time.monotonic() + 120
        while extra and len(self.serving(engine)) < len(self.names):
            if time.monotonic() > deadline:
                raise BenchError(f"replicas not serving: {engine.health().get('replicas')}")
            time.sleep(0.5)
        return engine

    @staticmethod
    def serving(engine) -> list[str]:
        return [r["name"] for r in engine.health()["replicas"] if r["state"] == "serving"]

    def close(self) -> None:
        for process in self.workers:
            process.terminate()
            process.wait(10)
        shutil.rmtree(self.root, ignore_errors=True)


def stream(engine, body: dict) -> tuple[str, float, float, dict]:
    """(machine, seconds to the first token, to the end, usage) of one streamed chat."""
    body = {**body, "stream": True, "temperature": 0, "stream_options": {"include_usage": True}}
    start, first, usage = time.perf_counter(), None, None
    with httpx.stream("POST", f"{engine.url}/v1/chat/completions", json=body,
                      headers=engine.headers, timeout=900) as reply:
        if reply.status_code != 200:
            raise BenchError(f"a stream was refused: {reply.status_code} {reply.read()[:300]}")
        machine = reply.headers.get("x-homerack-machine", "?")
        for chunk in chunks(reply):
            if first is None and chunk.get("choices"):
                first = time.perf_counter() - start
            usage = chunk.get("usage") or usage
    generated(usage, f"a stream answered by {machine}")
    return machine, first, time.perf_counter() - start, usage


def aggregate(engine, model: str, tokens: int) -> tuple[float, set[str]]:
    """Decode tokens/s of 8 streams at once, and the machines that answered."""
    results = []

    def one(i):
        results.append(stream(engine, {"model": model, "max_tokens": tokens, "ignore_eos": True,
                                       "messages": [{"role": "user", "content": f"Story {i}."}]}))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return 8 * tokens / (time.perf_counter() - start), {r[0] for r in results}


def conversation(name: str, words: int) -> list[dict]:
    """A long first turn (about `words` * 1.3 tokens) of conversation `name` (a new name
    for each run: the replicas' engines outlive the host's, with their caches)."""
    text = " ".join(f"note {name}-{w} about the river crossing" for w in range(words // 5))
    return [{"role": "system", "content": f"You keep conversation {name}'s notes."},
            {"role": "user", "content": text}]


def follow_ups(engine, model: str, words: int, n_machines: int,
               run: str) -> tuple[list[float], float]:
    """Seconds to the first token of the second turns of 2n + 1 conversations (n the
    machines: round-robin then moves every one), their first turns answered before; and
    the share of their prompts found cached."""
    turns = [conversation(f"{run[0]}{i}", words) for i in range(2 * n_machines + 1)]
    for messages in turns:
        _, _, _, usage = stream(engine, {"model": model, "max_tokens": 4, "messages": messages})
        messages.append({"role": "assistant", "content": "Noted."})
        messages.append({"role": "user", "content": "What was the first note?"})
    firsts, cached, total = [], 0, 0
    for messages in turns:
        _, first, _, usage = stream(engine, {"model": model, "max_tokens": 4,
                                             "messages": messages})
        firsts.append(first)
        cached += usage["prompt_tokens_details"]["cached_tokens"]
        total += usage["prompt_tokens"]
    return firsts, cached / total


def replicas(args) -> None:
    machines = Machines(args.replicas, 1)
    try:
        alone = machines.host(args, [])
        try:
            solo_tps, _ = aggregate(alone, args.model, args.tokens)
        finally:
            alone.stop()
        figures = {}
        for policy in ("cache-aware", "round-robin"):
            engine = machines.host(args, ["--replicas", ",".join(machines.names),
                                          "--replica-policy", policy])
            try:  # the follow-ups first: the 8 streams' conversations would crowd them
                figures[policy] = follow_ups(engine, args.model, args.words,
                                             args.replicas + 1, policy)
                if policy == "cache-aware":
                    figures["tps"], figures["answered"] = aggregate(engine, args.model, args.tokens)
            finally:
                engine.stop()
    finally:
        machines.close()
    sticky, spread = (statistics.median(figures[p][0]) for p in ("cache-aware", "round-robin"))
    n = args.replicas + 1
    print(f"\nreplicas: {n} machines on this one machine's {os.cpu_count()} cores, 1 thread "
          f"each; {args.model}")
    print(f"8 streams: {figures['tps']:.1f} tok/s over {sorted(figures['answered'])} against "
          f"{solo_tps:.1f} tok/s on this host alone ({figures['tps'] / solo_tps:.2f}x)")
    print(f"follow-up turns, first token: cache-aware {sticky:.2f} s "
          f"({figures['cache-aware'][1]:.0%} of the prompt cached), round-robin "
          f"{spread:.2f} s ({figures['round-robin'][1]:.0%} cached): "
          f"{spread / sticky:.1f}x (target >= 5x)")
    report(args.model, f"8 streams over {n} machines sharing {os.cpu_count()} cores",
           figures["tps"], "tok/s", solo_tps, "this host alone")
    report(args.model, "follow-up first token, cache-aware", sticky, "s", spread,
           "round-robin", "<= 0.2")


def main() -> int:
    args = arguments(__doc__, {"rounds": (3, 1), "tokens": (32, 4), "words": (1500, 50),
                               "replicas": (1, 1)},
                     more=lambda parser: [parser.add_argument("--large", default=GEMMA),
                                          parser.add_argument("--small", default=DEFAULT_MODEL)],
                     models=(DONOR,))
    args.model = args.models[0]
    kept, kept_loads = agent_mix(args, 3)
    swapped, swap_loads = agent_mix(args, 1)
    print(f"agent mix, 4 clients x {args.rounds} rounds (large {args.large}, small "
          f"{args.small}, embeddings): both kept loaded {kept:.1f} s ({kept_loads} loads), "
          f"swapping on each change {swapped:.1f} s ({swap_loads} loads): "
          f"{swapped / kept:.1f}x faster")
    if swap_loads <= kept_loads:
        raise BenchError("the swapping engine did not swap: nothing was compared")
    report(args.large, "agent mix: both models kept (s)", kept, "s", swapped,
           "swapping on each change", "< 1")
    replicas(args)
    if args.quick:
        print("quick mode: timings too short to judge")
    return 0


if __name__ == "__main__":
    sys.exit(main())
