"""The models folders watched while the engine runs (engine/catalog/watch.py): a file
dropped into the folder (reached through a link, as many people keep theirs on another
disk) is listed with its kind within seconds; a model finishing its download in Ollama
appears; a folder that goes takes its models with it."""

from __future__ import annotations

import shutil
import time

from engine.catalog.other_apps import known_places
from engine.catalog.gguf_file import GGUFInspector
from engine.catalog.other_models import OtherAppsModels
from engine.catalog.models import ModelStore
from engine.catalog.watch import ModelWatch
from fixtures.other_apps import ollama_model
from tiny_gguf import write_tiny_model


def eventually(check, within_s: float = 15.0):
    deadline = time.monotonic() + within_s
    while not check():
        assert time.monotonic() < deadline, "not seen in time"
        time.sleep(0.1)


def test_files_that_come_and_go_are_seen_within_seconds(tmp_path):
    (tmp_path / "disk" / "models").mkdir(parents=True)
    (tmp_path / "models").symlink_to(tmp_path / "disk" / "models")
    places = known_places({"HOME": str(tmp_path / "home")}, "linux", tmp_path)
    ollama = places["ollama"][0]
    ollama.mkdir(parents=True)
    store = ModelStore(tmp_path / "models", GGUFInspector(),
                       other_apps=OtherAppsModels(places, env={}))
    watch = ModelWatch(store, every_s=3600).start()  # no slow look: the events alone
    try:
        time.sleep(0.5)
        dropped = write_tiny_model(tmp_path / "models" / "new.tmp")
        dropped.rename(tmp_path / "models" / "new.gguf")
        eventually(lambda: [(m.id, store.kind_of(m, wait=False)) for m in store.list()]
                   == [("new", "chat")])
        ollama_model(ollama, write_tiny_model(tmp_path / "other.gguf", seed=3), "fresh")
        eventually(lambda: "fresh:latest" in {m.id for m in store.list()})
        shutil.rmtree(ollama)
        eventually(lambda: "fresh:latest" not in {m.id for m in store.list()})
    finally:
        watch.close()
