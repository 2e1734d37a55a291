"""A downloaded model's sampling defaults from the Hub: the repository's
`generation_config.json`, else its base model's (GGUF repositories often leave it out;
the card's `base_model` names where it is), kept beside the model file where
catalog/sampling_defaults.py reads it. Best effort: a download never fails for it."""

from __future__ import annotations

import os
from pathlib import Path

from ..catalog.sampling_defaults import sidecar_of
from ..errors import HomerackError
from .repos import _api, _fetch, _plain

CONFIG = "generation_config.json"
MAX_BYTES = 64 * 1024  # a real one is under 1 KiB


def keep_generation_config(repo: str, model_path: Path, endpoint: str | None = None,
                           token: str | None = None) -> Path | None:
    """The kept file, or None when neither the repository nor its base model has one."""
    target = sidecar_of(model_path)
    partial = target.with_name(target.name + ".part")
    for source in (repo, *_base_models(repo, endpoint, token)):
        try:
            _plain(lambda: _fetch(source, CONFIG, partial, endpoint, token, None, MAX_BYTES),
                   f"{source}/{CONFIG}")  # its size checked before any byte is fetched
        except HomerackError:
            continue
        os.replace(partial, target)
        return target
    partial.unlink(missing_ok=True)
    return None


def _base_models(repo: str, endpoint: str | None, token: str | None) -> list[str]:
    """The repositories the model card names as its base (none when it cannot say)."""
    try:
        card = _plain(lambda: _api(endpoint, token).model_info(repo), repo).card_data
    except HomerackError:
        return []
    base = (card or {}).get("base_model") if hasattr(card, "get") else None
    return [base] if isinstance(base, str) else [b for b in base or () if isinstance(b, str)]
