"""Routing between a small and a large model, measured on a labelled prompt set
(bench/routing_prompts.jsonl: 200 prompts — short facts, arithmetic, one-sentence
summaries, small Python functions — each with its reference and its scoring rule).

For each way of answering — always the small model, always the large one, the rules,
the cascade — in one run of one engine (`homerack serve --route SMALL,LARGE`, response
cache off, greedy): the share of requests the small model served, the mean score, and
the total time. Then the cascade's threshold calibrated from the same run: for each
threshold, the share and score the cascade would have had, from the small model's
measured confidence on each prompt and both models' scores on it. And the rules'
decision cost, in-process.

    python -m bench.routing [--small M] [--large M] [--threshold T] [--limit N] [--quick]

Scoring: `contains` (a reference answer appears), `number` (the first number equals it),
`keywords` (the share of key terms present), `python_tests` (the answer's code passes the
asserts, run in a separate `python -I` with a 5 s timeout). The default pair is the
starter models, SmolLM2 135M and Gemma 3 270M: both are tiny and weak; rerun with a real
pair on a bigger machine (the flags take any local model).
"""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from .common import ROOT, arguments, generated, start_engine

from engine.events import GenerationRequest
from engine.catalog.models import LocalModel
from engine.routing import DEFAULT_THRESHOLD, Routing, decide

PROMPTS = ROOT / "bench" / "routing_prompts.jsonl"
WAYS = ("small", "large", "rules", "cascade")


# -- scoring ----------------------------------------------------------------------------

def score(row: dict, text: str) -> float:
    return SCORERS[row["score"]](row["answers"], text)


def _contains(answers: list[str], text: str) -> float:
    return float(any(re.search(rf"\b{re.escape(a)}\b", text, re.IGNORECASE) for a in answers))


def _number(answers: list[str], text: str) -> float:
    found = re.search(r"-?\d[\d,]*", text)
    return float(bool(found) and found.group(0).replace(",", "") == answers[0])


def _keywords(answers: list[str], text: str) -> float:
    lowered = text.lower()
    return sum(any(alt.lower() in lowered for alt in group.split("|"))
               for group in answers) / len(answers)


def _python_tests(answers: list[str], text: str) -> float:
    fenced = re.findall(r"```(?:python)?\n(.*?)```", text, re.DOTALL)
    code = "\n".join(fenced) if fenced else text
    program = code + "\n" + "\n".join(f"assert {test}" for test in answers) + "\n"
    with tempfile.TemporaryDirectory() as folder:
        try:
            done = subprocess.run([sys.executable, "-I", "-c", program], cwd=folder,
                                  capture_output=True, timeout=5)
        except subprocess.TimeoutExpired:
            return 0.0
    return float(done.returncode == 0)


SCORERS = {"contains": _contains, "number": _number, "keywords": _keywords,
           "python_tests": _python_tests}


# -- running ----------------------------------------------------------------------------

def ask(http: httpx.Client, model: str, row: dict) -> dict:
    began = time.perf_counter()
    reply = http.post("/v1/chat/completions", json={
        "model": model, "messages": [{"role": "user", "content": row["prompt"]}],
        "temperature": 0, "max_tokens": row["max_tokens"]})
    reply.raise_for_status()
    body = reply.json()
    generated(body["usage"], f"{model} on {row['prompt'][:30]!r}")
    text = body["choices"][0]["message"]["content"] or ""
    return {"model": body["model"], "text": text, "score": score(row, text),
            "seconds": time.perf_counter() - began, "route": body["homerack"].get("route")}


def run_way(http, way: str, rows: list[dict], small: str, large: str, threshold: float):
    if way in ("rules", "cascade"):
        http.put("/v1/routing", json={"small": small, "large": large, "mode": way,
                                      "threshold": threshold}).raise_for_status()
    model = {"small": small, "large": large}.get(way, "auto")
    return [ask(http, model, row) for row in rows]


def decision_cost(rows: list[dict]) -> tuple[float, float]:
    """p50 and p95 of the rules' decision, in microseconds."""
    pair = Routing(LocalModel("small", Path("s"), 0, False), LocalModel("large", Path("l"), 0, False))
    times = []
    for row in rows * 5:
        request = GenerationRequest(pair.large, messages=({"role": "user", "content": row["prompt"]},))
        began = time.perf_counter()
        decide(pair, request)
        times.append((time.perf_counter() - began) * 1e6)
    times.sort()
    return statistics.median(times), times[int(0.95 * (len(times) - 1))]


def calibrate(rows, results) -> list[tuple[float, float, float, float]]:
    """(threshold, small share, mean score, seconds) the cascade would have had."""
    table = []
    cascade, small, large = results["cascade"], results["small"], results["large"]
    for step in range(0, 21):
        t = step / 20
        kept = [r["route"]["confidence"] >= t for r in cascade]
        scores = [s["score"] if k else l["score"] for k, s, l in zip(kept, small, large)]
        seconds = sum(s["seconds"] + (0 if k else l["seconds"])
                      for k, s, l in zip(kept, small, large))
        table.append((t, sum(kept) / len(rows), statistics.mean(scores), seconds))
    return table


def main() -> int:
    def more(parser):
        parser.add_argument("--small", default="smollm2-135m-instruct-q4_1")
        parser.add_argument("--large", default="gemma-3-270m-q4_k_m")
        parser.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD)
        parser.add_argument("--limit", type=int, help="the first N prompts of each kind")
        parser.add_argument("--out", type=Path, default=ROOT / ".cache" / "bench-routing.json")
    args = arguments(__doc__, {}, more)
    if args.quick:
        args.limit = 1
    rows = [json.loads(line) for line in PROMPTS.read_text().splitlines() if line.strip()]
    if args.limit:
        rows = [r for kind in dict.fromkeys(r["kind"] for r in rows)
                for r in [x for x in rows if x["kind"] == kind][:args.limit]]
    engine = start_engine(["--threads", str(args.threads), "--ctx", "2048", "--parallel", "1",
                           "--no-prompt-cache", "--route", f"{args.small},{args.large}"],
                          loaded=lambda health: ((health.get("routing") or {}).get(
                              "companion") or {}).get("model"))  # both models loaded
    results = {}
    try:
        with engine.client() as http:
            ask(http, args.small, rows[0]), ask(http, args.large, rows[0])  # warm up
            for way in WAYS:
                results[way] = run_way(http, way, rows, args.small, args.large, args.threshold)
    finally:
        engine.stop()
    report(rows, results, args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"rows": rows, "results": results}, indent=1))
    return 0


def report(rows, results, args) -> None:
    kinds = list(dict.fromkeys(r["kind"] for r in rows))
    print(f"\n{len(rows)} prompts; small {args.small}, large {args.large}, "
          f"cascade threshold {args.threshold}, greedy, {args.threads} threads")
    print(f"{'way':<10}{'small share':>12}{'score':>8}" + "".join(f"{k:>12}" for k in kinds)
          + f"{'total s':>10}{'vs large':>10}")
    large_s = sum(r["seconds"] for r in results["large"])
    for way in WAYS:
        got = results[way]
        share = sum(r["model"] == args.small for r in got) / len(got)
        by_kind = [statistics.mean(r["score"] for r, row in zip(got, rows) if row["kind"] == k)
                   for k in kinds]
        total = sum(r["seconds"] for r in got)
        print(f"{way:<10}{share:>12.2f}{statistics.mean(r['score'] for r in got):>8.3f}"
              + "".join(f"{s:>12.3f}" for s in by_kind) + f"{total:>10.1f}{total / large_s:>9.2f}x")
    p50, p95 = decision_cost(rows)
    print(f"\nrules: decision {p50:.0f} µs p50, {p95:.0f} µs p95")
    confidences = [r["route"]["confidence"] for r in results["cascade"]]
    cuts = statistics.quantiles(confidences, n=4)
    print("\nthe small model's score by its confidence (is it informative?):")
    for low, high in zip([0.0, *cuts], [*cuts, 1.01]):
        band = [s["score"] for c, s in zip(confidences, results["small"]) if low <= c < high]
        if band:
            print(f"  confidence {low:.2f}-{min(high, 1):.2f}: {len(band):>3} prompts, "
                  f"small score {statistics.mean(band):.3f}")
    print("\ncascade calibration (from this run's confidences and both models' scores):")
    print(f"{'threshold':>10}{'small share':>12}{'score':>8}{'seconds':>10}")
    for t, share, mean, seconds in calibrate(rows, results):
        print(f"{t:>10.2f}{share:>12.2f}{mean:>8.3f}{seconds:>10.1f}")


if __name__ == "__main__":
    sys.exit(main())
