"""Embedding models (BERT-style encoders, or models whose metadata asks for pooling),
served next to the loaded chat model without unloading it: each on a context of its
own, used under a lock from the API's threads (llama.cpp contexts of different models
may run on different threads). The chat model's plans leave room for it (ModelHost)."""

from __future__ import annotations

import threading

import numpy as np

from ..errors import InvalidRequest, OutOfMemory
from ..llama.runtime import LlamaModel
from ..settings import LoadSettings
from ..catalog.models import LocalModel, ModelStore
from ..llama.probe import probe

SEQUENCES = 16       # inputs evaluated together
MAX_CONTEXT = 8192   # per input; encoders are trained on 512
HEADROOM = 1.25      # weights plus context and compute buffers, for the fit check


class Embedder:
    def __init__(self, store: ModelStore, load: LoadSettings):
        self.store, self.load = store, load
        self.model: LocalModel | None = None
        self.llama: LlamaModel | None = None
        self._lock = threading.Lock()

    @property
    def bytes(self) -> int:
        """What the loaded embedding model holds (llama.cpp's buffers)."""
        llama = self.llama
        return sum(llama.buffers.values()) if llama else 0

    def embed(self, model: LocalModel, inputs: list[str] | list[list[int]]
              ) -> tuple[np.ndarray, int]:
        """L2-normalised vectors, in input order, and the tokens they took."""
        info = self.store.inspector.inspect(model.path)
        if not info.embedding:
            raise InvalidRequest(
                f"{model.id} is a chat model, not an embedding model: its hidden states are "
                "not trained as embeddings. Use an embedding GGUF (BERT, nomic-embed, bge, "
                "Qwen3-Embedding ...)", param="model")
        with self._lock:
            llama = self._ensure(model, info)
            lists = [t if isinstance(t, list) else
                     llama.tokenize(t, add_special=True, parse_special=False) for t in inputs]
            for i, tokens in enumerate(lists):
                if not tokens:
                    raise InvalidRequest(f"input[{i}] is empty", param=f"input[{i}]")
                if len(tokens) > llama.n_ctx:
                    raise InvalidRequest(f"input[{i}] has {len(tokens)} tokens; {model.id} "
                                         f"embeds at most {llama.n_ctx}", param=f"input[{i}]")
                if max(tokens) >= llama.n_vocab or min(tokens) < 0:
                    raise InvalidRequest(f"input[{i}] holds a token id outside the "
                                         "vocabulary", param=f"input[{i}]")
            return llama.embed_texts(lists), sum(len(t) for t in lists)

    def _ensure(self, model: LocalModel, info) -> LlamaModel:
        if self.model is not None and self.model.path == model.path:
            return self.llama
        self.close()
        available = probe().ram_available_bytes
        if info.size_bytes * HEADROOM > available:
            raise OutOfMemory(f"{model.id} needs about {info.size_bytes * HEADROOM / 2**20:.0f} "
                              f"MiB and {available / 2**20:.0f} MiB of RAM are free", "CPU")
        n_ctx = min(info.context_length or 512, MAX_CONTEXT)
        settings = LoadSettings(n_ctx=n_ctx, n_batch=n_ctx, n_threads=self.load.n_threads,
                                n_seq_max=SEQUENCES, embeddings=True, repack=self.load.repack)
        self.llama, self.model = LlamaModel(model.path, settings), model
        return self.llama

    def close(self) -> None:
        if self.llama:
            self.llama.close()
        self.llama = self.model = None
