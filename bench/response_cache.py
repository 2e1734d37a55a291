"""The response cache: the time of a hit against a cold request of the same length, in
one run of one engine (greedy requests through the API; each cold prompt is new, so it
is generated, then asked again, so it is replayed).

    python -m bench.response_cache [--model ID] [--requests 20] [--tokens 64] [--quick]

Reported: client round trip per cold request and per hit (p50/p95), their ratio, and a
streamed hit's time to its last chunk; then the engine's side alone, in-process: from
submit to the last event of a hit. Target: a hit under 10 ms p95 (engine side).
"""

from __future__ import annotations

import statistics
import sys
import time
import uuid
from pathlib import Path

import httpx

from .common import BenchError, arguments, generated, ratio, report, start_engine

from app.paths import paths

MODEL = "smollm2-135m-instruct-q4_1"


def timed(http: httpx.Client, body: dict) -> tuple[float, dict]:
    began = time.perf_counter()
    reply = http.post("/v1/chat/completions", json=body)
    reply.raise_for_status()
    return time.perf_counter() - began, reply.json()


def streamed(http: httpx.Client, body: dict) -> float:
    began = time.perf_counter()
    with http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as reply:
        for _line in reply.iter_lines():
            pass
    return time.perf_counter() - began


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[int(q * (len(ordered) - 1))]


def main() -> int:
    args = arguments(__doc__, {"requests": (20, 2), "tokens": (64, 8)}, models=(MODEL,))
    model = args.models[0]  # one model a run
    engine = start_engine(["--threads", str(args.threads), "--model", model, "--ctx", "2048"],
                          response_cache=True)
    cold, hits, streams = [], [], []
    try:
        with engine.client() as http:
            for i in range(args.requests + 1):
                body = {"model": model, "temperature": 0, "max_tokens": args.tokens,
                        "ignore_eos": True, "messages": [{"role": "user", "content":
                        f"Tell me a story about the number {uuid.uuid4().int % 10**6}."}]}
                seconds, first = timed(http, body)
                generated(first["usage"], "a new question", args.tokens)
                again, second = timed(http, body)
                if second["homerack"]["response_cache"] != "hit" or \
                        second["choices"][0]["message"] != first["choices"][0]["message"]:
                    raise BenchError(f"the repeated question was not replayed: {second}")
                if i:  # the first pair warms up
                    cold.append(seconds)
                    hits.append(again)
                    streams.append(streamed(http, body))
            status = http.get("/health").json()["response_cache"]
    finally:
        engine.stop()
    print(f"\n{args.requests} greedy requests of {args.tokens} tokens, {model}, "
          f"{args.threads} threads (client round trips on loopback)")
    print(f"cold      p50 {statistics.median(cold) * 1000:8.1f} ms   p95 {pct(cold, .95) * 1000:8.1f} ms")
    print(f"hit       p50 {statistics.median(hits) * 1000:8.2f} ms   p95 {pct(hits, .95) * 1000:8.2f} ms")
    print(f"hit, SSE  p50 {statistics.median(streams) * 1000:8.2f} ms   p95 {pct(streams, .95) * 1000:8.2f} ms")
    share = ratio(statistics.median(hits), statistics.median(cold), "hit/cold", 0, 1)
    print(f"a hit takes {share:.4f}x the time of a cold request ({1 / share:.0f}x faster); "
          "target: under 10 ms p95")
    print(f"cache: {status['entries']} entries, {status['bytes']} bytes, hits {status['hits']}")
    report(model, "response cache hit (client round trip)", 1000 * statistics.median(hits),
           "ms", 1000 * statistics.median(cold), "the cold request", "< 10 ms p95")
    engine_side(args, model)
    return 0


def engine_side(args, model: str) -> None:
    """Submit to last event of a hit, in-process (no HTTP), against the cold request."""
    import tempfile
    import threading

    from engine.engine import Engine
    from engine.settings import EngineSettings
    from engine.events import Failed, Finished, GenerationRequest, SamplingParams
    from engine.catalog.gguf_file import GGUFInspector
    from engine.settings import LoadSettings
    from engine.catalog.models import ModelStore

    store = ModelStore(paths().models, GGUFInspector())
    with tempfile.TemporaryDirectory() as folder:
        engine = Engine(store, EngineSettings(LoadSettings(n_ctx=2048, n_threads=args.threads),
                                              response_cache=Path(folder) / "answers.sqlite"))
        try:
            def answer(request) -> float:
                done = threading.Event()
                began = time.perf_counter()
                engine.submit(request, lambda e: isinstance(e, (Finished, Failed)) and done.set())
                done.wait(600)
                return time.perf_counter() - began

            cold, hits = [], []
            for i in range(args.requests):
                request = GenerationRequest(
                    store.resolve(model), messages=({"role": "user", "content":
                                                     f"Tell me a story about the number {i}."},),
                    sampling=SamplingParams(temperature=0), max_tokens=args.tokens,
                    ignore_eos=True)
                cold.append(answer(request))
                hits.append(answer(request))
        finally:
            engine.close()
    print(f"engine side: cold p50 {statistics.median(cold) * 1000:.1f} ms; hit p50 "
          f"{statistics.median(hits) * 1000:.2f} ms, p95 {pct(hits, .95) * 1000:.2f} ms "
          f"({statistics.median(cold) / statistics.median(hits):.0f}x faster)")


if __name__ == "__main__":
    sys.exit(main())
