"""Documents: retrieval quality, indexing speed, bytes written and search latency, in one
run, on a public corpus every machine has: the Python standard library's own modules
(`Lib/*.py`, their docstrings and code), with 30 questions whose answering module is
known, written before any result was seen (QUESTIONS).

  quality    hit@1 and hit@5 (the answering file among the first passages) for BM25
             alone, the embeddings alone (the MiniLM starter), hybrid (reciprocal rank
             fusion) and hybrid + rerank (a MiniLM cross-encoder with a random head,
             fixtures/documents.py: its cost is real, its quality means nothing), and the
             milliseconds each search takes
  indexing   passages/s and MB/s from the collection's creation to ready (reading,
             cutting, embedding, storing), against llama-server --embedding (vendored
             commit) embedding the same passages in the same batches: the anchor
  writes     bytes the engine process wrote per MB of text indexed (its I/O counters)
  latency    one hybrid search's keyword and vector parts at 100,000 passages (random
             unit vectors, texts from the corpus), the median of 20

    python -m bench.documents [--threads 2] [--quick]
"""

from __future__ import annotations

import shutil
import statistics
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from .build_tools import build, llama_server
from .common import BenchError, QUICK_NOTE, arguments, ratio, report, start_engine
from app.paths import paths

MODEL = "all-minilm-l6-v2-f16"
QUESTIONS = [  # (question, the module that answers it)
    ("split a command line string with shell-like syntax and quotes", "shlex.py"),
    ("generate pseudo-random numbers with the Mersenne Twister", "random.py"),
    ("copy a file together with its permission bits", "shutil.py"),
    ("make a deep copy of an object using a memo dictionary", "copy.py"),
    ("heap queue algorithm: push and pop the smallest item", "heapq.py"),
    ("insert an item into a sorted list keeping it sorted with bisection", "bisect.py"),
    ("parse command line options with add_argument and subparsers", "argparse.py"),
    ("compare two sequences and produce a unified diff", "difflib.py"),
    ("match file names against Unix shell-style wildcards", "fnmatch.py"),
    ("create temporary files and directories securely", "tempfile.py"),
    ("read and write ZIP archives", "zipfile.py"),
    ("wrap and fill paragraphs of text to a width", "textwrap.py"),
    ("thread synchronisation with Lock, Condition and Semaphore", "threading.py"),
    ("read and write tar archives", "tarfile.py"),
    ("Base16, Base32 and Base64 data encodings", "base64.py"),
    ("print a month's calendar and test for leap years", "calendar.py"),
    ("mean, median, variance and standard deviation of data", "statistics.py"),
    ("rational numbers with a numerator and a denominator", "fractions.py"),
    ("parse INI configuration files with sections", "configparser.py"),
    ("serialize Python objects to a byte stream with protocols", "pickle.py"),
    ("secure hashes such as sha256 and md5", "hashlib.py"),
    ("manipulate IPv4 and IPv6 addresses and networks", "ipaddress.py"),
    ("a FIFO queue shared between threads", "queue.py"),
    ("run a child process and communicate through pipes with Popen", "subprocess.py"),
    ("string templates with $-substitution", "string.py"),
    ("split a path name into its directory and base name on POSIX", "posixpath.py"),
    ("read and write gzip compressed files", "gzip.py"),
    ("generic types with TypeVar and Protocol for type hints", "typing.py"),
    ("email address and header parsing of messages", "smtplib.py"),
    ("a sequence matcher that finds the longest matching blocks", "difflib.py"),
]
MODES = ("keyword", "embedding", "hybrid", "hybrid+rerank")
RERANKER = "minilm-reranker-random"
BATCH = 32


def corpus(quick: bool) -> list[Path]:
    """The standard library's top-level modules (quick: those that answer the first six
    questions, and six others)."""
    lib = Path(sysconfig.get_paths()["stdlib"])
    every = sorted(p for p in lib.glob("*.py") if not p.name.startswith("_"))
    if not quick:
        return every
    wanted = {answer for _, answer in QUESTIONS[:6]} | {"json.py", "csv.py", "glob.py",
                                                          "pprint.py", "uuid.py", "token.py"}
    return [p for p in every if p.name in wanted]


def index(engine, files: list[Path], folder: Path) -> tuple[float, int, dict]:
    """The corpus copied into a folder (a collection follows no link) and indexed:
    (seconds, bytes the engine wrote, the collection's state)."""
    import psutil

    folder.mkdir(parents=True, exist_ok=True)
    for path in files:
        shutil.copyfile(path, folder / path.name)
    process = psutil.Process(engine.process.process.pid)
    written = process.io_counters().write_bytes
    started = time.perf_counter()
    with engine.client(timeout=900) as http:
        added = http.post("/v1/collections", json={"name": "stdlib", "paths": [str(folder)]})
        if added.status_code != 200:
            raise BenchError(f"adding the corpus: {added.text[:300]}")
        while (state := http.get("/v1/collections/stdlib").json())["state"] != "ready":
            time.sleep(0.05)
    took = time.perf_counter() - started
    if state["files_indexed"] != len(files):
        raise BenchError(f"indexed {state['files_indexed']} of {len(files)}: {state['failed']}")
    return took, process.io_counters().write_bytes - written, state


def quality(engine, questions) -> dict[str, tuple[float, float, float]]:
    """hit@1, hit@5 and the median seconds of one search, for each mode, by the
    answering file."""
    hits = {mode: [0, 0, []] for mode in MODES}
    with engine.client() as http:
        for question, answer in questions:
            for mode in MODES:
                body = {"query": question, "top_k": 5, "mode": mode.split("+")[0],
                        "reranker": RERANKER if mode.endswith("rerank") else None}
                started = time.perf_counter()
                found = http.post("/v1/collections/stdlib/search", json=body)
                hits[mode][2].append(time.perf_counter() - started)
                if found.status_code != 200:
                    raise BenchError(f"search ({mode}): {found.text[:300]}")
                files = [f["path"].rsplit("/", 1)[-1] for f in found.json()["data"]]
                hits[mode][0] += files[:1] == [answer]
                hits[mode][1] += answer in files
    return {mode: (h1 / len(questions), h5 / len(questions), statistics.median(took))
            for mode, (h1, h5, took) in hits.items()}


def reranker() -> None:
    """The random-head reranker, written once, linked into the models folder."""
    from fixtures.documents import write_reranker
    from fixtures.shapes import CACHE, written_once

    written = written_once(CACHE / f"{RERANKER}.gguf", lambda tmp: write_reranker(
        (paths().models / f"{MODEL}.gguf").resolve(), tmp))
    link = paths().models / written.name
    if not link.exists():
        link.symlink_to(written)


def passages(index_file: Path) -> list[str]:
    import sqlite3

    with sqlite3.connect(index_file) as db:
        return [row[0] for row in db.execute("SELECT text FROM passages ORDER BY id")]


def anchor_rate(texts: list[str], threads: int) -> float:
    """llama-server --embedding on the same model: passages/s for the same passages."""
    model = paths().models / f"{MODEL}.gguf"
    with llama_server(build(), ["-m", str(model.resolve()), "--embedding", "-t", str(threads),
                                "-c", "512", "-b", "512", "-ub", "512", "-np", "1"]) as url:
        started = time.perf_counter()
        with httpx.Client(timeout=900) as http:
            for i in range(0, len(texts), BATCH):
                got = http.post(f"{url}/embedding", json={"content": texts[i:i + BATCH]})
                if got.status_code != 200:
                    raise BenchError(f"llama-server: {got.text[:300]}")
        return len(texts) / (time.perf_counter() - started)


def latency(texts: list[str], count: int) -> float:
    """Median seconds of one search's two parts at `count` passages."""
    from engine.documents.chunking import Passage
    from engine.documents.index import DocumentIndex

    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        store = DocumentIndex(Path(tmp) / "documents.sqlite")
        store.add("big", [tmp], MODEL)
        per_file = 1000
        for start in range(0, count, per_file):
            vectors = rng.normal(size=(per_file, 384)).astype(np.float32)
            vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
            found = [Passage(texts[(start + i) % len(texts)], None, 1, 1)
                     for i in range(per_file)]
            store.put("big", f"/corpus/{start}.txt", 1, 1, found, vectors)
        times = []
        for question, _ in QUESTIONS[:20]:
            vector = rng.normal(size=384).astype(np.float32)
            started = time.perf_counter()
            store.keyword("big", question, 20)
            ids, scores = store.similar("big", vector / np.linalg.norm(vector))
            np.argsort(-scores)[:20]
            times.append(time.perf_counter() - started)
        store.close()
    return statistics.median(times[1:])  # the first builds the matrix


def main() -> None:
    args = arguments(__doc__, {"passages": (100_000, 5_000)})
    files = corpus(args.quick)
    reranker()
    for stale in paths().data.glob("documents.sqlite*"):  # an earlier run's index would
        stale.unlink()                                     # resume and share the machine
    megabytes = sum(p.stat().st_size for p in files) / 2**20
    engine = start_engine(["--threads", str(args.threads), "--parallel", "1"],
                          loaded=lambda health: True)
    home = Path(tempfile.mkdtemp(prefix="homerack-docs-bench-"))
    try:
        took, written, state = index(engine, files, home / "corpus")
        scores = quality(engine, QUESTIONS[:6] if args.quick else QUESTIONS)
    finally:
        engine.stop()
    texts = passages(paths().data / "documents.sqlite")
    rate = state["passages"] / took
    print(f"corpus: {len(files)} modules, {megabytes:.1f} MB, {state['passages']:,} passages")
    for mode, (h1, h5, search_s) in scores.items():
        print(f"{mode:>13}: hit@1 {h1:.2f}  hit@5 {h5:.2f}  {search_s * 1000:.0f} ms a search")
        report(MODEL, f"hit@1 {mode}", h1, "", target="hybrid at least the best alone")
        report(MODEL, f"hit@5 {mode}", h5, "")
        report(MODEL, f"search ms {mode}", round(search_s * 1000, 1), "ms")
    print("(the reranker's head is random: its hit rates mean nothing, its cost is real)")
    anchor = None if args.quick else anchor_rate(texts, args.threads)
    line = (f"indexing: {rate:.1f} passages/s, {megabytes / took * 1000:.1f} kB/s "
            f"({took:.0f} s)")
    if anchor is None:
        print(line + "\n" + QUICK_NOTE)
    else:
        print(line + f" vs llama-server --embedding {anchor:.1f} passages/s "
              f"({ratio(rate, anchor, 'indexing', 0, 1e9):.2f}x)")
    report(MODEL, "indexing passages/s", round(rate, 1), "passages/s", anchor,
           "llama-server --embedding, same passages", "at least 0.8x")
    print(f"writes: {written / 2**20 / megabytes:.2f} MB written per MB indexed")
    report(MODEL, "bytes written per MB indexed", round(written / megabytes), "B")
    seconds = latency(texts, args.passages)
    print(f"search at {args.passages:,} passages: {seconds * 1000:.1f} ms")
    report(MODEL, f"search latency at {args.passages} passages", round(seconds, 4), "s")


if __name__ == "__main__":
    sys.exit(main())
