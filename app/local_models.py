"""The models folder as the desktop app and the command line reach it in their own
process: the store opened (starters installed, other apps' models beside), a user's file
linked in, a folder of models added, a file the command line names turned into its id.
The engine's API takes model ids only, never paths."""

from __future__ import annotations

import sys

from .paths import bundled_models, paths


def open_store(quiet: bool = False):
    from engine.catalog.gguf_file import GGUFInspector
    from engine.catalog.models import ModelStore

    where = paths()
    store = ModelStore(where.models, GGUFInspector(where.gguf_cache), bundled_models(),
                       other_models())
    store.install_starters(log=(lambda _m: None) if quiet else
                           (lambda m: print(m, file=sys.stderr, flush=True)))
    return store


def sources_file():
    """The user's choices of where models are found besides the models folder."""
    return paths().data / "sources.json"


def other_models():
    """This machine's other apps' models and the user's choices of them."""
    from engine.catalog.other_models import OtherAppsModels

    return OtherAppsModels.of_this_machine(sources_file())


def set_folder(path: str, add: bool) -> list[str]:
    """A folder of GGUF models added to (or removed from) where models are found, here
    and not through the engine's API, which takes no paths: nothing holding its token can
    make the engine read a folder it names. The engine reads the choice again when told
    (PUT /v1/sources). Returns the folders now added."""
    from pathlib import Path

    from engine.errors import InvalidRequest

    found = Path(path).expanduser().resolve()
    if add and not found.is_dir():
        raise InvalidRequest(f"{path} is not a folder", param="path")
    places = other_models()
    folders = [f for f in places.choices.folders if f != found] + ([found] if add else [])
    return [str(f) for f in places.choose(folders=folders).folders]


def import_model(path: str) -> dict:
    """Link a user's GGUF file into the models folder, here and not through the engine's
    API: the API takes no file paths, so nothing holding its token can make the engine
    open a file it names. The engine lists the new model from its folder."""
    from pathlib import Path

    model = open_store(quiet=True).add(Path(path))
    return {"id": model.id, **model.as_dict()}


def model_id(name: str | None) -> str | None:
    """The id of a model the command line names, by id or by path: a file outside the
    models folder is linked into it first (`models add`), since the engine's API takes
    ids only."""
    from pathlib import Path

    if not name or not name.endswith(".gguf") or not Path(name).expanduser().is_file():
        return name
    store = open_store(quiet=True)
    path = Path(name).expanduser().resolve()
    for model in store.list():
        if model.path.resolve() == path:
            return model.id
    return store.add(path).id
