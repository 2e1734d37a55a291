"""A model on this machine as the catalog lists it: its id, its file, where it was found
(the models folder or another app's) and what that app keeps with it. Its own module so
that the folder's listing (models.py) and the other apps' (other_models.py) both use it
without importing each other."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .other_apps import LABELS


@dataclass(frozen=True)
class LocalModel:
    id: str
    path: Path
    size_bytes: int
    starter: bool
    source: str = "homerack"  # or where another app keeps it (other_apps.LABELS)
    label: str = ""           # its name there: "qwen3:30b-a3b"
    projector: Path | None = None  # a vision projector kept with it
    params: tuple = ()        # Ollama's parameters for it: (key, value) pairs
    system: str | None = None    # Ollama's system prompt for it
    template: str | None = None  # Ollama's chat template for it (shown; the GGUF's renders)
    problem: str | None = None   # why it cannot be used
    also_at: tuple[tuple[str, str], ...] = ()  # (source, name): the same file elsewhere too
    digest: str | None = None  # its sha256, where its place names it

    def param(self, key: str, default=None):
        return dict(self.params).get(key, default)

    def stops(self) -> tuple[str, ...]:
        """The stop strings its app gives it (Ollama's "stop" parameter)."""
        stop = self.param("stop", ())
        return (stop,) if isinstance(stop, str) else tuple(s for s in stop if isinstance(s, str))

    def as_dict(self) -> dict:
        return {"id": self.id, "path": str(self.path), "size_bytes": self.size_bytes,
                "starter": self.starter, "source": self.source,
                "source_label": LABELS[self.source], "name_there": self.label or None,
                "projector": str(self.projector) if self.projector else None,
                "also_at": [f"{LABELS[source]}: {name}" for source, name in self.also_at],
                **({"problem": self.problem} if self.problem else {})}
