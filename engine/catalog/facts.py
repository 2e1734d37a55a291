"""What a model file's header says, as `/v1/models` lists it: a chat model's sampling
defaults and capabilities (what its chat template can do), an adapter's rank and the
local models it fits. Nothing is read that was not read already: a file still being
inspected says None."""

from __future__ import annotations

import functools
from pathlib import Path

from ..errors import InvalidModelFile
from ..formats.families import capabilities
from .projectors import ProjectorFacts, read_projector
from .models import LocalModel, ModelStore
from .sampling_defaults import model_defaults


def describe(store: ModelStore, model: LocalModel, kind: str | None) -> dict:
    """The facts of `model` (of `kind`, as store.kind_of says) for its listing."""
    if kind == "adapter":
        return _adapter(store, model)
    if kind == "unreadable":  # said with its reason (a damaged or crafted header)
        return {"problem": model.problem or store.inspector.failure(model.path)}
    if not store.inspector.known(model.path):
        return {"sampling_defaults": None, "capabilities": None}
    facts = store.inspector.inspect(model.path)
    out = {"sampling_defaults": model_defaults(facts, model.params).as_dict(),
           "capabilities": list(capabilities(facts.chat_template))}
    if model.projector:
        sees, projector = vision_of(model, facts.shape.n_embd if facts.shape else None)
        out["vision"] = projector
        out["capabilities"] += ["vision"] if sees else []
    return out


def vision_of(model: LocalModel, hidden: int | None) -> tuple[bool, dict]:
    """Whether the model's projector fits it, and what it is (or why not)."""
    facts, problem = checked_projector(model.projector, hidden)
    shown = facts.as_dict() if facts else {"file": model.projector.name}
    return problem is None, {**shown, **({"problem": problem} if problem else {})}


def checked_projector(path: Path, hidden: int | None
                      ) -> tuple[ProjectorFacts | None, str | None]:
    """A projector's header (None: unreadable) and why it cannot serve a model of
    `hidden` size (None: it can)."""
    try:
        facts = projector_facts(path)
    except InvalidModelFile as exc:
        return None, exc.message
    return facts, facts.misfit(hidden) if hidden else None


def projector_facts(path: Path) -> ProjectorFacts:
    """A projector's header, read again only when the file changes."""
    try:
        stat = path.stat()
    except OSError as exc:
        raise InvalidModelFile(f"{path.name} cannot be read: {exc.strerror}") from None
    return _projector_facts(path, stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=256)
def _projector_facts(path: Path, _size: int, _mtime: int) -> ProjectorFacts:
    return read_projector(path)


def _adapter(store: ModelStore, adapter: LocalModel) -> dict:
    """An adapter's facts and the local models it fits (the first: its base)."""
    facts = store.inspector.inspect(adapter.path).adapter
    bases = [m.id for m in store.bases_for(adapter)]
    return {"base": bases[0] if bases else None, "bases": bases,
            "use_as": f"{bases[0]}+{adapter.id}" if bases else None,
            "adapter": {"type": "lora", "rank": facts["rank"], "alpha": facts["alpha"],
                        "tensors": len(facts["targets"]),
                        "declared_base": facts["base_names"]}}


def image_tokens(model: LocalModel, pictures) -> int:
    """The image tokens `pictures` take in `model`'s prompt, by its projector's tiles;
    0 for a model that cannot see them (its request is refused anyway)."""
    if not pictures or model.projector is None:
        return 0
    facts, _ = checked_projector(model.projector, None)
    return sum(facts.tiles(p.width, p.height) * facts.tokens_per_tile
               for p in pictures) if facts else 0
