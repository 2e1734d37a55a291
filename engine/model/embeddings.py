"""Embedding models (BERT-style encoders, or models whose metadata asks for pooling),
served next to the loaded chat model without unloading it: each on a context of its
own, used under a lock from the API's threads (llama.cpp contexts of different models
may run on different threads). The chat model's plans leave room for it (ModelHost).
Rerankers (encoders whose pooling is rank) score a query and a passage read together;
an embedding model and a reranker stay loaded together, the least recently used going
first beyond that."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np

from ..errors import InvalidRequest, OutOfMemory
from ..llama.runtime import LlamaModel
from ..settings import LoadSettings
from ..catalog.models import LocalModel, ModelStore
from ..llama.probe import probe

SEQUENCES = 16       # inputs evaluated together
MAX_CONTEXT = 8192   # per input; encoders are trained on 512
HEADROOM = 1.25      # weights plus context and compute buffers, for the fit check
HELD = 2             # models loaded at once: an embedder and a reranker


class Embedder:
    def __init__(self, store: ModelStore, load: LoadSettings):
        self.store, self.load = store, load
        # the models held, most recently used last: an embedder and a reranker stay
        # loaded together (a search that reranks uses both)
        self._held: dict[Path, tuple[LocalModel, LlamaModel]] = {}
        self._lock = threading.Lock()

    @property
    def model(self) -> LocalModel | None:
        """The model used last (the status's "embedding_model")."""
        held = list(self._held.values())
        return held[-1][0] if held else None

    @property
    def bytes(self) -> int:
        """What the loaded embedding model holds (llama.cpp's buffers)."""
        return sum(sum(llama.buffers.values()) for _, llama in list(self._held.values()))

    def embed(self, model: LocalModel, inputs: list[str] | list[list[int]],
              truncate: bool = False) -> tuple[np.ndarray, int]:
        """L2-normalised vectors, in input order, and the tokens they took. `truncate`:
        an input longer than the model's context is cut to it (its last token, the
        separator a BERT reads, kept), else refused naming it."""
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
            if truncate:
                lists = [t if len(t) <= llama.n_ctx else [*t[:llama.n_ctx - 1], t[-1]]
                         for t in lists]
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

    def rank(self, model: LocalModel, query: str, passages: list[str]) -> np.ndarray:
        """A reranker's score of each passage for `query`, read together as llama.cpp's
        server joins them ([CLS] query [SEP] passage for BERT); a passage is cut to what
        the context leaves."""
        info = self.store.inspector.inspect(model.path)
        if not info.embedding:  # a chat model: not an encoder at all
            raise InvalidRequest(f"{model.id} is not a reranker", param="model")
        with self._lock:
            llama = self._ensure(model, info)
            if not llama.ranks:
                raise InvalidRequest(f"{model.id} is not a reranker (its pooling is not "
                                     "rank)", param="model")
            head = llama.tokenize(query, add_special=True, parse_special=False)
            if len(head) > llama.n_ctx // 2:
                raise InvalidRequest(f"the query has {len(head)} tokens; {model.id} ranks "
                                     f"with at most {llama.n_ctx // 2}", param="query")
            room = max(1, llama.n_ctx - len(head) - 1)
            lists = [llama.rank_pair(head, llama.tokenize(p, add_special=False,
                                                          parse_special=False)[:room])
                     for p in passages]
            return llama.rank_scores(lists)

    def _ensure(self, model: LocalModel, info) -> LlamaModel:
        if model.path in self._held:
            self._held[model.path] = self._held.pop(model.path)  # the most recent now
            return self._held[model.path][1]
        while len(self._held) >= HELD:
            _, (_, oldest) = next(iter(self._held.items()))
            del self._held[next(iter(self._held))]
            oldest.close()
        available = probe().ram_available_bytes
        if info.size_bytes * HEADROOM > available:
            raise OutOfMemory(f"{model.id} needs about {info.size_bytes * HEADROOM / 2**20:.0f} "
                              f"MiB and {available / 2**20:.0f} MiB of RAM are free", "CPU")
        n_ctx = min(info.context_length or 512, MAX_CONTEXT)
        settings = LoadSettings(n_ctx=n_ctx, n_batch=n_ctx, n_threads=self.load.n_threads,
                                n_seq_max=SEQUENCES, embeddings=True, repack=self.load.repack)
        llama = LlamaModel(model.path, settings)
        self._held[model.path] = (model, llama)
        return llama

    def close(self) -> None:
        for _, llama in self._held.values():
            llama.close()
        self._held.clear()
