"""What every bench shares, so that none measures the wrong thing again unnoticed.

- Engines are started with the response cache off (a bench repeats greedy requests: with
  it on, a later default had turned three benches into measurements of the cache).
- Every answer a bench times is checked: generated, not replayed from a cache, and as
  many tokens as asked (`generated`).
- A ratio is printed only against an anchor measured in the same run, and only when it is
  plausible for the two things compared (`ratio`): an impossible one stops the bench.
- `--model` runs a bench on another model, or on a shape of fixtures/shapes.py: a real
  model's exact layout and quantization with random weights, which decodes at that
  model's speed (`--model qwen3-8b`). `--json FILE` keeps each figure a bench reports
  (`report`): bench.suite, `make bench`, makes one table of them.
- `--quick` (what `make test` runs, tests/packaging/test_benches.py): a few tokens, one repetition,
  no anchors; it checks the same invariants and prints no ratio against an anchor. Its
  timings are too short to judge (a 4-token run on a busy 2-core CI machine once came out
  1.42x against itself), so there an implausible ratio is printed as such, not fatal:
  tests check behaviour, never timing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
# the benches' own models and caches, apart from the user's (HOMERACK_HOME decides)
os.environ.setdefault("HOMERACK_HOME", str(ROOT / ".cache" / "bench-home"))

from app.engine_proc import EngineProcess
from fixtures.network import sse_events

QUICK_NOTE = "quick mode: anchors not measured, so no ratio is printed"
DONOR = "smollm2-135m-instruct-q4_1"  # the tokenizer a shape's random weights run with
# set by `arguments`: a bench is one process with one command line
_quick = False
_json: Path | None = None
_figures: list[dict] = []


class BenchError(SystemExit):
    """The bench cannot report what it claims to measure; exits 1 with the reason."""

    def __init__(self, message: str):
        super().__init__(f"bench error: {message}")


def arguments(doc: str | None, sizes: dict, more=lambda _parser: None,
              models: tuple[str, ...] = ()) -> argparse.Namespace:
    """The command line: --threads, --quick, --json, --NAME for each of `sizes` ({NAME:
    (default, value in quick mode)}), and --model (repeatable) when the bench runs
    `models`, which it replaces: `args.models` are model ids, a shape's written once.
    `more(parser)` adds a bench's own."""
    parser = argparse.ArgumentParser(description=doc,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=min(os.cpu_count() or 2, 8))
    parser.add_argument("--quick", action="store_true",
                        help="a few tokens, one repetition, no anchors (make test runs it)")
    parser.add_argument("--json", type=Path, help="write the figures reported here to FILE")
    if models:
        parser.add_argument("--model", action="append", default=[], help=(
            "a model of the models folder, or a shape of fixtures/shapes.py (random weights "
            f"of a real model's layout: {', '.join(RUNNABLE)}); repeatable; default: "
            + ", ".join(models)))
    for name, (default, _in_quick) in sizes.items():
        parser.add_argument(f"--{name}", type=type(default), default=default)
    more(parser)
    global _quick, _json
    args = parser.parse_args()
    _quick, _json = args.quick, args.json
    if models:
        args.models = [model_id(m) for m in args.model or models]
    for name, (_default, quick) in sizes.items() if args.quick else ():
        setattr(args, name.replace("-", "_"), quick)
    return args


RUNNABLE = ("qwen3-1.7b", "llama-3.2-3b", "qwen3-8b", "qwen3-30b-a3b-8l")


def model_id(name: str) -> str:
    """A model id of the models folder: `name` itself, or for a shape of fixtures/shapes.py
    its random-weight file (written once, with the starter's tokenizer) linked there."""
    from app.paths import paths
    from fixtures.shapes import SHAPES, cached

    if name not in SHAPES:
        return name
    path = cached(SHAPES[name], donor=donor())
    link = paths().models / f"{name}-random.gguf"
    if link.is_symlink() and link.resolve() != path.resolve():
        link.unlink()  # the writer's layout changed since
    if not link.exists():
        link.symlink_to(path)
    return link.stem


def donor() -> Path:
    """The starter whose tokenizer runs a shape's random weights: installed into the
    benches' home first, as `homerack models` would (a fresh clone has nothing to do);
    HOMERACK_SHAPE_DONOR's file instead where it is set."""
    from app.local_models import open_store
    from fixtures.shapes import env_donor

    return env_donor() or open_store().resolve(DONOR).path


def report(model: str, figure: str, value: float, unit: str, anchor: float | None = None,
           anchor_name: str = "", target: str = "") -> None:
    """One figure of this run, kept in --json's file (rewritten at each, so a bench that
    stops half-way keeps what it measured). `anchor`: the same figure measured in this
    run by `anchor_name`; `target`: the goal for value / anchor, in words."""
    _figures.append({"bench": Path(sys.argv[0]).stem, "model": model, "figure": figure,
                     "value": value, "unit": unit, "anchor": anchor,
                     "anchor_name": anchor_name, "target": target, "quick": _quick,
                     "ratio": value / anchor if anchor else None})
    if _json:
        _json.parent.mkdir(parents=True, exist_ok=True)
        _json.write_text(json.dumps(_figures, indent=1))


@dataclass
class RunningEngine:
    """A `homerack serve` a bench measures, with its model loaded."""
    process: EngineProcess
    url: str
    token: str

    @property
    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.token}"}

    def client(self, timeout: float = 600) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.headers, timeout=timeout)

    def health(self) -> dict:
        return httpx.get(f"{self.url}/health", headers=self.headers, timeout=30).json()

    def stop(self) -> None:
        self.process.stop()


def start_engine(args: list[str], env: dict | None = None, response_cache: bool = False,
                 loaded=lambda health: health["model"]) -> RunningEngine:
    """A real engine (`homerack serve ARGS`), once `loaded(its /health)` is true; without
    the response cache unless the bench measures that cache."""
    if not response_cache:
        args = [*args, "--response-cache-mib", "0"]
    process = EngineProcess(args, env=env)
    address = process.wait_ready()
    engine = RunningEngine(process, address.url, address.token)
    deadline = time.monotonic() + 300
    while not loaded(engine.health()):  # loaded before timing
        if time.monotonic() > deadline:
            engine.stop()
            raise BenchError(f"the engine did not load its model: {engine.health()}")
        time.sleep(0.05)
    if not response_cache and engine.health()["response_cache"] is not None:
        engine.stop()
        raise BenchError("the response cache is on in an engine started without it")
    return engine


chunks = sse_events  # the JSON chunks of a streamed answer, as they arrive


def at_once(work, items: list) -> list:
    """`work(item)` for every item, each in a thread of its own, started together; the
    results in order (a BenchError, the bench stopping, when any failed)."""
    results, errors = [None] * len(items), []

    def run(i):
        try:
            results[i] = work(items[i])
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(items))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise BenchError(f"a request failed: {errors[0]!r}")
    return results


def stream_times(url: str, headers: dict, body: dict, tokens: int, checked: bool) -> list[float]:
    """When each chunk of a streamed greedy completion of exactly `tokens` tokens arrived
    (`body`: the prompt, and the model, adapters... to add), the last (its end) included.
    Chunks are not tokens: a special token streams no text from Homerack and an empty
    chunk from llama-server. `checked`: Homerack's answer, its usage checked (generated,
    every token)."""
    body = {"max_tokens": tokens, "n_predict": tokens, "temperature": 0, "stream": True,
            "ignore_eos": True, **body}
    if checked:
        body["stream_options"] = {"include_usage": True}
    times, usage = [], None
    with httpx.stream("POST", f"{url}/v1/completions", json=body, headers=headers,
                      timeout=600) as reply:
        reply.raise_for_status()
        for chunk in chunks(reply):
            if chunk.get("choices"):
                times.append(time.perf_counter())
            usage = chunk.get("usage") or usage
    if checked:
        generated(usage, f"{url} {body.get('model')} {body['prompt']!r}", tokens)
    return times


def timed_completion(http: httpx.Client, model: str, prompt: str, tokens: int, what: str):
    """A streamed greedy completion of exactly `tokens` tokens, checked as generated:
    (client-measured decode tokens/s, its usage)."""
    stamps, usage = streamed_completion(http, model, prompt, tokens, what)
    return (len(stamps) - 1) / (stamps[-1] - stamps[0]), usage


def streamed_completion(http: httpx.Client, model: str, prompt: str, tokens: int, what: str):
    """A streamed greedy completion of exactly `tokens` tokens, checked as generated: (when
    each piece of text arrived, its usage)."""
    body = {"model": model, "prompt": prompt, "max_tokens": tokens, "temperature": 0,
            "stream": True, "ignore_eos": True, "stream_options": {"include_usage": True}}
    stamps, usage = [], None
    with http.stream("POST", "/v1/completions", json=body) as reply:
        for chunk in chunks(reply):
            if chunk["choices"] and chunk["choices"][0]["text"]:
                stamps.append(time.perf_counter())
            usage = chunk.get("usage") or usage
    return stamps, generated(usage, what, tokens)


def generated(usage: dict | None, what: str, tokens: int | None = None) -> dict:
    """`usage` of an answer the engine generated; a replayed, empty or short one stops the
    bench (`tokens`: exactly this many were asked for, with ignore_eos)."""
    if not usage:
        raise BenchError(f"{what}: the answer carried no usage to check")
    if usage.get("response_cache") == "hit":
        raise BenchError(f"{what}: answered from the response cache, not generated")
    done = usage.get("completion_tokens", 0)
    if done < 1 or (tokens is not None and done != tokens):
        raise BenchError(f"{what}: {done} tokens generated, {tokens or 'some'} asked for")
    return usage


def ratio(value: float, anchor: float | None, what: str, low: float, high: float) -> float:
    """value / anchor, when the anchor was measured in this run and the ratio lies in
    [low, high] (beyond: one side did not do the work the other did)."""
    if anchor is None or anchor <= 0:
        raise BenchError(f"{what}: no anchor was measured in this run, no ratio")
    result = value / anchor
    if not low <= result <= high:
        message = (f"{what}: {result:.2f}x its anchor is implausible (expected "
                   f"{low}-{high}x): {value:.1f} against {anchor:.1f}")
        if not _quick:
            raise BenchError(message)
        print(f"quick mode, timings too short to judge: {message}")
    return result
