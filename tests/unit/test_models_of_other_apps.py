"""The models other apps keep, found in their real folder layouts (engine/catalog/
other_apps.py, other_models.py): each source's places per platform, every source's models
found and named as its app names them, the same file found twice listed once, and every
kind of damage listed as unusable with its reason while the rest works."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from engine.catalog.other_apps import find, known_places
from engine.catalog.gguf_file import GGUFInspector
from engine.catalog.other_models import OtherAppsModels
from engine.catalog.models import ModelStore
from engine.errors import InvalidModelFile, ModelNotFound
from fixtures.other_apps import hub_cache_model, ollama_model, sha256_file, tree_model
from tiny_gguf import write_tiny_model


@pytest.fixture(scope="module")
def ggufs(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("ggufs")
    return (write_tiny_model(folder / "a.gguf", seed=1),
            write_tiny_model(folder / "b.gguf", seed=2, n_layer=3))


def machine(root: Path) -> dict[str, tuple[Path, ...]]:
    return known_places({"HOME": str(root / "home")}, "linux", root)


def test_each_source_has_its_documented_places_on_each_platform(tmp_path):
    linux = known_places({"HOME": "/h"}, "linux", Path("/"))
    assert linux["ollama"] == (Path("/h/.ollama/models"), Path("/usr/share/ollama/.ollama/models"))
    assert linux["huggingface"] == (Path("/h/.cache/huggingface/hub"),)
    assert linux["llama.cpp"] == (Path("/h/.cache/llama.cpp"),)
    assert linux["lmstudio"] == (Path("/h/.lmstudio/models"), Path("/h/.cache/lm-studio/models"))
    assert linux["gpt4all"] == (Path("/h/.local/share/nomic.ai/GPT4All"),)
    assert linux["jan"][0] == Path("/h/.local/share/Jan/data/llamacpp/models")
    mac = known_places({"HOME": "/Users/a"}, "darwin")
    assert mac["llama.cpp"] == (Path("/Users/a/Library/Caches/llama.cpp"),)
    assert mac["gpt4all"] == (Path("/Users/a/Library/Application Support/nomic.ai/GPT4All"),)
    assert mac["ollama"] == (Path("/Users/a/.ollama/models"),)
    win = known_places({"USERPROFILE": "C:/Users/a", "LOCALAPPDATA": "C:/L",
                        "APPDATA": "C:/R"}, "win32")
    assert win["llama.cpp"] == (Path("C:/L/llama.cpp"),)
    assert win["jan"][0] == Path("C:/R/Jan/data/llamacpp/models")
    assert win["gpt4all"] == (Path("C:/L/nomic.ai/GPT4All"),)
    moved = known_places({"HOME": "/h", "OLLAMA_MODELS": "/big/ollama", "HF_HOME": "/big/hf",
                          "LLAMA_CACHE": "/big/llama", "XDG_CACHE_HOME": "/c"}, "linux")
    assert moved["ollama"][0] == Path("/big/ollama")
    assert moved["huggingface"] == (Path("/big/hf/hub"),)
    assert moved["llama.cpp"] == (Path("/big/llama"),)
    assert known_places({"HOME": "/h", "HF_HUB_CACHE": "/x"}, "linux")["huggingface"] == \
        (Path("/x"),)


def test_every_source_is_found_named_as_its_app_names_it(tmp_path, ggufs):
    a, b = ggufs
    places = machine(tmp_path)
    ollama = places["ollama"][0]
    ollama_model(ollama, a, "qwen3", "30b-a3b", params={"temperature": 0.6, "stop": ["<|x|>"],
                                                        "num_ctx": 8192},
                 system="You are terse.", template="{{ .Prompt }}", projector=b)
    ollama_model(ollama, b, "hf.co/bartowski/Tiny-GGUF", "Q4_K_M")
    ollama_model(ollama, b, "someone/tiny", "v1")
    hub_cache_model(places["huggingface"][0], b, "org/Tiny-GGUF", "tiny-Q8_0.gguf")
    tree_model(places["lmstudio"][0], a, "lmstudio-community/Tiny-GGUF/Tiny-Q4_K_M.gguf")
    tree_model(places["lmstudio"][0], b, "lmstudio-community/Tiny-GGUF/mmproj-Tiny-f16.gguf")
    tree_model(places["llama.cpp"][0], b, "org_Tiny-GGUF_tiny-Q5.gguf", copy=True)
    tree_model(places["jan"][0], a, "tiny-jan/model.gguf", copy=True)
    tree_model(places["gpt4all"][0], b, "tiny-gpt4all.gguf", copy=True)
    found = {(f.source, f.name): f for f in find(places)}
    assert set(found) == {
        ("ollama", "qwen3:30b-a3b"), ("ollama", "hf.co/bartowski/Tiny-GGUF:Q4_K_M"),
        ("ollama", "someone/tiny:v1"), ("huggingface", "org/Tiny-GGUF/tiny-Q8_0.gguf"),
        ("lmstudio", "lmstudio-community/Tiny-GGUF/Tiny-Q4_K_M.gguf"),
        ("llama.cpp", "org_Tiny-GGUF_tiny-Q5.gguf"), ("jan", "tiny-jan/model.gguf"),
        ("gpt4all", "tiny-gpt4all.gguf")}
    assert not any(f.problem for f in found.values())
    qwen = found["ollama", "qwen3:30b-a3b"]
    assert qwen.path.name == f"sha256-{sha256_file(a)}" and qwen.digest == sha256_file(a)
    assert dict(qwen.params) == {"temperature": 0.6, "stop": ("<|x|>",), "num_ctx": 8192}
    assert qwen.system == "You are terse." and qwen.template == "{{ .Prompt }}"
    assert qwen.projector.name == f"sha256-{sha256_file(b)}"
    assert found["huggingface", "org/Tiny-GGUF/tiny-Q8_0.gguf"].digest == sha256_file(b)
    lms = found["lmstudio", "lmstudio-community/Tiny-GGUF/Tiny-Q4_K_M.gguf"]
    assert lms.projector.name == "mmproj-Tiny-f16.gguf"  # a projector, not a model
    from engine.catalog.other_models import _id_for

    assert _id_for(found["jan", "tiny-jan/model.gguf"]) == "tiny-jan"  # Jan's: its folder
    assert _id_for(found["llama.cpp", "org_Tiny-GGUF_tiny-Q5.gguf"]) == "org_Tiny-GGUF_tiny-Q5"


def test_the_same_file_found_in_several_places_is_one_model(tmp_path, ggufs):
    a, b = ggufs
    places, own = machine(tmp_path), tmp_path / "models"
    own.mkdir()
    shutil.copyfile(b, own / "mine.gguf")
    ollama_model(places["ollama"][0], a, "tiny", copy=True)             # by sha256 ...
    hub_cache_model(places["huggingface"][0], a, "org/Tiny", "a.gguf", copy=True)  # ... named
    tree_model(places["lmstudio"][0], a, "p/r/a-linked.gguf")            # the same inode
    tree_model(places["gpt4all"][0], b, "b-copy.gguf", copy=True)      # same size, fingerprint
    store = ModelStore(own, GGUFInspector(), other_apps=OtherAppsModels(places, env={}))
    models = {m.id: m for m in store.list()}
    assert set(models) == {"mine", "tiny:latest"}
    assert models["mine"].as_dict()["also_at"] == ["GPT4All: b-copy.gguf"]
    assert set(models["tiny:latest"].as_dict()["also_at"]) == {
        "the Hugging Face cache: org/Tiny/a.gguf", "LM Studio: p/r/a-linked.gguf"}
    assert store.resolve("p/r/a-linked.gguf").id == "tiny:latest"  # by its name there too
    assert models["tiny:latest"].as_dict()["source_label"] == "Ollama"
    assert store.resolve("tiny").id == "tiny:latest"  # a bare name is its "latest", as Ollama reads it


def test_a_model_of_the_same_name_but_other_content_gets_its_source_in_its_id(tmp_path, ggufs):
    a, b = ggufs
    places, own = machine(tmp_path), tmp_path / "models"
    own.mkdir()
    shutil.copyfile(a, own / "tiny.gguf")
    tree_model(places["lmstudio"][0], b, "p/r/tiny.gguf")
    tree_model(places["gpt4all"][0], write_tiny_model(tmp_path / "c.gguf", seed=5), "tiny.gguf")
    store = ModelStore(own, GGUFInspector(), other_apps=OtherAppsModels(places, env={}))
    assert [m.id for m in store.list()] == ["tiny", "tiny@lmstudio", "tiny@gpt4all"]


def test_split_models_are_one_and_only_whole(tmp_path, ggufs):
    a, b = ggufs
    places = machine(tmp_path)
    lms = places["lmstudio"][0]
    for i in (1, 2, 3):
        tree_model(lms, a if i == 1 else b, f"p/big/Big-Q4-0000{i}-of-00003.gguf", copy=True)
    for i in (1, 2):  # its third part has not arrived
        tree_model(lms, a, f"p/half/Half-Q4-0000{i}-of-00003.gguf", copy=True)
    store = ModelStore(tmp_path / "own", GGUFInspector(), other_apps=OtherAppsModels(places, env={}))
    [big] = store.list()
    assert big.id == "Big-Q4" and big.size_bytes == a.stat().st_size + 2 * b.stat().st_size
    [half] = store.unusable()
    assert "Half-Q4-00003-of-00003.gguf is missing" in half.problem


def test_downloads_in_progress_are_not_models(tmp_path, ggufs):
    a, _ = ggufs
    places = machine(tmp_path)
    tree_model(places["gpt4all"][0], a, "incomplete-model.gguf")       # GPT4All's partial
    tree_model(places["llama.cpp"][0], a, "x.gguf.downloadInProgress")  # llama.cpp's
    tree_model(places["lmstudio"][0], a, "p/r/x.gguf.part")
    tree_model(places["ollama"][0], a, "blobs/sha256-" + "0" * 64 + "-partial")  # no manifest yet
    hub = places["huggingface"][0] / "models--org--r"
    tree_model(hub, a, "blobs/" + "1" * 64 + ".incomplete")  # not linked from a snapshot yet
    assert find(places) == []


def test_damage_is_listed_with_its_reason_and_the_rest_works(tmp_path, ggufs):
    a, b = ggufs
    places = machine(tmp_path)
    ollama = places["ollama"][0]
    ollama_model(ollama, a, "good")
    bad = ollama_model(ollama, a, "notjson")
    bad.write_text("{not json")
    ollama_model(ollama, b, "gone", copy=True)
    (ollama / "blobs" / f"sha256-{sha256_file(b)}").unlink()
    text = tmp_path / "text.txt"
    text.write_text("hello, I am not a model")
    ollama_model(ollama, text, "notgguf")
    evil = ollama_model(ollama, a, "evil")  # a digest that would climb out of blobs/
    evil.write_text(json.dumps({"layers": [{"mediaType": "application/vnd.ollama.image.model",
                                            "digest": "sha256:../../../../etc/passwd"}]}))
    hub = places["huggingface"][0] / "models--org--loops" / "snapshots" / "rev"
    hub.mkdir(parents=True)
    (hub / "loop.gguf").symlink_to("loop.gguf")
    (hub / "dangling.gguf").symlink_to("../../blobs/" + "2" * 64)
    (hub / "sub").symlink_to(".", target_is_directory=True)  # a folder loop: not followed
    store = ModelStore(tmp_path / "own", GGUFInspector(), other_apps=OtherAppsModels(places, env={}))
    assert [m.id for m in store.list()] == ["good:latest"]
    problems = {m.label: m.problem for m in store.unusable()}
    assert "not readable JSON" in problems["notjson:latest"]
    assert problems["gone:latest"] == f"its blob sha256-{sha256_file(b)} is missing"
    assert problems["notgguf:latest"] == "it is not a GGUF file"
    assert problems["evil:latest"] == "its manifest names no model layer"
    assert "cannot open it" in problems["org/loops/loop.gguf"]
    assert problems["org/loops/dangling.gguf"] == "its file is missing"
    with pytest.raises(InvalidModelFile, match="cannot be used: it is not a GGUF"):
        store.resolve("notgguf")
    assert store.kind_of(store.unusable()[0]) == "unreadable"


def test_a_folder_that_disappears_drops_its_models_quietly(tmp_path, ggufs):
    a, _ = ggufs
    disk = tmp_path / "usb"
    tree_model(disk, a, "models/a.gguf")
    places = machine(tmp_path)
    in_place = OtherAppsModels(places, tmp_path / "sources.json", env={})
    in_place.choose(folders=[disk])
    store = ModelStore(tmp_path / "own", GGUFInspector(), other_apps=in_place)
    assert [(m.id, m.source) for m in store.list()] == [("a", "folder")]
    shutil.rmtree(disk)  # unmounted
    in_place.refresh()
    assert store.list() == [] and store.unusable() == []
    with pytest.raises(ModelNotFound):
        store.resolve("a")


def test_sources_turned_off_are_not_read_and_the_choice_is_kept(tmp_path, ggufs):
    a, _ = ggufs
    places = machine(tmp_path)
    ollama_model(places["ollama"][0], a, "tiny")
    choices = tmp_path / "sources.json"
    in_place = OtherAppsModels(places, choices, env={})
    assert [f.name for f in in_place.found()] == ["tiny:latest"]
    in_place.choose("ollama", enabled=False)
    assert in_place.found() == []
    again = OtherAppsModels(places, choices, env={})
    assert not again.enabled("ollama") and again.enabled("lmstudio")
    assert [s["enabled"] for s in again.describe() if s["source"] == "ollama"] == [False]
    assert OtherAppsModels(places, None, env={"HOMERACK_MODEL_SOURCES": "none"}).found() == []


def test_an_unreadable_folder_is_listed_with_why_and_the_rest_is_found(tmp_path, ggufs,
                                                                       monkeypatch):
    import os

    a, _ = ggufs
    places = machine(tmp_path)
    lms = places["lmstudio"][0]
    tree_model(lms, a, "open/r/a.gguf")
    tree_model(lms, a, "locked/r/b.gguf", copy=True)
    ollama_model(places["ollama"][0], a, "fine")
    locked = {lms / "locked", places["ollama"][0] / "manifests" / "registry.ollama.ai"}
    real = os.scandir

    def scandir(path="."):  # as a folder of another user's (tests run as root, too)
        if Path(path) in locked:
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)
    store = ModelStore(tmp_path / "own", GGUFInspector(), other_apps=OtherAppsModels(places, env={}))
    assert [m.id for m in store.list()] == ["a"]
    problems = sorted(m.problem for m in store.unusable())
    assert problems == [f"cannot read {p}: Permission denied" for p in sorted(map(str, locked))]
