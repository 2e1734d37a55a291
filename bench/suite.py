"""The benchmarks at the scale people run (`make bench`): each bench on random-weight
models of real layouts (fixtures/shapes.py; they decode at the real models' speed), its
anchor measured in the same run, and one table of every figure, in markdown and JSON.

    python -m bench.suite [--only decode,batching] [--out build/bench] [--threads 2]
    python -m bench.suite --quick      (each bench's quick mode, on the starters)

A bench that fails is in the table as failed, with its last line; the others still run.
The first run writes the shapes' files (about 10 GB under .cache/shapes, some minutes).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from . import SUITE

ROOT = Path(__file__).resolve().parents[1]


def run_bench(bench: str, models: tuple[str, ...], extra: tuple[str, ...], out: Path,
              threads: int, quick: bool) -> dict:
    """One bench in a process of its own, its output in out/BENCH.log: how it ended."""
    figures = out / f"{bench}.json"
    figures.unlink(missing_ok=True)
    command = [sys.executable, "-m", f"bench.{bench}", "--threads", str(threads),
               "--json", str(figures), *extra]
    command += ["--quick"] if quick else [arg for m in models for arg in ("--model", m)]
    start = time.monotonic()
    with (out / f"{bench}.log").open("w") as log:
        done = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                              env=dict(os.environ, PYTHONUNBUFFERED="1"))
    lines = (out / f"{bench}.log").read_text(errors="replace").strip().splitlines()
    return {"bench": bench, "exit": done.returncode, "seconds": round(time.monotonic() - start),
            "last_line": lines[-1] if lines else "",
            "figures": json.loads(figures.read_text()) if figures.exists() else []}


def machine(threads: int) -> dict:
    import psutil

    from engine.machine.bandwidth import memory_bandwidth

    cpu = next((line.split(":", 1)[1].strip() for line in
                Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")),
               platform.processor()) if Path("/proc/cpuinfo").exists() else platform.processor()
    return {"cpu": cpu, "cores": psutil.cpu_count(logical=False) or psutil.cpu_count(),
            "ram_gib": round(psutil.virtual_memory().total / 2**30, 1), "threads": threads,
            "ram_gbs": round(memory_bandwidth(512 << 20, 4, threads) / 1e9, 1),
            "system": f"{platform.system()} {platform.machine()}",
            "date": time.strftime("%Y-%m-%d")}


def number(value: float | None, unit: str = "") -> str:
    if value is None:
        return "—"
    if unit == "share":
        return f"{value:.0%}"
    text = f"{value:.3g}" if abs(value) < 100 else f"{value:,.0f}"
    return f"{text} {unit}".strip()


def table(runs: list[dict], host: dict) -> str:
    """The markdown table: one row per figure, a failed bench as a row of its own."""
    lines = [f"{host['cpu']}, {host['cores']} cores, {host['ram_gib']} GiB RAM "
             f"({host['ram_gbs']} GB/s read with {host['threads']} threads), {host['system']}, "
             f"{host['date']}; {host['threads']} threads.", "",
             "| bench | model | figure | Homerack | anchor (same run) | ratio | target |",
             "|---|---|---|---|---|---|---|"]
    for run in runs:
        for f in run["figures"]:
            anchor = f"{number(f['anchor'], f['unit'])} {f['anchor_name']}" \
                if f["anchor"] is not None else "—"
            ratio = f"{f['ratio']:.2f}x" if f["ratio"] is not None else "—"
            lines.append(f"| {run['bench']} | {f['model']} | {f['figure']} | "
                         f"{number(f['value'], f['unit'])} | {anchor} | {ratio} | {f['target']} |")
        if run["exit"]:
            lines.append(f"| {run['bench']} | | **failed** (exit {run['exit']}): "
                         f"{run['last_line'][:160]} | | | | |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", help="comma-separated benches of the suite")
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "bench")
    parser.add_argument("--threads", type=int, default=min(os.cpu_count() or 2, 8))
    parser.add_argument("--quick", action="store_true", help="each bench's quick mode")
    args = parser.parse_args()
    wanted = set(args.only.split(",")) if args.only else {b.name for b in SUITE}
    unknown = wanted - {b.name for b in SUITE}
    if unknown:
        parser.error(f"not in the suite: {', '.join(sorted(unknown))}")
    args.out.mkdir(parents=True, exist_ok=True)
    host = machine(args.threads)
    runs = []
    for b in SUITE:
        if b.name in wanted:
            print(f"{b.name} on {', '.join(b.suite_models)}: log in {args.out / b.name}.log",
                  flush=True)
            runs.append(run_bench(b.name, b.suite_models, b.suite_options, args.out,
                                  args.threads, args.quick))
            print(f"  {'done' if not runs[-1]['exit'] else 'FAILED'} in {runs[-1]['seconds']} s: "
                  f"{runs[-1]['last_line']}", flush=True)
    (args.out / "results.json").write_text(json.dumps({"machine": host, "runs": runs}, indent=1))
    (args.out / "results.md").write_text(table(runs, host))
    print(f"\n{table(runs, host)}\nwritten: {args.out / 'results.md'}, {args.out / 'results.json'}")
    return 1 if any(run["exit"] for run in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
