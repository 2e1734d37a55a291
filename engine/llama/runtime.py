"""A loaded llama.cpp model on llama-cpp-python's low-level API.

Not thread-safe: one engine worker thread owns each instance (a llama.cpp context must
not be used from two threads). Everything here is a thin, verb-named wrapper over one
or two C calls; the generation loop that uses them lives in generation.py.
"""

from __future__ import annotations

import ctypes
import hashlib
import itertools
import os
import re
import secrets
import signal
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import llama_cpp as llama
import numpy as np

from ..errors import HomerackError, InvalidRequest, ModelLoadFailed, OutOfMemory
from ..machine.native import init as native_init, library_file
from ..machine.planner import MAX_OUTPUTS
from ..model.prompt_cache import common_prefix
from ..machine.rpc import device_of_buffer

_init_lock = threading.Lock()
_initialized = False


def build_id() -> str:
    """Identifies the llama.cpp build, whose state files only it may load."""
    try:
        size = library_file("llama").stat().st_size
    except FileNotFoundError:
        size = 0
    return f"llama-cpp-python {llama.__version__} libllama {size}"


def model_fingerprint(path: Path) -> str:
    """Cheap identity of a model file: its size and first and last 4 MiB."""
    digest = hashlib.sha256()
    size = path.stat().st_size
    with path.open("rb") as handle:
        digest.update(handle.read(4 << 20))
        handle.seek(max(0, size - (4 << 20)))
        digest.update(handle.read(4 << 20))
    digest.update(str(size).encode())
    return digest.hexdigest()


_BUFFER_LINE = re.compile(r"(\S+)\s+(model|KV|compute|output) buffer size =\s+([\d.]+) MiB")
_NO_MEMORY_LINE = re.compile(r"(?:failed|unable) to allocate (\S+) buffer")
_buffers: list[tuple[str, str, int]] | None = None  # collected while a model loads
# Loads take turns: the log lines they are measured by come through one callback (two
# lanes of the engine, or the embedding model, may load at the same time).
_load_lock = threading.Lock()
_no_memory: list[str] = []  # devices where an allocation failed during that load


def _device(name: str) -> str:
    """The ggml device name of a buffer type ("CPU_Mapped" -> "CPU"; an RPC buffer type
    "RPC0[host:port]" -> the name that worker's device has here)."""
    if name.startswith("RPC") and "[" in name:
        return device_of_buffer(name)
    return name.split("[")[0].removesuffix("_Mapped").removesuffix("_REPACK")


@llama.llama_log_callback
def _log(level: int, text: bytes, _user_data) -> None:
    """llama.cpp's log: buffer sizes are recorded (they are the measured memory use);
    everything is printed only when HOMERACK_LLAMA_VERBOSE is set."""
    line = text.decode("utf-8", "replace")
    if _buffers is not None:
        match = _BUFFER_LINE.search(line)
        if match:
            device, kind, mib = match.groups()
            _buffers.append((_device(device), kind, int(float(mib) * (1 << 20))))
        elif match := _NO_MEMORY_LINE.search(line):
            _no_memory.append(_device(match.group(1)))
    if os.environ.get("HOMERACK_LLAMA_VERBOSE"):
        sys.stderr.write(line)


def _ensure_backend() -> None:
    global _initialized
    with _init_lock:
        if not _initialized:
            llama.llama_log_set(_log, ctypes.c_void_p(0))  # replaces llama-cpp-python's
            native_init()
            _initialized = True


# Fault injection for the crash-journal tests (README, "Surviving a crash"): an engine
# process started with HOMERACK_FAULT=repacked-eval dies as llama.cpp's AMX kernels do
# (SIGSEGV on the first evaluation with repacked weights).
_FAULT = os.environ.get("HOMERACK_FAULT", "")


class DecodeFailed(HomerackError):
    kind = "decode_failed"


class NoKVSlot(DecodeFailed):
    """llama.cpp found no cells for the batch (its memory left as it was before it)."""


@dataclass(frozen=True)
class LoadSettings:
    n_ctx: int = 4096
    n_batch: int = 512
    n_threads: int = 2
    n_gpu_layers: int = 0
    n_seq_max: int = 1  # sequences sharing the context's one pool of KV cells
    kv_type: str = "f16"  # or "q8_0" (needs flash attention)
    devices: tuple[str, ...] = ()  # the GPUs to use, by ggml device name
    tensor_split: tuple[float, ...] = ()  # their shares of the GPU layers
    # llama.cpp's extra buffer types: CPU weights repacked for its fastest kernels (AMX
    # tiles on CPUs that have them). Off after such an evaluation killed an engine.
    repack: bool = True
    embeddings: bool = False  # pooled embeddings out instead of logits (embedding models)


@dataclass(frozen=True)
class Chunk:
    """Consecutive tokens of one sequence in a batch, from position `start`."""
    seq_id: int
    start: int
    tokens: tuple[int, ...]
    logits: bool  # keep the last token's logits (it will be sampled)


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.8
    top_p: float = 0.95
    top_k: int = 40
    min_p: float = 0.05
    seed: int | None = None
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0


# Greedy decoding breaks near ties by token id. llama.cpp's logits for the same tokens
# differ in the last bits with what else shares a batch and where the KV cells lie (the
# order flash attention sums them in); answers here meet two logits within 0.001 of each
# other about once in 40 tokens, and plain argmax would then follow the rounding.
GREEDY_TIE = 0.01


def greedy_pick(logits: np.ndarray) -> int:
    """The best token; among tokens within GREEDY_TIE of it, the lowest id."""
    best = logits.max()
    return int(np.flatnonzero(logits >= best - GREEDY_TIE)[0])


_TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])  # llama_token_data


class Sampler:
    """A llama.cpp sampler chain built from SamplingParams; greedy at temperature 0.

    Plain greedy decoding skips the chain: an argmax over the logits in place costs a
    fraction of building llama.cpp's candidate array (262k entries for Gemma).

    With a grammar (GBNF) the output must match it. Checking every token of the
    vocabulary against the grammar at every step costs more than the model here (0.18x
    speed on Gemma's 262k tokens), so, as llama.cpp's common sampler does, the chain picks
    first and the grammar checks that one token; only when it is refused is the grammar
    applied to all candidates and the pick made again among those it allows."""

    def __init__(self, params: SamplingParams, n_vocab: int, grammar: str | None = None,
                 vocab=None):
        self.greedy = params.temperature <= 0
        self._penalized = bool(params.frequency_penalty or params.presence_penalty)
        self._argmax = self.greedy and not self._penalized and grammar is None
        self._chain = _chain(params, n_vocab)
        self._grammar = None
        if grammar is not None:
            self._grammar = llama.llama_sampler_init_grammar(vocab, grammar.encode(), b"root")
            if not self._grammar:
                self.close()
                # the grammar came from the request's schema: its fault, not the engine's
                raise InvalidRequest(f"llama.cpp rejected the grammar made from the "
                                     f"request's schema:\n{grammar[:400]}")
            self._candidates = np.zeros(n_vocab, dtype=_TOKEN_DATA)
            self._ids = np.arange(n_vocab, dtype=np.int32)
            self._one = np.zeros(1, dtype=_TOKEN_DATA)

    def sample(self, model: "LlamaModel", index: int = -1) -> int:
        """Sample from the logits at batch output `index` (and accept the token)."""
        if self._argmax:
            return greedy_pick(model.logits(index))
        if self._grammar is None:
            return llama.llama_sampler_sample(self._chain, model.ctx, index)
        logits = model.logits(index)
        # the chain's own pick, in C; with penalties (whose history the chain keeps) the
        # pick goes through _pick so that only the kept token is accepted
        token = self._pick(logits, constrained=False) if self._penalized else \
            llama.llama_sampler_sample(self._chain, model.ctx, index)
        self._one["id"], self._one["logit"] = token, 0.0
        if _apply(self._grammar, self._one).logit == -np.inf:  # refused: pick again
            token = self._pick(logits, constrained=True)
        llama.llama_sampler_accept(self._grammar, token)
        if self._penalized:
            llama.llama_sampler_accept(self._chain, token)
        return token

    def _pick(self, logits: np.ndarray, constrained: bool) -> int:
        candidates = self._candidates  # samplers reorder it in place: filled anew each time
        candidates["id"] = self._ids
        candidates["logit"] = logits
        candidates["p"] = 0.0
        if constrained:
            _apply(self._grammar, candidates)
        return _apply(self._chain, candidates).id

    def close(self) -> None:
        for sampler in (self._chain, self._grammar):
            if sampler:
                llama.llama_sampler_free(sampler)
        self._chain = self._grammar = None


def _chain(params: SamplingParams, n_vocab: int):
    chain = llama.llama_sampler_chain_init(llama.llama_sampler_chain_default_params())
    if params.frequency_penalty or params.presence_penalty:
        llama.llama_sampler_chain_add(chain, llama.llama_sampler_init_penalties(
            n_vocab, 64, 1.0, params.frequency_penalty, params.presence_penalty))
    if params.temperature <= 0:
        llama.llama_sampler_chain_add(chain, llama.llama_sampler_init_greedy())
        return chain
    seed = params.seed if params.seed is not None else secrets.randbits(32)
    for stage in (
        llama.llama_sampler_init_top_k(params.top_k),
        llama.llama_sampler_init_top_p(params.top_p, 1),
        llama.llama_sampler_init_min_p(params.min_p, 1),
        llama.llama_sampler_init_temp(params.temperature),
        llama.llama_sampler_init_dist(seed & 0xFFFFFFFF),
    ):
        llama.llama_sampler_chain_add(chain, stage)
    return chain


def _apply(sampler, candidates: np.ndarray):
    """llama_sampler_apply on candidates held in a numpy array; returns the selected
    candidate (the first when none is selected). Samplers reorder and shrink the array,
    and top-p may point it at a buffer of its own: read the result through the view."""
    view = llama.llama_token_data_array(
        ctypes.cast(candidates.ctypes.data, ctypes.POINTER(llama.llama_token_data)),
        len(candidates), -1, False)
    llama.llama_sampler_apply(sampler, ctypes.byref(view))
    return view.data[max(view.selected, 0)]


def _tokenize(vocab, text: str, add_special: bool, parse_special: bool) -> list[int]:
    data = text.encode("utf-8")
    capacity = len(data) + 8
    buf = (llama.llama_token * capacity)()
    n = llama.llama_tokenize(vocab, data, len(data), buf, capacity, add_special, parse_special)
    if n < 0:
        capacity = -n
        buf = (llama.llama_token * capacity)()
        n = llama.llama_tokenize(vocab, data, len(data), buf, capacity, add_special,
                                 parse_special)
    return list(buf[:n])


def _piece(vocab, token: int) -> bytes:
    buf = ctypes.create_string_buffer(64)
    n = llama.llama_token_to_piece(vocab, token, buf, len(buf), 0, False)
    if n < 0:
        buf = ctypes.create_string_buffer(-n)
        n = llama.llama_token_to_piece(vocab, token, buf, len(buf), 0, False)
    return buf.raw[:n]


class _Tokens:
    """Tokenizer calls on `self.vocab` (a llama_vocab), shared by a model file's
    vocabulary alone and a loaded model."""
    vocab = None

    def tokenize(self, text: str, *, add_special: bool = False,
                 parse_special: bool = False) -> list[int]:
        return _tokenize(self.vocab, text, add_special, parse_special)

    def is_end_of_generation(self, token: int) -> bool:
        return llama.llama_vocab_is_eog(self.vocab, token)

    @property
    def add_bos(self) -> bool:
        return llama.llama_vocab_get_add_bos(self.vocab)

    @property
    def bos(self) -> int:
        return llama.llama_vocab_bos(self.vocab)


class Vocabulary(_Tokens):
    """A model file's tokenizer alone (no weights, no context): safe to use on a
    thread of its own."""

    def __init__(self, path: Path):
        _ensure_backend()
        mparams = llama.llama_model_default_params()
        mparams.vocab_only = True
        self.model = llama.llama_model_load_from_file(str(path).encode(), mparams)
        if not self.model:
            raise ModelLoadFailed(f"llama.cpp could not read the vocabulary of {path.name}")
        self.vocab = llama.llama_model_get_vocab(self.model)
        self.n_vocab = llama.llama_vocab_n_tokens(self.vocab)

    def piece(self, token: int) -> bytes:
        return _piece(self.vocab, token)

    def close(self) -> None:
        llama.llama_model_free(self.model)


class LlamaModel(_Tokens):
    """A model and its context. Inputs are token ids; with `embed` set they are fed as
    the vectors it returns instead (a draft whose own token table was cut down reads
    its inputs from the full one)."""

    embed: Callable[[list[int]], np.ndarray] | None = None

    def __init__(self, path: Path, settings: LoadSettings):
        _ensure_backend()
        self.path = path
        self.settings = settings
        with _load_lock:
            self._load_measured(path, settings)

    def _load_measured(self, path: Path, settings: LoadSettings) -> None:
        global _buffers
        _buffers = []
        _no_memory.clear()
        try:
            try:
                self._load(path, settings)
            except ModelLoadFailed as exc:
                if _no_memory:
                    raise OutOfMemory(f"{exc.message}: out of memory on {_no_memory[0]}",
                                      device=_no_memory[0]) from None
                raise
            #: bytes llama.cpp allocated, by (device, kind): weights are "model"
            self.buffers: dict[tuple[str, str], int] = {}
            for device, kind, size in _buffers:
                self.buffers[(device, kind)] = self.buffers.get((device, kind), 0) + size
        finally:
            _buffers = None

    def _load(self, path: Path, settings: LoadSettings) -> None:
        mparams = llama.llama_model_default_params()
        mparams.n_gpu_layers = settings.n_gpu_layers
        mparams.use_extra_bufts = settings.repack
        if settings.devices and settings.n_gpu_layers:
            from ..machine.probe import device_array

            self._devices = device_array(settings.devices)
            mparams.devices = ctypes.cast(self._devices, ctypes.c_void_p)
        if settings.tensor_split:
            self._split = (ctypes.c_float * llama.LLAMA_MAX_DEVICES)(*settings.tensor_split)
            mparams.tensor_split = self._split
        self.model = llama.llama_model_load_from_file(str(path).encode(), mparams)
        if not self.model:
            raise ModelLoadFailed(f"llama.cpp could not load {path.name}")
        self.vocab = llama.llama_model_get_vocab(self.model)
        self.ctx = llama.llama_init_from_model(self.model, self._context_params(settings))
        if not self.ctx:
            llama.llama_model_free(self.model)
            raise ModelLoadFailed(
                f"llama.cpp could not create a {settings.n_ctx}-token context for {path.name} "
                "(not enough memory?)")
        self.memory = llama.llama_get_memory(self.ctx)
        self.n_ctx = llama.llama_n_ctx(self.ctx)
        self.n_vocab = llama.llama_vocab_n_tokens(self.vocab)
        self.n_swa = llama.llama_model_n_swa(self.model)
        self.n_embd = llama.llama_model_n_embd(self.model)
        self._batch = llama.llama_batch_init(settings.n_batch, 0, settings.n_seq_max)
        self._embd_batch = None  # made on first use
        self._pieces: dict[int, bytes] = {}

    @staticmethod
    def _context_params(settings: LoadSettings):
        cparams = llama.llama_context_default_params()
        cparams.n_ctx = settings.n_ctx
        cparams.n_batch = settings.n_batch
        cparams.n_ubatch = settings.n_batch
        cparams.n_seq_max = settings.n_seq_max
        cparams.n_threads = settings.n_threads
        cparams.n_threads_batch = settings.n_threads
        # A full-size sliding-window cache can be cut back to any prefix, which the
        # prompt cache relies on (a pruned one cannot).
        cparams.swa_full = True
        # One pool of cells for all sequences: any one may use the whole context (a split
        # cache would give each n_ctx / n_seq_max), and copied prefixes share cells.
        cparams.kv_unified = True
        # llama.cpp reserves compute memory for logits at every position of a ubatch
        # (n_vocab x n_ubatch floats: 512 MiB for Gemma 3); the planner counts these.
        cparams.n_outputs_max = MAX_OUTPUTS
        # Flash attention stays on llama.cpp's "auto" (on wherever the backend has it):
        # it skips the cells of other sequences instead of adding their zeros, so a
        # sequence's attention sums the same terms in the same order whatever shares
        # the pool, and batched greedy output equals solo output.
        if settings.embeddings:
            cparams.embeddings = True
            cparams.pooling_type = llama.LLAMA_POOLING_TYPE_UNSPECIFIED  # the model's own
            cparams.n_outputs_max = cparams.n_ubatch  # pooling reads every position
        if settings.kv_type == "q8_0":
            cparams.type_k = cparams.type_v = llama.GGML_TYPE_Q8_0
            cparams.flash_attn_type = 1  # a quantized V cache requires it
        return cparams

    # -- vocabulary -------------------------------------------------------------

    def piece(self, token: int) -> bytes:
        """The bytes a token stands for (special tokens render as nothing)."""
        cached = self._pieces.get(token)
        if cached is None:
            cached = self._pieces[token] = _piece(self.vocab, token)
        return cached

    # -- evaluation -------------------------------------------------------------

    def decode(self, tokens: list[int], start: int, seq_id: int = 0,
               all_logits: bool = False) -> None:
        """Evaluate at most n_batch tokens at positions start.. for one sequence.
        Logits are kept for the last token only (all sampling needs), or for every
        token when verifying a draft."""
        self._decode_batch(self._fill_batch([Chunk(seq_id, start, tuple(tokens), True)],
                                            all_logits))

    def decode_chunks(self, chunks: "list[Chunk]") -> list[int]:
        """Evaluate parts of several sequences in one batch (at most n_batch tokens in
        all). Returns the batch index of each chunk's last token, where its logits are
        when the chunk asked for them."""
        self._decode_batch(self._fill_batch(chunks))
        ends = list(itertools.accumulate(len(chunk.tokens) for chunk in chunks))
        return [end - 1 for end in ends]

    def sync(self, held: list[int], wanted: list[int], seq_id: int = 0,
             stop: Callable[[], bool] = lambda: False) -> int:
        """Make a sequence's KV memory hold `wanted` when it holds `held`: keep the
        common prefix (all but the last token, whose logits sampling needs) and evaluate
        the rest in n_batch chunks, checking `stop` between chunks. `held` is updated in
        place to what the memory then holds; returns how many tokens were kept."""
        keep = min(common_prefix(held, wanted), len(wanted) - 1)
        if keep < len(held) and not self.forget(seq_id, keep):
            self.forget(seq_id, 0)
            keep = 0
        del held[keep:]
        step = self.settings.n_batch
        for offset in range(keep, len(wanted), step):
            if stop():
                break
            chunk = wanted[offset:offset + step]
            self.decode(chunk, offset, seq_id)
            held.extend(chunk)
        return keep

    def _fill_batch(self, chunks: "list[Chunk]", all_logits: bool = False):
        n_tokens = sum(len(chunk.tokens) for chunk in chunks)
        if n_tokens > self.settings.n_batch:
            raise ValueError(f"{n_tokens} tokens exceed n_batch; use sync()")
        if self.embed is None:
            batch = self._batch
        else:
            batch = self._vectors([token for chunk in chunks for token in chunk.tokens])
        n = 0
        for chunk in chunks:
            for i, token in enumerate(chunk.tokens):
                if self.embed is None:
                    batch.token[n] = token
                batch.pos[n] = chunk.start + i
                batch.n_seq_id[n] = 1
                batch.seq_id[n][0] = chunk.seq_id
                batch.logits[n] = all_logits
                n += 1
            if chunk.logits:
                batch.logits[n - 1] = 1
        batch.n_tokens = n
        return batch

    def _vectors(self, tokens: list[int]):
        """The embedding batch, holding the vectors of `tokens`."""
        if self._embd_batch is None:
            self._embd_batch = llama.llama_batch_init(self.settings.n_batch, self.n_embd,
                                                      self.settings.n_seq_max)
        rows = np.ctypeslib.as_array(self._embd_batch.embd,
                                     shape=(self.settings.n_batch, self.n_embd))
        rows[:len(tokens)] = self.embed(tokens)
        return self._embd_batch

    def embed_texts(self, token_lists: list[list[int]]) -> np.ndarray:
        """The pooled, L2-normalised embedding of each token list (an embeddings
        context), as many lists in one evaluation as fit the batch."""
        out = np.empty((len(token_lists), self.n_embd), dtype=np.float32)
        i = 0
        while i < len(token_lists):
            chunks, used = [], 0
            while i + len(chunks) < len(token_lists) and len(chunks) < self.settings.n_seq_max:
                tokens = token_lists[i + len(chunks)]
                if chunks and used + len(tokens) > self.settings.n_batch:
                    break
                chunks.append(Chunk(len(chunks), 0, tuple(tokens), True))
                used += len(tokens)
            self._decode_batch(self._fill_batch(chunks, all_logits=True))
            for seq, _chunk in enumerate(chunks):
                pointer = llama.llama_get_embeddings_seq(self.ctx, seq)
                vector = np.ctypeslib.as_array(pointer, shape=(self.n_embd,))
                out[i + seq] = vector / max(float(np.linalg.norm(vector)), 1e-12)
            if self.memory:
                llama.llama_memory_clear(self.memory, True)
            i += len(chunks)
        return out

    def logits(self, index: int = -1) -> np.ndarray:
        """The logits at a batch output, as a view (no copy)."""
        return np.ctypeslib.as_array(llama.llama_get_logits_ith(self.ctx, index),
                                     shape=(self.n_vocab,))

    def _decode_batch(self, batch) -> None:
        if _FAULT == "repacked-eval" and self.settings.repack:
            os.kill(os.getpid(), signal.SIGSEGV)
        rc = llama.llama_decode(self.ctx, batch)
        if rc == 1:
            raise NoKVSlot("evaluation failed: no room left in the KV cache")
        if rc != 0:
            raise DecodeFailed(f"evaluation failed: llama_decode returned {rc}")

    def forget(self, seq_id: int, from_pos: int) -> bool:
        """Drop a sequence's KV entries from from_pos on. False when the memory cannot
        remove part of a sequence (then the caller drops it whole)."""
        return llama.llama_memory_seq_rm(self.memory, seq_id, from_pos, -1)

    def copy_prefix(self, src: int, dst: int, n: int) -> None:
        """Make sequence dst hold src's first n positions, sharing their cells."""
        llama.llama_memory_seq_rm(self.memory, dst, 0, -1)
        llama.llama_memory_seq_cp(self.memory, src, dst, 0, n)

    def clear(self) -> None:
        """Forget every sequence."""
        llama.llama_memory_clear(self.memory, True)

    # -- state -------------------------------------------------------------------

    def snapshot(self, seq_id: int) -> bytearray:
        """A copy of one sequence's KV state."""
        size = llama.llama_state_seq_get_size(self.ctx, seq_id)
        state = bytearray(size)
        written = llama.llama_state_seq_get_data(
            self.ctx, (ctypes.c_uint8 * size).from_buffer(state), size, seq_id)
        del state[written:]
        return state

    def restore(self, seq_id: int, state: bytearray) -> bool:
        """Replace a sequence's KV state with a snapshot; False if llama.cpp refused it."""
        self.forget(seq_id, 0)
        buffer = (ctypes.c_uint8 * len(state)).from_buffer(state)
        if llama.llama_state_seq_set_data(self.ctx, buffer, len(state), seq_id) == 0:
            self.forget(seq_id, 0)
            return False
        return True

    def close(self) -> None:
        if self.ctx:
            llama.llama_batch_free(self._batch)
            if self._embd_batch is not None:
                llama.llama_batch_free(self._embd_batch)
            llama.llama_free(self.ctx)
            llama.llama_model_free(self.model)
            self.ctx = self.model = None
