"""A faster draft: the same draft model with its output layer cut down to the tokens
text mostly uses.

With a large vocabulary a small draft spends most of each step in its output layer
(Gemma 3 270M Q4_K_M: 262,144 rows of 640, 72% of its bytes). Speculation needs only the
draft's guesses, and the main model checks every guess against its whole vocabulary,
so a draft that can propose just the 65,536 most used tokens keeps the output exact and
steps about twice as fast (llama-bench here: 157 vs 77 tok/s).

The cut model is a GGUF without a tokenizer whose token table (and output matrix) keeps
those rows; it is built once per draft file, off the engine thread, and cached. Its
inputs are fed as vectors read from the original file's full table, so text with tokens
outside the kept set still reads correctly; the scale a graph applies to token inputs
but not to vectors (Gemma multiplies by sqrt(n_embd)) is found by trying both once.
"""

from __future__ import annotations

import json
import math
import os
import sysconfig
import threading
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import HomerackError
from ..llama.runtime import LlamaModel
from ..llama.vocab import Vocabulary
from ..catalog.fingerprint import model_fingerprint
from ..catalog.gguf_file import open_gguf, write_whole

KEEP_TOKENS = 65536
MAX_OUTSIDE = 0.1  # share of emitted tokens outside the kept ones that sends a draft back whole
CORPUS_BYTES = 3 << 20
_FORMAT = 2  # bump when what is written changes


class DraftCutFailed(HomerackError):
    kind = "draft_cut_failed"


def worth_cutting(n_vocab: int) -> bool:
    """Only when at least half the output rows go."""
    return n_vocab >= 2 * KEEP_TOKENS


# -- which tokens to keep ---------------------------------------------------------

def corpus_files(budget: int = CORPUS_BYTES) -> list[Path]:
    """Text found on every machine that runs Homerack: Python's standard library (code,
    with docstrings and comments in English), led by its prose documentation, spread over
    the whole library up to `budget` bytes."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = [f for f in sorted(root.rglob("*.py"))
             if not {"test", "tests", "site-packages", "dist-packages"} & set(f.parts)]
    docs = [f for f in files if f.parent.name == "pydoc_data"]
    sizes = {f: f.stat().st_size for f in files}
    stride = max(1, round(sum(sizes.values()) / budget))
    chosen, total = [], 0
    for f in docs + files[::stride]:
        if total >= budget:
            break
        chosen.append(f)
        total += sizes[f]
    return chosen


def rank_tokens(vocab: Vocabulary, texts: list[str]) -> np.ndarray:
    """Token ids, most useful first: end-of-generation and single-character ASCII
    tokens, tokens met more than once in `texts` (by count), then ASCII tokens by id
    (SentencePiece-style vocabularies list pieces roughly by frequency), then the rest
    by id."""
    counts = np.zeros(vocab.n_vocab, dtype=np.int64)
    # llama.cpp's tokenizer is most of a cut's time and lets go of the GIL: every core
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        for tokens in pool.map(vocab.tokenize, texts):
            np.add.at(counts, tokens, 1)
    ids = np.arange(vocab.n_vocab)
    pieces = [vocab.piece(int(i)) for i in ids]
    ascii_ = np.array([bool(p) and all(32 <= b < 127 or b in b"\t\n\r" for b in p)
                       for p in pieces])
    first = np.array([vocab.is_end_of_generation(int(i)) or (ascii_[i] and len(pieces[i]) == 1)
                      for i in ids])
    seen = np.where(counts > 1, counts, 0)
    return np.lexsort((ids, ~ascii_, -seen, ~first))


# -- the cut model ----------------------------------------------------------------

@dataclass(frozen=True)
class CutDraft:
    """A cut draft on disk: its GGUF, the token id of each of its output rows, and where
    the full token table lies in the original file."""
    model: Path
    keep: np.ndarray
    source: Path
    table_offset: int
    table_type: int
    n_embd: int
    n_vocab: int


def cut_folder(source: Path, folder: Path) -> Path:
    return folder / f"{source.stem}-{model_fingerprint(source)[:16]}-v{_FORMAT}"


def cached(source: Path, folder: Path) -> CutDraft | None:
    return _read(cut_folder(source, folder), source)


def _read(where: Path, source: Path) -> CutDraft | None:
    try:
        info = json.loads((where / "head.json").read_text())
        keep = np.load(where / "keep.npy")
    except (OSError, ValueError):
        return None
    return CutDraft(where / "draft.gguf", keep, source, info["table_offset"],
                    info["table_type"], info["n_embd"], info["n_vocab"])


def prepare(source: Path, folder: Path, keep_tokens: int = KEEP_TOKENS) -> CutDraft:
    """The cut version of draft model `source`, built unless cached (tens of seconds)."""
    where = cut_folder(source, folder)  # fingerprints the source: once
    found = _read(where, source)
    if found:
        return found
    vocab = Vocabulary(source)
    try:
        texts = [f.read_text(errors="ignore") for f in corpus_files()]
        keep = np.sort(rank_tokens(vocab, texts)[:keep_tokens]).astype(np.int32)
    finally:
        vocab.close()
    where.mkdir(parents=True, exist_ok=True)
    info = _write_cut(source, where / "draft.gguf", keep)
    np.save(where / "keep.npy", keep)
    (where / "head.json").write_text(json.dumps(info))  # last: marks the cut complete
    return _read(where, source)


def _write_cut(source: Path, target: Path, keep: np.ndarray) -> dict:
    """Copy `source` without its tokenizer, keeping only the `keep` rows of its token
    table and output matrix. Returns where the full table lies in `source`."""
    import gguf

    reader = open_gguf(source)
    arch = reader.fields["general.architecture"].contents()
    partial = target.with_suffix(f".{os.getpid()}.{threading.get_ident()}.partial")
    writer = gguf.GGUFWriter(partial, arch)
    for name, field in reader.fields.items():
        if name.startswith(("tokenizer.", "GGUF.")) or name == "general.architecture":
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), kind, sub_type=sub)
    writer.add_string("tokenizer.ggml.model", "none")
    writer.add_uint32(f"{arch}.vocab_size", len(keep))
    table = None
    for tensor in reader.tensors:
        data = tensor.data
        if tensor.name in ("token_embd.weight", "output.weight"):
            data = np.ascontiguousarray(data[keep])
        if tensor.name == "token_embd.weight":
            table = tensor
        plain = tensor.tensor_type in (gguf.GGMLQuantizationType.F32,
                                       gguf.GGMLQuantizationType.F16)
        writer.add_tensor(tensor.name, data, raw_shape=data.shape if plain else None,
                          raw_dtype=tensor.tensor_type)
    if table is None:
        raise DraftCutFailed(f"{source.name} has no token table to cut")
    write_whole(writer)
    partial.replace(target)
    return {"table_offset": int(table.data_offset), "table_type": int(table.tensor_type),
            "n_embd": int(table.shape[0]), "n_vocab": int(table.shape[1])}


class InputTable:
    """Rows of the original file's full token table, as the vectors the cut model reads."""

    def __init__(self, cut: CutDraft):
        import gguf
        from gguf.quants import dequantize

        self._dequantize = dequantize  # imported here, not on every draft step
        self.kind = gguf.GGMLQuantizationType(cut.table_type)
        block, block_bytes = gguf.GGML_QUANT_SIZES[self.kind]
        row_bytes = cut.n_embd // block * block_bytes
        self.rows = np.memmap(cut.source, dtype=np.uint8, mode="r", offset=cut.table_offset,
                              shape=(cut.n_vocab, row_bytes))
        self.scale = 1.0

    def __call__(self, tokens: list[int]) -> np.ndarray:
        return self._dequantize(self.rows[tokens], self.kind) * self.scale


def load(cut: CutDraft, llama: LlamaModel) -> None:
    """Feed `llama` (the cut model) its inputs from the full table, with the scale its
    graph gives token inputs; raises DraftCutFailed when neither candidate matches."""
    table = InputTable(cut)
    probe = len(cut.keep) // 2  # any kept row: by id it is cut.keep[probe] in the full table
    llama.decode([probe], 0)
    expected = llama.logits().copy()
    llama.embed = table
    try:
        for scale in (1.0, math.sqrt(cut.n_embd)):
            table.scale = scale
            llama.forget(0, 0)
            llama.decode([int(cut.keep[probe])], 0)
            if np.allclose(llama.logits(), expected, atol=1e-2, rtol=1e-3):
                return
        raise DraftCutFailed("the cut draft reads its input vectors differently from tokens")
    except DraftCutFailed:
        llama.embed = None
        raise
    finally:
        llama.forget(0, 0)


class DraftCuts:
    """Cut drafts, each built once on a background thread (the engine thread keeps
    serving with the full draft meanwhile). With no folder nothing is cut."""

    def __init__(self, folder: Path | None):
        self.folder = folder
        self._jobs: dict[Path, Future] = {}

    def ready(self, source: Path, n_vocab: int) -> CutDraft | None:
        """The cut of draft `source` if it is built; the first call starts building it."""
        if self.folder is None or not worth_cutting(n_vocab):
            return None
        job = self._jobs.get(source)
        if job is None:
            job = self._jobs[source] = Future()
            found = cached(source, self.folder)
            if found:
                job.set_result(found)
            else:
                threading.Thread(target=self._build, args=(source, job), name="draft-cut",
                                 daemon=True).start()
        return job.result() if job.done() and job.exception() is None else None

    def building(self, source: Path) -> bool:
        job = self._jobs.get(source)
        return job is not None and not job.done()

    def wait(self, timeout: float) -> None:
        """Let cuts being built finish (a one-shot engine would otherwise never keep one)."""
        wait(list(self._jobs.values()), timeout)

    def failure(self, source: Path) -> str | None:
        job = self._jobs.get(source)
        if job is not None and job.done() and job.exception() is not None:
            return f"the draft's output layer could not be cut: {job.exception()}"
        return None

    def _build(self, source: Path, job: Future) -> None:
        try:
            job.set_result(prepare(source, self.folder))
        except Exception as exc:  # reported through failure(); the full draft serves on
            job.set_exception(exc)
