"""Decode speed of the packaged app's portable llama.cpp against the build compiled for
this machine (the anchor, measured in the same run): the variant the loader picks, and
lower ones forced with HOMERACK_CPU_VARIANT. A portable build must not cost speed where
the best variant matches the CPU.

    make package && .venv/bin/python -m bench.portable [--runs 5] [--tokens 128]
    .venv/bin/python -m bench.portable --quick   (the native build alone: no bundle needed)
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import tempfile

from .common import BenchError, QUICK_NOTE, ROOT, arguments, ratio, report

BUNDLE = ROOT / "dist" / "homerack" / "homerack"
PROMPT = "Write a short story about a robot who learns to paint."
SPEED = re.compile(r"\[(\d+) tokens, ([\d.]+) tok/s")


def tokens_per_second(command: list[str], env: dict, tokens: int, seed: int) -> float:
    done = subprocess.run([*command, "chat", PROMPT, "--max-tokens", str(tokens), "--seed",
                           str(seed), "-v"], env=env, capture_output=True, text=True, timeout=600)
    match = SPEED.search(done.stdout + done.stderr)
    if not match:
        raise BenchError(f"{' '.join(command)}: no speed figure\n{done.stdout}{done.stderr}")
    if "response cache" in done.stderr:
        raise BenchError(f"{' '.join(command)}: the answer was replayed, not generated")
    return float(match.group(2))


def main() -> int:
    # --variants: the lower variants to force
    args = arguments(__doc__, {"runs": (5, 1), "tokens": (128, 8), "variants": ("haswell,x64", "")})
    if not args.quick and not BUNDLE.exists():
        raise BenchError("no dist/homerack: run `make package` first")
    base = {k: v for k, v in os.environ.items() if k != "HOMERACK_CPU_VARIANT"}
    builds = [("native (this machine's venv build)", [sys.executable, "-m", "app"], {})]
    if not args.quick:
        builds.append(("portable, best variant", [str(BUNDLE)], {}))
    builds += [(f"portable, {v} forced", [str(BUNDLE)], {"HOMERACK_CPU_VARIANT": v})
               for v in args.variants.split(",") if v]
    speeds: dict[str, list[float]] = {name: [] for name, _c, _e in builds}
    # a home each: its own engine and response cache (a repeated seeded question would be
    # answered from the cache, with no decoding to time)
    homes = {name: tempfile.mkdtemp(prefix="homerack-bench-") for name in speeds}
    for run in range(args.runs):  # interleaved: the machine's drift hits every build alike
        for name, command, extra in builds:
            env = {**base, **extra, "HOMERACK_HOME": homes[name]}
            speeds[name].append(tokens_per_second(command, env, args.tokens, seed=run + 1))
    anchor = statistics.median(speeds[builds[0][0]])
    print(f"SmolLM2 135M Q4_1, {args.tokens} tokens (seeded), median of {args.runs} runs")
    for name, values in speeds.items():
        median = statistics.median(values)
        against = "" if args.quick else \
            f"   {ratio(median, anchor, name, 0.05, 1.5):5.2f}x"  # a variant is no faster
        print(f"  {name:<36} {median:7.1f} tok/s{against}")
        report("smollm2-135m-instruct-q4_1", f"decode, {name}", median, "tok/s",
               None if args.quick or values is speeds[builds[0][0]] else anchor,
               "the native build", ">= 0.95 for the best variant")
    if args.quick:
        print(QUICK_NOTE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
