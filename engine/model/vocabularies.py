"""Models' tokenizers without their weights, for counting a prompt's tokens before (or
without) loading the model: the few most recently used kept (a request may name any
model of the folder, one after another; a 262k vocabulary holds tens of MB)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from contextlib import contextmanager
from typing import Iterator

from ..catalog.models import LocalModel, ModelStore
from ..llama.vocab import Vocabulary

MAX_VOCABS = 4  # tokenizers kept


class Vocabularies:
    def __init__(self, store: ModelStore):
        self.store = store
        self._kept: OrderedDict = OrderedDict()  # model path -> Vocabulary
        self._lock = threading.Lock()

    @contextmanager
    def of(self, model: LocalModel) -> Iterator[Vocabulary]:
        """The model's tokenizer, held for the caller alone while the block runs."""
        with self._lock:
            vocab = self._kept.get(model.path)
            if vocab is None:
                self.store.inspector.inspect(model.path)  # a bad file fails before llama.cpp
                vocab = self._kept[model.path] = Vocabulary(model.path)
                while len(self._kept) > MAX_VOCABS:
                    self._kept.popitem(last=False)[1].close()
            self._kept.move_to_end(model.path)
            yield vocab

    def __len__(self) -> int:
        return len(self._kept)

    def close(self) -> None:
        with self._lock:
            while self._kept:
                self._kept.popitem()[1].close()
