"""Out-of-memory back-off, for real: an engine process whose memory is capped (the
kernel's RLIMIT_DATA, which llama.cpp's buffer allocations count against) is asked for a
load the planner thinks fits; the load fails, the engine retries with safer plans, says
what changed, and ends with a model that answers. Also: a previous engine that died
mid-load leaves a journal, and the next one starts that model from a safer plan."""

import json
import os
import resource
import time

import httpx
import pytest

from support.engines import seed_gguf_info
from support.models import PARIS_QUESTION, STARTER
from engine.engine import Engine, LoadOverride
from engine.settings import EngineSettings, LoadSettings

MiB = 1 << 20


def vm_data(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmData:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmData")


@pytest.fixture
def capped_server(home):
    from app.engine_proc import EngineProcess

    root = home / "capped"
    (root / "data").mkdir(parents=True, exist_ok=True)
    if not (root / "data" / "models").exists():
        (root / "data" / "models").symlink_to(home / "data" / "models")
    seed_gguf_info(home, root)
    process = EngineProcess(["--no-prompt-cache"], env=dict(os.environ, HOMERACK_HOME=str(root)))
    address = process.wait_ready()
    http = httpx.Client(base_url=address.url, timeout=300,
                        headers={"Authorization": f"Bearer {address.token}"})
    yield http, process.process.pid
    http.close()
    process.stop()


def chat(http, text=PARIS_QUESTION):
    response = http.post("/v1/chat/completions", json={
        "model": STARTER, "max_tokens": 12, "temperature": 0,
        "messages": [{"role": "system", "content": "You are a helpful assistant."},
                     {"role": "user", "content": text}]})
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["message"]["content"]


def _wait_headers_read(http, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while any(m.get("kind") is None for m in http.get("/v1/models").json()["data"]):
        assert time.monotonic() < deadline, "the engine never read its models' headers"
        time.sleep(0.2)


def test_a_load_that_runs_out_of_memory_backs_off_and_answers(capped_server):
    http, pid = capped_server
    # The engine reads its models' headers in the background after it starts: done
    # first, or the memory it frees after the cap is set makes room for the big load.
    _wait_headers_read(http)
    # A small load and one answer first: threads and buffers the engine always has.
    small = http.post("/v1/models/load", json={"model": STARTER, "n_ctx": 512})
    assert small.status_code == 200, small.text
    assert small.json()["load_notes"] == []
    chat(http)
    # 80 MiB more than now: the 8192-token f16 KV cache alone needs 180 MiB.
    limit = vm_data(pid) + 80 * MiB
    resource.prlimit(pid, resource.RLIMIT_DATA, (limit, resource.RLIM_INFINITY))

    predicted = http.post("/v1/plan", json={"model": STARTER, "n_ctx": 8192}).json()
    assert predicted["fits"] and predicted["n_ctx"] == 8192 and predicted["kv_type"] == "f16"
    loaded = http.post("/v1/models/load", json={"model": STARTER, "n_ctx": 8192})
    assert loaded.status_code == 200, loaded.text
    status = loaded.json()
    notes = status["load_notes"]
    # the plan gave each lane a KV stream of 8192 cells
    assert "8192 tokens of context for each of 17 KV streams, f16 KV cache ran out of " \
        "memory on CPU" in notes[0]
    assert notes[-1].startswith("loaded with")
    plan = status["memory"]["plan"]
    assert (plan["n_ctx"], plan["kv_type"], plan["kv_split"]) != (8192, "f16", True)
    assert status["n_ctx"] == plan["n_ctx"]
    assert any("held to" in reason for reason in plan["reasons"])
    assert "Paris" in chat(http)
    assert http.get("/health").json()["load_error"] is None


def test_an_engine_that_died_loading_leaves_a_safer_start(home, tmp_path):
    from engine.catalog.gguf_file import GGUFInspector
    from engine.catalog.models import ModelStore
    from engine.model.loader import LoadJournal

    store = ModelStore(home / "data" / "models", GGUFInspector())
    model = store.resolve(STARTER)
    journal = tmp_path / "loading.json"
    entry = LoadJournal(journal).file_for(model.path)  # one file per model
    # What the dead engine had begun: 300 MiB on the CPU for this model.
    entry.write_text(json.dumps({"model": str(model.path), "used": {"CPU": 300 * MiB}}))
    engine = Engine(store, EngineSettings(LoadSettings(n_ctx=8192), load_journal=journal))
    try:
        done = []
        engine.load(model, LoadOverride(n_ctx=8192), done.append)
        engine.close()
        status = engine.status()
    finally:
        engine.close()
    assert done and done[0].finish_reason == "loaded"
    plan = status["memory"]["plan"]
    assert "stopped while loading this model last time" in status["load_notes"][0]
    assert sum(d["total"] for d in plan["devices"]) <= 225 * MiB
    assert plan["n_ctx"] < 8192 or plan["kv_type"] == "q8_0"
    assert not entry.exists()  # this load finished


@pytest.mark.slow
def test_an_engine_that_died_evaluating_restarts_without_repacked_weights(home, tmp_path):
    """HOMERACK_FAULT=repacked-eval makes an engine die as llama.cpp's AMX kernels do
    (SIGSEGV on the first evaluation with repacked weights). The next engine finds the
    journal, loads the model with use_extra_bufts off, says so, and answers; so does
    every later one, and `homerack chat -v` shows why."""
    import signal
    import subprocess
    import sys

    from app.engine_proc import EngineProcess
    from support import ROOT

    root = tmp_path / "home"
    (root / "data").mkdir(parents=True)
    (root / "data" / "models").symlink_to(home / "data" / "models")
    seed_gguf_info(home, root)
    env = dict(os.environ, HOMERACK_HOME=str(root), HOMERACK_FAULT="repacked-eval")

    def engine():
        process = EngineProcess(["--model", STARTER, "--no-prompt-cache", "--parallel", "1",
                                 "--response-cache-mib", "0"],  # each start must generate
                                   env=env)  # the repack is used by one sequence alone
        address = process.wait_ready()
        return process, httpx.Client(base_url=address.url, timeout=120,
                                     headers={"Authorization": f"Bearer {address.token}"})

    first, http = engine()
    with pytest.raises(httpx.TransportError):  # it dies answering
        chat(http)
    assert first.process.wait(30) == -signal.SIGSEGV
    for attempt in ("right after the crash", "on a later start"):
        process, http = engine()
        try:
            assert "Paris" in chat(http), attempt
            notes = http.get("/health").json()["load_notes"]
            assert any("without repacked weights" in note for note in notes), (attempt, notes)
            if attempt == "on a later start":
                chatted = subprocess.run(
                    [sys.executable, "-m", "app", "chat", "-v", "--max-tokens", "4", "Hi"],
                    cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
                assert chatted.returncode == 0, chatted.stderr
                assert "[load] loaded without repacked weights" in chatted.stderr
        finally:
            http.close()
            process.stop()


def test_a_tensor_split_llama_cpp_refuses_is_retried_with_whole_layers(home):
    """llama.cpp refuses to split every layer across GPUs for some architectures and
    backends (and here, where there is no GPU): the load goes on with whole layers."""
    from dataclasses import replace

    from engine.catalog.gguf_file import GGUFInspector
    from engine.catalog.models import ModelStore
    from engine.machine.planner import Preferences, plan
    from engine.llama.probe import probe
    from engine.model.loader import LoadJournal, load

    store = ModelStore(home / "data" / "models", GGUFInspector())
    model = store.resolve(STARTER)
    asked = []

    def planner(hardware, shape, prefs):  # as a plan for two GPUs would say
        asked.append(prefs.tensor_parallel)
        planned = plan(hardware, shape, prefs)
        return replace(planned, split_mode="tensor") if prefs.tensor_parallel else planned

    outcome = load(model.path, store.inspector.inspect(model.path), LoadSettings(n_ctx=1024),
                   probe(), Preferences(ctx=1024, min_ctx=1024, tensor_parallel=True),
                   LoadJournal(None),
                   planner=planner)
    try:
        assert asked == [True, False]
        assert outcome.plan.split_mode == "layer" and outcome.llama.settings.split_mode == "layer"
        assert "splitting every layer across the GPUs failed" in outcome.notes[0]
        assert outcome.notes[-1].startswith("loaded with")
    finally:
        outcome.llama.close()
