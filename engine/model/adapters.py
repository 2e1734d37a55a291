"""The loaded model's LoRA adapters: each loaded once, on the first request that uses
it, and kept while the model is, up to MAX_HELD (the least recently used that no running
request needs is freed first: requests may name any adapter of the folder, one after
another); the set the context applies switched only when the next evaluation needs
another (the scheduler gives each set decode steps of its own)."""

from __future__ import annotations

from pathlib import Path

from ..catalog.models import MAX_ADAPTERS, AdapterUse
from ..llama.lora import free_adapter, load_adapter, set_adapters
from ..llama.runtime import LlamaModel
from ..catalog.fingerprint import Fingerprints

AdapterSet = tuple[tuple[str, float], ...]  # GenerationRequest.adapter_set
MAX_HELD = MAX_ADAPTERS  # adapters loaded at once: a request's most


class AdapterBank:
    def __init__(self, llama: LlamaModel):
        self.llama = llama
        self._handles: dict[str, object] = {}  # adapter path -> llama.cpp's adapter
        self._fingerprints: dict[str, str] = {}  # adapter path -> the file it was loaded from
        self._files = Fingerprints()  # read again only when a file's size or mtime changes
        self.current: AdapterSet | None = ()  # what the context applies (None: unknown)
        self.switches = 0

    def ready(self, uses: tuple[AdapterUse, ...], busy: set[str] = frozenset()) -> set[str]:
        """Load the adapters the context does not have yet, freeing the least recently
        used beyond MAX_HELD that neither these `uses` nor the `busy` ones (running
        requests') need; returns the paths of those whose file was replaced since they
        were loaded (states computed under them are stale)."""
        replaced = set()
        for use in uses:
            path = str(use.adapter.path)
            fingerprint = self._files.of(use.adapter.path)
            if self._fingerprints.get(path) != fingerprint:  # new, or replaced
                if path in self._fingerprints:
                    replaced.add(path)
                self._handles[path] = load_adapter(self.llama, use.adapter.path)
                self._fingerprints[path] = fingerprint
                self.current = None  # unknown: the context may hold the replaced one
            self._handles[path] = self._handles.pop(path)  # the most recently used last
        needed = {str(u.adapter.path) for u in uses} | set(busy)
        spare = [path for path in self._handles if path not in needed]
        evicted = spare[:max(0, len(self._handles) - MAX_HELD)]
        if evicted:
            set_adapters(self.llama, [], [])  # the context lets go of them first
            self.current = ()
        for path in evicted:
            free_adapter(self._handles.pop(path))
            del self._fingerprints[path]
        return replaced

    def apply(self, wanted: AdapterSet) -> None:
        """The next evaluations run with these adapters (all ready)."""
        if wanted == self.current:
            return
        set_adapters(self.llama, [self._handles[path] for path, _ in wanted],
                     [scale for _, scale in wanted])
        self.current = wanted
        self.switches += 1

    def salt(self, adapters: AdapterSet) -> str:
        """The prompt cache's key part for states computed under these adapters: their
        files' contents and scales (empty for the model alone)."""
        return "".join(f"+{self._fingerprints[path][:16]}*{scale!r}" for path, scale in adapters)

    def loaded(self) -> list[str]:
        return sorted(Path(path).stem for path in self._handles)
