"""The user's document collections as the engine keeps them: opened on first use (their
worker resumes what a restart left), their passages embedded, counted and reranked by the
engine's own models (an embedding model checked to be one), closed with the engine. The
engine hands over what it can do with its models (`Models`); nothing here loads one."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Protocol

from ..catalog.models import EMBEDDING_MODEL, ModelStore
from ..errors import InvalidRequest, NotSupported
from .collections import Collections, Embedding


class Vectors(Protocol):
    """Embeddings and reranking (model/embeddings.py's Embedder)."""
    def embed(self, model, texts: list[str]): ...
    def rank(self, model, query: str, texts: list[str]): ...


class Models(Protocol):
    """What the library asks of the engine's models (the Engine answers it)."""
    embedder: Vectors

    def resolve(self, model_id: str): ...
    def tokenize(self, model, text: str) -> list[int]: ...


class Library:
    def __init__(self, folder: Path | None, models: Models, store: ModelStore):
        self.folder, self._models, self._store = folder, models, store
        self._collections: Collections | None = None
        self._lock = threading.Lock()

    @property
    def collections(self) -> Collections:
        if self.folder is None:
            raise NotSupported("this engine keeps no documents index")
        with self._lock:
            if self._collections is None:
                self._collections = Collections(self.folder, self._embedding)
        return self._collections

    def resume(self) -> None:
        """An index a stop left midway goes on (nothing to do without one)."""
        if self.folder is not None and self.folder.exists():
            self.collections  # noqa: B018 - opening it resumes its worker

    def names(self) -> list[str]:
        return [c["name"] for c in self.collections.status()]

    def _embedding(self, model_id: str | None) -> Embedding:
        """The embedding model a collection uses (None: the MiniLM starter), checked to
        be one."""
        models = self._models
        model = models.resolve(model_id or EMBEDDING_MODEL)
        if self._store.kind_of(model) != "embedding":
            raise InvalidRequest(f"{model.id} is not an embedding model: pick one whose kind "
                                 "is embedding in /v1/models", param="model")
        return Embedding(model.id, lambda texts, truncate=False:
                         models.embedder.embed(model, texts, truncate)[0],
                         lambda text: len(models.tokenize(model, text)),
                         lambda ranker, query, texts: models.embedder.rank(
                             models.resolve(ranker), query, texts))

    def close(self) -> None:
        with self._lock:
            if self._collections is not None:
                self._collections.close()
