"""What the routes read about the models on disk, in one place: the list with each
model's kind and facts, the adapters, the models found that cannot be used, where models
are found and the user's choice of sources, a Hub file already here, a header. The
engine holds one (`Engine.shelf`); it also keeps the folders watched (watch.py)."""

from __future__ import annotations

from ..errors import HomerackError, InvalidRequest
from .facts import describe
from .gguf_file import GGUFInfo
from .models import LocalModel, ModelStore


class Shelf:
    def __init__(self, store: ModelStore):
        self.store = store
        self.watch = None  # watch.ModelWatch, once watch() started it

    def models(self) -> list[LocalModel]:
        """The models that can be used: the folder's and other apps', adapters and
        embedding models among them."""
        return self.store.list()

    def unusable(self) -> list[LocalModel]:
        """Models found in other apps' folders that cannot be used, each with why."""
        return self.store.unusable()

    def adapters(self) -> list[LocalModel]:
        """The LoRA adapters, in llama-server's order (a numeric id is an index here)."""
        return self.store.adapters()

    def kind_of(self, model: LocalModel) -> str | None:
        """chat, embedding or adapter; None while its header is still being read."""
        return self.store.kind_of(model, wait=False)

    def facts(self, model: LocalModel, kind: str | None) -> dict:
        """What the file's header says (facts.py): sampling defaults and capabilities,
        or an adapter's rank and the models it fits."""
        return describe(self.store, model, kind)

    def header(self, model: LocalModel) -> GGUFInfo | None:
        """What `model`'s header says; None while it is still being read, or when it
        cannot be."""
        if model.problem or not self.store.inspector.known(model.path):
            return None
        try:
            return self.store.inspector.inspect(model.path)
        except HomerackError:
            return None

    def on_this_machine(self, repo: str, files: tuple[str, ...], sha256: tuple[str, ...]
                        ) -> LocalModel | None:
        """The model on this machine that is a Hub repository's file, wherever it lies."""
        return self.store.on_this_machine(repo, files, sha256)

    def sources(self) -> list[dict]:
        """Where models are found besides the models folder (other_models.py)."""
        return self.store.other_apps.describe() if self.store.other_apps else []

    def choose_sources(self, source: str | None = None, enabled: bool | None = None
                       ) -> list[dict]:
        """A source turned on or off; the user's choices read again (the app adds
        folders: the API takes no paths) and the folders looked at again."""
        if self.store.other_apps is None:
            raise InvalidRequest("this engine reads its models folder only")
        self.store.other_apps.choose(source, enabled)
        if self.watch is not None:
            self.watch.changed()
        return self.sources()

    def start_watching(self) -> None:
        """Find and inspect models as files come and go (watch.py)."""
        from .watch import ModelWatch

        self.watch = ModelWatch(self.store).start()

    def close(self) -> None:
        if self.watch is not None:
            self.watch.close()
