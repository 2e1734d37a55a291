"""Shared fixtures: a private HOMERACK_HOME, tiny random models, the starter models, and a
real `homerack serve` process on the starter chat model."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).parent))

from tiny_gguf import write_tiny_model  # noqa: E402

STARTER = "smollm2-135m-instruct-q4_1"
GEMMA = "gemma-3-270m-q4_k_m"


@pytest.fixture(scope="session")
def starters_dir(tmp_path_factory) -> Path:
    """The starter models, installed once per test session through the real store."""
    from engine.gguf_file import GGUFInspector
    from engine.models import ModelStore

    folder = tmp_path_factory.mktemp("starters")
    ModelStore(folder, GGUFInspector()).install_starters(log=lambda _m: None)
    return folder


@pytest.fixture(scope="session")
def home(tmp_path_factory, starters_dir) -> Path:
    """A HOMERACK_HOME whose models folder links the starters (no per-test copies)."""
    root = tmp_path_factory.mktemp("home")
    models = root / "data" / "models"
    models.mkdir(parents=True)
    for model in starters_dir.glob("*.gguf"):
        (models / model.name).symlink_to(model)
    return root


@pytest.fixture
def home_env(home, monkeypatch) -> Path:
    monkeypatch.setenv("HOMERACK_HOME", str(home))
    return home


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny.gguf")


@pytest.fixture
def tiny_store(tmp_path, tiny_model):
    from engine.gguf_file import GGUFInspector
    from engine.models import ModelStore

    folder = tmp_path / "models"
    folder.mkdir()
    shutil.copy(tiny_model, folder / "tiny.gguf")
    return ModelStore(folder, GGUFInspector())


@pytest.fixture(scope="session")
def server(home):
    """A real engine process on the starter chat model, shared by the API tests."""
    from app.engine_proc import EngineProcess

    env = dict(os.environ, HOMERACK_HOME=str(home / "server"))
    (home / "server" / "data").mkdir(parents=True, exist_ok=True)
    models = home / "server" / "data" / "models"
    if not models.exists():
        models.symlink_to(home / "data" / "models")
    process = EngineProcess(["--model", STARTER, "--ctx", "2048", "--queue-size", "4"], env=env)
    address = process.wait_ready()
    yield address, process, models
    process.stop()
