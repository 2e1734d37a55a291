"""Draft models for speculative decoding: which installed pairs are compatible (the same
vocabulary, the draft much smaller) and which draft to pick, from the files' metadata."""

from __future__ import annotations

from ..errors import InvalidRequest
from .gguf_file import GGUFInfo, GGUFInspector
from .models import LocalModel

# A draft must cost well under the target per token, or speculation cannot pay.
MAX_DRAFT_SIZE_RATIO = 0.5


class IncompatibleDraft(InvalidRequest):
    kind = "incompatible_draft"
    param = "draft_model"


def vocab_difference(target: GGUFInfo, draft: GGUFInfo) -> str | None:
    """None when the tokenizers are identical; otherwise the difference, in words."""
    if target.tokenizer != draft.tokenizer:
        return f"tokenizer types differ ({target.tokenizer} vs {draft.tokenizer})"
    if target.vocab_size != draft.vocab_size:
        return f"vocabulary sizes differ ({target.vocab_size:,} vs {draft.vocab_size:,} tokens)"
    if (target.bos_token, target.eos_token) != (draft.bos_token, draft.eos_token):
        return (f"special tokens differ (bos/eos {target.bos_token}/{target.eos_token} vs "
                f"{draft.bos_token}/{draft.eos_token})")
    if target.vocab_hash != draft.vocab_hash:
        return "the token lists differ"
    return None


def check_size(target: LocalModel, draft: LocalModel) -> None:
    """A draft an API request names is small beside its model, as pick_draft's own are:
    a large "draft" would be a second model loaded beside it at its context, at the
    request's word."""
    if draft.size_bytes > MAX_DRAFT_SIZE_RATIO * target.size_bytes:
        raise IncompatibleDraft(
            f"{draft.id} cannot draft for {target.id}: its file is "
            f"{draft.size_bytes / max(target.size_bytes, 1):.0%} of the model's size; a draft "
            f"must be at most {MAX_DRAFT_SIZE_RATIO:.0%} of it to be worth running")


def check_draft_fits(target: LocalModel, draft: LocalModel,
                     inspector: GGUFInspector) -> None:
    problem = vocab_difference(inspector.inspect(target.path), inspector.inspect(draft.path))
    if problem:
        raise IncompatibleDraft(
            f"{draft.id} cannot draft for {target.id}: {problem}; a draft model must use "
            "exactly the same tokenizer as the main model")


def pick_draft(target: LocalModel, candidates: list[LocalModel],
               inspector: GGUFInspector) -> LocalModel | None:
    """The smallest compatible local model that is cheap enough next to the target."""
    target_info = inspector.inspect(target.path)
    usable = []
    for model in candidates:
        if model.path == target.path or model.size_bytes > MAX_DRAFT_SIZE_RATIO * target.size_bytes:
            continue
        try:
            info = inspector.inspect(model.path)
        except InvalidRequest:
            continue
        if vocab_difference(target_info, info) is None:
            usable.append(model)
    return min(usable, key=lambda m: m.size_bytes, default=None)

