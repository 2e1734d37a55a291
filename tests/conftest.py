"""The fixtures tests share: a private HOMERACK_HOME, tiny random models, the starter
models, a real `homerack serve` process on the starter chat model, a local Hub. Helpers
are in support/ (pyproject's pythonpath puts tests/ and packaging/ on the path)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from support.engines import GGUF_INFO, api_client, start_engine
from support.models import ADAPTER, GEMMA, GEMMA_REPO, SMOL, STARTER
from tiny_gguf import write_tiny_model  # packaging/, shared with the build smoke test

# the other apps' folders of the machine running the tests are not read (their models
# would change what the tests see); tests of those sources build their own
os.environ["HOMERACK_MODEL_SOURCES"] = "none"


def pytest_collection_modifyitems(items):
    """A test on the real starter models (assembled, checked and loaded: seconds each) is
    slow wherever it is; so is one that starts a process, marked where it is written."""
    for item in items:
        if "starters_dir" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def starters_dir(tmp_path_factory) -> Path:
    """The starter models, installed once per test session through the real store."""
    from engine.catalog.gguf_file import GGUFInspector
    from engine.catalog.models import ModelStore

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
    _write_adapters(starters_dir, models)
    _read_headers(models, root)
    return root


def _read_headers(models: Path, root: Path) -> None:
    """Every model's header read once, into the home's inspector cache, which each test's
    engine home starts from (support/engines.py, seed_gguf_info)."""
    from engine.catalog.gguf_file import GGUFInspector

    inspector = GGUFInspector(root / GGUF_INFO)
    for model in sorted(models.glob("*.gguf")):
        inspector.inspect(model)


def _write_adapters(starters_dir: Path, models: Path) -> None:
    """A LoRA adapter for the starter (ADAPTER) and one for Gemma, beside the models."""
    from fixtures.adapter_files import LoraSpec, write_lora, write_shaped

    write_lora(starters_dir / f"{STARTER}.gguf", models / f"{ADAPTER}.gguf",
               # strong enough to change the greedy answer (measured: 0.2 over 8 layers
               # left "The capital of France is Paris." as it was)
               LoraSpec(targets=("attn_q", "ffn_up"), layers=tuple(range(30)), strength=0.3),
               base_name="SmolLM2 135M Instruct")
    # Gemma 3 270M's first query projection, 640 -> 1024 (its file takes 10 s to read)
    write_shaped(models / "gemma-style.gguf", "gemma3",
                 {"blk.0.attn_q.weight": (640, 1024, 0.02)})


@pytest.fixture
def home_env(home, monkeypatch) -> Path:
    monkeypatch.setenv("HOMERACK_HOME", str(home))
    return home


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny.gguf")


@pytest.fixture
def tiny_store(tmp_path, tiny_model):
    from engine.catalog.gguf_file import GGUFInspector
    from engine.catalog.models import ModelStore

    folder = tmp_path / "models"
    folder.mkdir()
    shutil.copy(tiny_model, folder / "tiny.gguf")
    return ModelStore(folder, GGUFInspector())


@pytest.fixture(scope="session")
def cut_drafts(starters_dir, tmp_path_factory) -> Path:
    """A folder holding the cut version of the Gemma draft (engine/speculation/cut_draft.py:
    18 s to make here, so made once; the engine's own background cut has a test of its
    own)."""
    from engine.speculation import cut_draft

    folder = tmp_path_factory.mktemp("cut-drafts")
    cut_draft.prepare(starters_dir / f"{GEMMA}.gguf", folder)
    return folder


@pytest.fixture(scope="session")
def server(home):
    """A real engine process on the starter chat model, shared by the API tests."""
    process, address, models = start_engine(
        home, "server", ["--model", STARTER, "--ctx", "2048", "--queue-size", "32"])
    yield address, process, models
    process.stop()


@pytest.fixture(scope="module")
def http(server):
    """Raw HTTP to the shared engine, with its token."""
    with api_client(server[0]) as session:
        yield session


@pytest.fixture
def hub(starters_dir, tmp_path, monkeypatch):
    """A local Hub-compatible server (tests/support/hub_server.py) with HF_ENDPOINT pointing at it."""
    from support.hub_server import HubServer, Repo

    # a second "quant" split in two parts, to see split files grouped as one
    parts = {}
    for i in (1, 2):
        part = tmp_path / f"part{i}"
        part.write_bytes(os.urandom(1 << 20))
        parts[f"SmolLM2-135M-Instruct-Q8_0-0000{i}-of-00002.gguf"] = part
    # the authors' sampling defaults, as a Hub repository keeps them
    config = tmp_path / "generation_config.json"
    config.write_text('{"do_sample": true, "temperature": 0.25, "top_p": 0.85}')
    server = HubServer({
        SMOL: Repo({"SmolLM2-135M-Instruct-Q4_1.gguf": starters_dir / f"{STARTER}.gguf",
                    "generation_config.json": config, **parts}, downloads=500),
        GEMMA_REPO: Repo({"gemma-3-270m-it-Q4_K_M.gguf":
                          starters_dir / "gemma-3-270m-q4_k_m.gguf"}, downloads=900),
        "meta-llama/Gated-GGUF": Repo({"gated-Q4_K_M.gguf": starters_dir / f"{STARTER}.gguf"},
                                      gated=True),
    })
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    yield server
    server.close()


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory) -> Path:
    """A tiny random BERT embedding model, written with the `gguf` writer (through the
    same writer the starter embedding model is converted with)."""
    import numpy as np

    from engine.catalog.bert_gguf import write_bert

    hidden, ffn, layers, words = 32, 64, 2, ["the", "cat", "dog", "sat", "on", "mat", "##s"]
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words, *"abcdefghijklmnopqrstuvwxyz"]
    config = {"num_hidden_layers": layers, "hidden_size": hidden, "intermediate_size": ffn,
              "num_attention_heads": 2, "max_position_embeddings": 64, "type_vocab_size": 2}
    rng = np.random.default_rng(7)

    def w(*shape):
        return rng.normal(0, 0.2, shape).astype(np.float32)

    tensors = {"embeddings.word_embeddings.weight": w(len(vocab), hidden),
               "embeddings.position_embeddings.weight": w(64, hidden),
               "embeddings.token_type_embeddings.weight": w(2, hidden),
               "embeddings.LayerNorm.weight": np.ones(hidden, np.float32),
               "embeddings.LayerNorm.bias": np.zeros(hidden, np.float32)}
    for i in range(layers):
        p = f"encoder.layer.{i}."
        for name, shape in (("attention.self.query", (hidden, hidden)),
                            ("attention.self.key", (hidden, hidden)),
                            ("attention.self.value", (hidden, hidden)),
                            ("attention.output.dense", (hidden, hidden)),
                            ("intermediate.dense", (ffn, hidden)),
                            ("output.dense", (hidden, ffn))):
            tensors[p + name + ".weight"] = w(*shape)
            tensors[p + name + ".bias"] = w(shape[0])
        for norm in ("attention.output.LayerNorm", "output.LayerNorm"):
            tensors[p + norm + ".weight"] = np.ones(hidden, np.float32)
            tensors[p + norm + ".bias"] = np.zeros(hidden, np.float32)
    return write_bert(tmp_path_factory.mktemp("bert") / "tiny-bert.gguf", config, tensors,
                      vocab, "tiny BERT")


@pytest.fixture(scope="session")
def vision_dir(tmp_path_factory, starters_dir) -> Path:
    """A models folder holding a model that sees: SmolVLM-256M's decoder shape (the
    starter with SmolVLM's image tokens) and a 2-block SmolVLM projector beside it, paired
    by name as a flat folder pairs them."""
    from fixtures.projectors import SMOLVLM_QUICK, write_projector, write_vision_decoder

    folder = tmp_path_factory.mktemp("vision") / "models"
    folder.mkdir()
    write_vision_decoder(starters_dir / f"{STARTER}.gguf", folder / "smolvlm-256m.gguf")
    write_projector(SMOLVLM_QUICK, folder / "mmproj-smolvlm-256m-f16.gguf")
    return folder


@pytest.fixture(scope="module")
def door_port() -> int:
    """A free port on loopback for an engine's second listener (`serve --ollama-port`)."""
    from fixtures.network import free_port

    return free_port()
