"""A loaded llama.cpp model and its context on llama-cpp-python's low-level API.

Not thread-safe: one engine worker thread owns each instance (a llama.cpp context must
not be used from two threads). Everything here is a thin, verb-named wrapper over one
or two C calls; the loop that uses them is the batching scheduler (batching/).
"""

from __future__ import annotations

import ctypes
import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import llama_cpp as llama
import numpy as np

from ..errors import HomerackError, ModelLoadFailed, NonFiniteLogits, OutOfMemory
from ..events import MAX_OUTPUTS
from ..prefix import common_prefix
from ..settings import LoadSettings
from . import faults
from .backend import ensure_backend, measured_load
from .held import HeldTokens
from .vocab import Tokens, piece_of


class DecodeFailed(HomerackError):
    kind = "decode_failed"


class NoKVSlot(DecodeFailed):
    """llama.cpp found no cells for the batch (its memory left as it was before it)."""


@dataclass(frozen=True)
class Chunk:
    """Consecutive tokens of one sequence in a batch, from position `start`."""
    seq_id: int
    start: int
    tokens: tuple[int, ...]
    logits: bool  # keep the last token's logits (it will be sampled)
    image: object = None  # vision.ImagePiece: `tokens` are its span, decoded by the projector


class LlamaModel(Tokens):
    """A model and its context. Inputs are token ids; with `embed` set they are fed as
    the vectors it returns instead (a draft whose own token table was cut down reads
    its inputs from the full one)."""

    embed: Callable[[list[int]], np.ndarray] | None = None

    def __init__(self, path: Path, settings: LoadSettings,
                 on_progress: Callable[[float], None] | None = None):
        ensure_backend()
        self.path = path
        self.settings = settings
        with measured_load() as log:
            try:
                self._load(path, settings, on_progress)
            except ModelLoadFailed as exc:
                if log.no_memory:
                    raise OutOfMemory(f"{exc.message}: out of memory on {log.no_memory[0]}",
                                      device=log.no_memory[0]) from None
                raise
        #: bytes llama.cpp allocated, by (device, kind): weights are "model"
        self.buffers: dict[tuple[str, str], int] = log.totals()
        #: flash attention as llama.cpp resolved "auto" for this context (None: not said)
        self.flash_attn: bool | None = log.flash_attn

    def _load(self, path: Path, settings: LoadSettings,
              on_progress: Callable[[float], None] | None) -> None:
        mparams = llama.llama_model_default_params()
        mparams.n_gpu_layers = settings.n_gpu_layers
        mparams.use_extra_bufts = settings.repack
        if on_progress is not None:  # llama.cpp reports 0..1 as it reads the weights
            self._progress = llama.llama_progress_callback(
                lambda fraction, _data: on_progress(fraction) or True)
            mparams.progress_callback = self._progress
        if settings.devices and settings.n_gpu_layers:
            from .probe import device_array

            self._devices = device_array(settings.devices)
            mparams.devices = ctypes.cast(self._devices, ctypes.c_void_p)
        if settings.expert_device != "CPU" and settings.n_gpu_layers \
                and settings.expert_device not in settings.devices:
            # llama.cpp aborts the process on weights in a buffer no backend of its runs
            raise ModelLoadFailed(f"the experts' device {settings.expert_device} is not one "
                                  "of the model's devices")
        if settings.moves_experts:
            from .probe import experts_on

            self._overrides = experts_on(settings.expert_device, settings.cpu_moe_layers)
            mparams.tensor_buft_overrides = ctypes.cast(self._overrides, ctypes.c_void_p)
        if settings.tensor_split:
            self._split = (ctypes.c_float * llama.LLAMA_MAX_DEVICES)(*settings.tensor_split)
            mparams.tensor_split = self._split
        if settings.split_mode == "tensor":
            mparams.split_mode = llama.LLAMA_SPLIT_MODE_TENSOR
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
        self.n_ctx = llama.llama_n_ctx_seq(self.ctx)  # what one sequence may hold
        self.n_cells = llama.llama_n_ctx(self.ctx)  # what they all hold
        self.n_vocab = llama.llama_vocab_n_tokens(self.vocab)
        self.n_swa = llama.llama_model_n_swa(self.model)
        self.n_ctx_train = llama.llama_model_n_ctx_train(self.model)  # what it was made for
        self.n_embd = llama.llama_model_n_embd(self.model)
        self._batch = llama.llama_batch_init(settings.n_batch, 0, settings.n_seq_max)
        self._embd_batch = None  # made on first use
        self._pieces: dict[int, bytes] = {}
        #: the tokens each sequence's cells hold (what residency checks its ledger against)
        self.held = HeldTokens()

    @staticmethod
    def _context_params(settings: LoadSettings):
        cparams = llama.llama_context_default_params()
        cparams.n_ctx = settings.n_ctx * (settings.n_seq_max if settings.kv_split else 1)
        cparams.n_batch = settings.n_batch
        cparams.n_ubatch = settings.n_batch
        cparams.n_seq_max = settings.n_seq_max
        cparams.n_threads = settings.n_threads
        cparams.n_threads_batch = settings.n_threads
        # A full-size sliding-window cache can be cut back to any prefix, which the
        # prompt cache relies on (a pruned one cannot).
        cparams.swa_full = True
        # Unified: one pool of cells for all sequences, any one may use all of it, and
        # copied prefixes share cells; but a token's attention spans every sequence's
        # cells (16 streams of ~360 tokens: 0.77x of llama-server's split cache on this
        # CPU). Split: a stream of n_ctx cells for each sequence (the plan's choice).
        cparams.kv_unified = not settings.kv_split
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
        if settings.kv_type == "q8_0" or settings.split_mode == "tensor":
            cparams.flash_attn_type = 1  # a quantized V cache and tensor splits require it
        return cparams

    # -- vocabulary -------------------------------------------------------------

    def piece(self, token: int, special: bool = False) -> bytes:
        """The bytes a token stands for (control tokens render as nothing unless
        `special`: a chat format's markers that its reader must see)."""
        cached = self._pieces.get((token, special))
        if cached is None:
            cached = self._pieces[(token, special)] = piece_of(self.vocab, token, special)
        return cached

    # -- evaluation -------------------------------------------------------------

    def decode(self, tokens: list[int], start: int, seq_id: int = 0,
               all_logits: bool = False) -> None:
        """Evaluate at most n_batch tokens at positions start.. for one sequence.
        Logits are kept for the last token only (all sampling needs), or for every
        token when verifying a draft."""
        chunk = Chunk(seq_id, start, tuple(tokens), True)
        self._decode_batch(self._fill_batch([chunk], all_logits), [chunk])

    def decode_chunks(self, chunks: "list[Chunk]") -> list[int]:
        """Evaluate parts of several sequences in one batch (at most n_batch tokens in
        all). Returns the batch index of each chunk's last token, where its logits are
        when the chunk asked for them."""
        self._decode_batch(self._fill_batch(chunks), chunks)
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
        vectors = self._pooled(token_lists, self.n_embd)
        return vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)

    @property
    def ranks(self) -> bool:
        """A reranker: its pooling is "rank" (a classifier head scores a query and a
        passage read together)."""
        return llama.llama_pooling_type(self.ctx) == llama.LLAMA_POOLING_TYPE_RANK

    def rank_scores(self, token_lists: list[list[int]]) -> np.ndarray:
        """A reranker's score of each (query, passage) token list: its classifier's first
        output, as llama.cpp's server reads it (llama_get_embeddings_seq, no pooling)."""
        width = max(1, llama.llama_model_n_cls_out(self.model))
        return self._pooled(token_lists, width)[:, 0].copy()

    def rank_pair(self, query: list[int], passage: list[int]) -> list[int]:
        """A query (tokenized with its special tokens: [CLS] … [SEP] for BERT) and a
        passage as one input, as llama.cpp's server joins them for rerank."""
        end = [llama.llama_vocab_eos(self.vocab)] if llama.llama_vocab_get_add_eos(self.vocab) \
            else []
        return [*query, *passage, *end]

    def _pooled(self, token_lists: list[list[int]], width: int) -> np.ndarray:
        """Each token list's pooled output (`width` floats), many lists per evaluation."""
        out = np.empty((len(token_lists), width), dtype=np.float32)
        i = 0
        while i < len(token_lists):
            chunks, used = [], 0
            while i + len(chunks) < len(token_lists) and len(chunks) < self.settings.n_seq_max:
                tokens = token_lists[i + len(chunks)]
                if chunks and used + len(tokens) > self.settings.n_batch:
                    break
                chunks.append(Chunk(len(chunks), 0, tuple(tokens), True))
                used += len(tokens)
            self._decode_batch(self._fill_batch(chunks, all_logits=True), ())
            for seq, _chunk in enumerate(chunks):
                pointer = llama.llama_get_embeddings_seq(self.ctx, seq)
                out[i + seq] = np.ctypeslib.as_array(pointer, shape=(width,))
            if self.memory:
                self.clear()
            i += len(chunks)
        return out

    def logits(self, index: int = -1) -> np.ndarray:
        """The logits at a batch output, as a view (no copy); NonFiniteLogits when any is
        NaN or infinite. Every read of logits comes here, llama.cpp's own samplers
        included (Sampler reads them first): one sum, tens of microseconds, catches all
        (a NaN or an inf makes the sum one; finite logits are far from overflowing it)."""
        row = np.ctypeslib.as_array(llama.llama_get_logits_ith(self.ctx, index),
                                    shape=(self.n_vocab,))
        if not np.isfinite(row.sum()):
            raise NonFiniteLogits(self.path.name, self.device,
                                  "NaN" if np.isnan(row).any() else "infinite")
        return row

    @property
    def device(self) -> str:
        """Where the model's layers run, in words (error messages)."""
        settings = self.settings
        if not settings.n_gpu_layers:
            return "the CPU"
        return ", ".join(settings.devices) or "the GPU"

    @property
    def graphs_reused(self) -> int:
        """llama_decode calls that ran the previous call's compute graph again (same
        shape, same sequences in the same order), skipping its build: llama.cpp's count."""
        return llama.llama_perf_context(self.ctx).n_reused

    def _decode_batch(self, batch, chunks) -> None:
        """One llama_decode of a filled batch holding `chunks` (recorded as held: cells
        written before a failure are removed by llama.cpp)."""
        faults.before_evaluation(self.settings.repack)
        rc = llama.llama_decode(self.ctx, batch)
        if rc == 1:
            raise NoKVSlot("evaluation failed: no room left in the KV cache")
        if rc != 0:
            raise DecodeFailed(f"evaluation failed: llama_decode returned {rc}")
        for chunk in chunks:
            self.held.evaluated(chunk.seq_id, chunk.start, chunk.tokens)

    def forget(self, seq_id: int, from_pos: int) -> bool:
        """Drop a sequence's KV entries from from_pos on. False when the memory cannot
        remove part of a sequence (then the caller drops it whole)."""
        removed = llama.llama_memory_seq_rm(self.memory, seq_id, from_pos, -1)
        if removed:
            self.held.removed(seq_id, from_pos)
        return removed

    def copy_prefix(self, src: int, dst: int, n: int) -> None:
        """Make sequence dst hold src's first n positions: sharing their cells in one
        pool; in a split cache, a copy of src's whole stream cut back to n (llama.cpp
        copies streams only whole, at the next decode: `settle_copies`)."""
        self.forget(dst, 0)
        if self.settings.kv_split:
            llama.llama_memory_seq_cp(self.memory, src, dst, -1, -1)
            self.held.copied(src, dst, len(self.held.of(src)), queued=True)
            self.forget(dst, n)
        else:
            llama.llama_memory_seq_cp(self.memory, src, dst, 0, n)
            self.held.copied(src, dst, n, queued=False)

    def settle_copies(self) -> None:
        """Make the stream copies llama.cpp has queued now (it makes them at the start of
        the next llama_decode): a restore or a snapshot before then would be overwritten
        by one, copied along by another, or read a stream not yet written. One token
        without logits is evaluated in the last sequence (the one no request uses) and
        removed: what the copies cost anyway, and a token."""
        if not self.held.copies_queued:
            return
        spare = self.settings.n_seq_max - 1
        self.forget(spare, 0)
        token = max(llama.llama_vocab_bos(self.vocab), 0)
        chunk = Chunk(spare, 0, (token,), False)
        self._decode_batch(self._fill_batch([chunk]), [chunk])
        self.forget(spare, 0)

    def clear(self) -> None:
        """Forget every sequence."""
        llama.llama_memory_clear(self.memory, True)
        self.held.cleared()

    # -- state -------------------------------------------------------------------

    def snapshot(self, seq_id: int) -> bytearray:
        """A copy of one sequence's KV state."""
        self.settle_copies()
        size = llama.llama_state_seq_get_size(self.ctx, seq_id)
        state = bytearray(size)
        written = llama.llama_state_seq_get_data(
            self.ctx, (ctypes.c_uint8 * size).from_buffer(state), size, seq_id)
        del state[written:]
        return state

    def restore(self, seq_id: int, state: bytearray, tokens: list[int]) -> bool:
        """Replace a sequence's KV state with a snapshot of `tokens`; False if llama.cpp
        refused it."""
        self.settle_copies()
        self.forget(seq_id, 0)
        buffer = (ctypes.c_uint8 * len(state)).from_buffer(state)
        if llama.llama_state_seq_set_data(self.ctx, buffer, len(state), seq_id) == 0:
            self.forget(seq_id, 0)
            return False
        self.held.restored(seq_id, tokens)
        return True

    def close(self) -> None:
        if self.ctx:
            llama.llama_batch_free(self._batch)
            if self._embd_batch is not None:
                llama.llama_batch_free(self._embd_batch)
            llama.llama_free(self.ctx)
            llama.llama_model_free(self.model)
            self.ctx = self.model = None
