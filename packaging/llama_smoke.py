"""Prove an installed llama.cpp build before the project uses it.

A build can compile and import yet die on its first decode: llama.cpp's AMX weight
repack faults on some Xeons (llama.cpp #20824), and a wheel compiled for another CPU
stops with SIGILL. So setup runs this in a child process: tiny random models in each
weight type the CPU backend repacks or accelerates, a batched prompt, single-token
decoding, logits checked finite and the batched result checked against the same prompt
evaluated one token at a time. A child that dies is named by the test it was running.

    python packaging/llama_smoke.py          # run the whole smoke test, print its line

Only the standard library, numpy and gguf are needed in the parent.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

N_EMBD, N_FF, N_BATCH, N_PROMPT, N_DECODE = 256, 512, 64, 48, 8
#: batched and one-at-a-time kernels round differently; a broken kernel is off by far more
TOLERANCE = 0.05
#: fault injection for tests of setup's fallback: the child kills itself at this type
FAULT_ENV = "HOMERACK_SMOKE_FAULT"


@dataclass(frozen=True)
class SmokeResult:
    ok: bool
    summary: str  # one line for people
    seconds: float
    failed: str | None = None  # the weight type whose test died or failed


def run_smoke(python: str = sys.executable, timeout: float = 300.0) -> SmokeResult:
    """Write the tiny models and check them all in one child process of `python`."""
    from tiny_gguf import WEIGHT_TYPES, write_tiny_model

    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="homerack-smoke-") as folder:
        models = [str(write_tiny_model(Path(folder) / f"{kind}.gguf", n_embd=N_EMBD, n_ff=N_FF,
                                       weight_type=kind, chat_template=None))
                  for kind in WEIGHT_TYPES]
        try:
            child = subprocess.run([python, __file__, "--check", *models],
                                   capture_output=True, text=True, timeout=timeout)
            lines, code, err = child.stdout.splitlines(), child.returncode, child.stderr
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
            lines, code, err = out.splitlines(), None, f"no answer after {timeout:.0f} s"
    return _judge(lines, code, err, time.perf_counter() - started, WEIGHT_TYPES)


def _judge(lines: list[str], code: int | None, stderr: str, seconds: float,
           kinds: tuple[str, ...]) -> SmokeResult:
    """What the child's report lines and exit say."""
    reports = [json.loads(line) for line in lines if line.startswith("{")]
    missing = next((r["missing"] for r in reports if "missing" in r), None)
    if missing:
        return SmokeResult(False, f"the Python package {missing!r} is not installed", seconds,
                           "environment")
    running = reports[-1]["kind"] if reports and "ok" not in reports[-1] else None
    bad = next((r for r in reports if r.get("ok") is False), None)
    if bad:
        return SmokeResult(False, f"{bad['kind']} model returned garbage: {bad['detail']}",
                           seconds, bad["kind"])
    if code != 0:
        where = f"while testing the {running} model" if running else "before its first test"
        return SmokeResult(False, f"the test process {_death(code, stderr)} {where}",
                           seconds, running or "startup")
    done = [r["kind"] for r in reports if r.get("ok")]
    if done != list(kinds):
        return SmokeResult(False, f"tests missing from the report: {sorted(set(kinds) - set(done))}",
                           seconds, "report")
    return SmokeResult(True, f"passed: {' '.join(done)} models, a {N_PROMPT}-token batch and "
                       f"{N_DECODE} single-token decodes each, logits finite and consistent",
                       seconds)


def _death(code: int | None, stderr: str) -> str:
    if code is None:
        return stderr
    if code < 0:
        try:
            return f"died with {signal.Signals(-code).name}"
        except ValueError:
            return f"died with signal {-code}"
    tail = stderr.strip().splitlines()[-1:] or ["no message"]
    return f"failed (exit {code}: {tail[0]})"


# -- the child ----------------------------------------------------------------------

def _check_all(paths: list[str]) -> None:
    try:
        import llama_cpp as llama
    except ModuleNotFoundError as exc:
        if exc.name == "llama_cpp":
            raise  # no build installed: the build's failure
        print(json.dumps({"missing": exc.name}), flush=True)  # a dependency: setup's
        sys.exit(3)

    quiet = llama.llama_log_callback(lambda *_: None)
    llama.llama_log_set(quiet, None)
    llama.llama_backend_init()
    fault = os.environ.get(FAULT_ENV)
    for path in paths:
        kind = Path(path).stem
        print(json.dumps({"kind": kind}), flush=True)  # names the test if the process dies
        if fault == kind:
            os.kill(os.getpid(), signal.SIGSEGV)
        detail = _check_one(llama, path)
        print(json.dumps({"kind": kind, "ok": detail is None, "detail": detail}), flush=True)


def _check_one(llama, path: str) -> str | None:
    """None when the model evaluates sanely; otherwise what was wrong."""
    import numpy as np

    mparams = llama.llama_model_default_params()  # extra buffer types on: repacked weights
    model = llama.llama_model_load_from_file(path.encode(), mparams)
    if not model:
        return "llama.cpp could not load it"
    cparams = llama.llama_context_default_params()
    cparams.n_ctx, cparams.n_batch, cparams.n_ubatch = 256, N_BATCH, N_BATCH
    cparams.n_threads = cparams.n_threads_batch = min(os.cpu_count() or 1, 8)
    ctx = llama.llama_init_from_model(model, cparams)
    n_vocab = llama.llama_vocab_n_tokens(llama.llama_model_get_vocab(model))
    batch = llama.llama_batch_init(N_BATCH, 0, 1)
    memory = llama.llama_get_memory(ctx)

    def decode(tokens: list[int], start: int) -> np.ndarray:
        for i, token in enumerate(tokens):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, start + i, 1
            batch.seq_id[i][0], batch.logits[i] = 0, i == len(tokens) - 1
        batch.n_tokens = len(tokens)
        if llama.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")
        return np.ctypeslib.as_array(llama.llama_get_logits_ith(ctx, -1),
                                     shape=(n_vocab,)).copy()

    try:
        prompt = [int(t) for t in np.random.default_rng(1).integers(5, n_vocab, N_PROMPT)]
        batched = decode(prompt, 0)
        logits = [batched]
        for step in range(N_DECODE):
            logits.append(decode([int(logits[-1].argmax())], N_PROMPT + step))
        llama.llama_memory_seq_rm(memory, 0, 0, -1)
        for pos, token in enumerate(prompt):
            single = decode([token], pos)
        return _garbage(logits, batched, single)
    except RuntimeError as exc:
        return str(exc)
    finally:
        llama.llama_batch_free(batch)
        llama.llama_free(ctx)
        llama.llama_model_free(model)


def _garbage(logits: list, batched, single) -> str | None:
    import numpy as np

    for step, row in enumerate(logits):
        if not np.isfinite(row).all():
            return f"non-finite logits at decode {step}"
        if row.std() == 0:
            return f"constant logits at decode {step}"
    gap = float(np.abs(batched - single).max())
    scale = max(1.0, float(np.abs(single).max()))
    if gap > TOLERANCE * scale:
        return (f"the batched prompt and the same prompt one token at a time disagree "
                f"(max gap {gap:.3g}, logits up to {scale:.3g})")
    return None


if __name__ == "__main__":
    if sys.argv[1:2] == ["--check"]:
        _check_all(sys.argv[2:])
    else:
        sys.path.insert(0, str(Path(__file__).parent))
        result = run_smoke()
        print(f"llama.cpp smoke test: {result.summary} ({result.seconds:.1f} s)")
        sys.exit(0 if result.ok else 1)
