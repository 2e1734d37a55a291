"""What a model file's header says, as `/v1/models` lists it: a chat model's sampling
defaults and capabilities (what its chat template can do), an adapter's rank and the
local models it fits. Nothing is read that was not read already: a file still being
inspected says None."""

from __future__ import annotations

from ..formats.families import capabilities
from .models import LocalModel, ModelStore
from .sampling_defaults import model_defaults


def describe(store: ModelStore, model: LocalModel, kind: str | None) -> dict:
    """The facts of `model` (of `kind`, as store.kind_of says) for its listing."""
    if kind == "adapter":
        return _adapter(store, model)
    if not store.inspector.known(model.path):
        return {"sampling_defaults": None, "capabilities": None}
    facts = store.inspector.inspect(model.path)
    return {"sampling_defaults": model_defaults(facts, model.params).as_dict(),
            "capabilities": list(capabilities(facts.chat_template))}


def _adapter(store: ModelStore, adapter: LocalModel) -> dict:
    """An adapter's facts and the local models it fits (the first: its base)."""
    facts = store.inspector.inspect(adapter.path).adapter
    bases = [m.id for m in store.bases_for(adapter)]
    return {"base": bases[0] if bases else None, "bases": bases,
            "use_as": f"{bases[0]}+{adapter.id}" if bases else None,
            "adapter": {"type": "lora", "rank": facts["rank"], "alpha": facts["alpha"],
                        "tensors": len(facts["targets"]),
                        "declared_base": facts["base_names"]}}
