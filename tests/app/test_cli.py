"""The `homerack` command as a user runs it (real processes)."""

import os
import stat
import subprocess
import sys

import pytest

from support import ROOT
from support.engines import seed_gguf_info
from support.models import GEMMA, PARIS_QUESTION, STARTER

pytestmark = pytest.mark.slow


def homerack(*args, home, timeout=180, env=None, **kwargs):
    env = dict(os.environ, HOMERACK_HOME=str(home), **(env or {}))
    return subprocess.run([sys.executable, "-m", "app", *args], cwd=ROOT, env=env, text=True,
                          capture_output=True, timeout=timeout, **kwargs)


def test_models_lists_both_starters_with_the_chat_model_preselected(home):
    result = homerack("models", home=home)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert any(line.startswith("*") and STARTER in line for line in lines)
    assert any(GEMMA in line for line in lines)


def test_models_add_accepts_a_gguf_and_refuses_junk(tmp_path, tiny_model, starters_dir):
    home = tmp_path / "home"
    (home / "data").mkdir(parents=True)
    (home / "data" / "models").symlink_to(starters_dir)  # starters already there: no copy
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"\0" * 100)
    refused = homerack("models", "add", str(junk), home=home)
    assert refused.returncode == 1 and "not a GGUF" in refused.stderr
    added = homerack("models", "add", str(tiny_model), home=home)
    assert added.returncode == 0, added.stderr
    assert "tiny" in homerack("models", home=home).stdout
    (starters_dir / "tiny.gguf").unlink()


def test_models_lists_other_apps_models_and_the_sources_are_chosen(tmp_path, tiny_model,
                                                                   starters_dir):
    from fixtures.other_apps import hub_cache_model, ollama_model, tree_model

    home, machine = tmp_path / "home", tmp_path / "machine"
    (home / "data").mkdir(parents=True)
    (home / "data" / "models").symlink_to(starters_dir)
    ollama_model(machine / ".ollama" / "models", tiny_model, "tiny", "1b")
    ollama_model(machine / ".ollama" / "models", starters_dir / f"{STARTER}.gguf", "smollm2")
    hub_cache_model(machine / ".cache" / "huggingface" / "hub", tiny_model, "org/Tiny-GGUF",
                    "tiny-Q4_0.gguf")
    tree_model(machine / "usb", tiny_model, "shelf/tiny-copy.gguf", copy=True)
    env = {"HOME": str(machine), "HOMERACK_MODEL_SOURCES": ""}
    listed = homerack("models", home=home, env=env).stdout
    assert "tiny:1b" in listed and "from Ollama: tiny:1b" in listed
    assert "also in the Hugging Face cache: org/Tiny-GGUF/tiny-Q4_0.gguf" in listed
    assert "also in Ollama: smollm2:latest" in listed  # the starter's own file: one model
    added = homerack("models", "folder", "add", str(machine / "usb"), home=home, env=env)
    assert added.returncode == 0 and "a folder you added       1 models" in added.stdout
    assert "also in a folder you added: shelf/tiny-copy.gguf" in \
        homerack("models", home=home, env=env).stdout
    off = homerack("models", "sources", "off", "ollama", home=home, env=env)
    assert off.returncode == 0 and "off Ollama" in off.stdout
    listed = homerack("models", home=home, env=env).stdout
    assert "tiny:1b" not in listed and "tiny-Q4_0" in listed  # now the Hub cache's
    bad = homerack("models", "sources", "off", "napster", home=home, env=env)
    assert bad.returncode == 1 and "unknown source 'napster'" in bad.stderr


def test_chat_starts_an_engine_and_seed_repeats(home):
    args = ("chat", "Name a color.", "--seed", "7", "--temperature", "1.0", "--max-tokens", "12")
    first = homerack(*args, home=home)
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip()
    assert homerack(*args, home=home).stdout == first.stdout


def test_chat_uses_the_running_engine(home, tmp_path):
    serve_home = tmp_path / "served"
    (serve_home / "data").mkdir(parents=True)
    (serve_home / "data" / "models").symlink_to(home / "data" / "models")
    seed_gguf_info(home, serve_home)
    env = dict(os.environ, HOMERACK_HOME=str(serve_home), HOMERACK_TOKEN="sekret")
    server = subprocess.Popen([sys.executable, "-m", "app", "serve", "--model", STARTER],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline().startswith("listening on http://127.0.0.1:")
        engine_file = serve_home / "run" / "engine.json"
        assert stat.S_IMODE(engine_file.stat().st_mode) == 0o600
        reply = homerack("chat", PARIS_QUESTION, "--system",
                         "You are a helpful assistant.", "--temperature", "0", home=serve_home)
        assert reply.returncode == 0, reply.stderr
        assert "Paris" in reply.stdout
        # No second engine was started: the running one served the request.
        assert "installing" not in reply.stderr
    finally:
        server.terminate()
        server.wait(10)
    assert not (serve_home / "run" / "engine.json").exists()


def test_serve_generates_a_token_when_none_is_given(home, tmp_path):
    serve_home = tmp_path / "served"
    (serve_home / "data").mkdir(parents=True)
    (serve_home / "data" / "models").symlink_to(home / "data" / "models")
    seed_gguf_info(home, serve_home)
    env = {k: v for k, v in os.environ.items() if k != "HOMERACK_TOKEN"}
    env["HOMERACK_HOME"] = str(serve_home)
    server = subprocess.Popen([sys.executable, "-m", "app", "serve"], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, text=True)
    try:
        server.stdout.readline()
        import json
        token = json.loads((serve_home / "run" / "engine.json").read_text())["token"]
        assert len(token) >= 32
    finally:
        server.terminate()
        server.wait(10)


def test_hardware_and_plan_commands(home, tmp_path):
    import json

    hardware = json.loads(homerack("hardware", "--json", home=home).stdout)
    assert any(d["kind"] == "cpu" for d in hardware["devices"])
    assert hardware["ram_total_bytes"] > 0 and hardware["cpu_cores"] >= 1
    if not hardware["gpu_backends"]:  # a CPU build says so, in words
        assert "runs on the CPU: this llama.cpp build has no GPU backend" in \
            homerack("hardware", home=home).stdout
    planned = homerack("plan", STARTER, "--json", "--vram", "8", "--ram", "16", home=home)
    result = json.loads(planned.stdout)
    # no --ctx: all the 8k SmolLM2 takes, which costs nothing on an 8 GB GPU
    assert result["fits"] and result["n_gpu_layers"] == 31 and result["n_ctx"] == 8192
    assert any("the most this model takes" in r for r in result["reasons"])
    assert result["lanes"] == 16 and "16 requests at once" in result["reasons"][-1]
    asked = json.loads(homerack("plan", STARTER, "--json", "--ctx", "4096", "--parallel", "3",
                                home=home).stdout)
    assert asked["n_ctx"] == 4096 and asked["lanes"] == 3
    assert [d["device"] for d in result["devices"]] == ["GPU0", "CPU"]
    table = homerack("plan", STARTER, "--ram", "0.05", home=home)
    assert table.returncode == 2 and "DOES NOT FIT" in table.stdout
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a model")
    refused = homerack("plan", str(junk), home=home)
    assert refused.returncode == 1 and "not a GGUF" in refused.stderr


def test_models_and_chat_with_a_lora_adapter(home, server):
    from support.models import ADAPTER

    served = home / "server"  # the shared engine runs there: chat uses it
    listed = homerack("models", home=served)
    assert listed.returncode == 0, listed.stderr
    assert f"adapts {STARTER} (use {STARTER}+{ADAPTER})" in listed.stdout
    assert "gemma-style" in listed.stdout and f"adapts {GEMMA}" in listed.stdout
    asked = ("chat", PARIS_QUESTION, "--temperature", "0", "--max-tokens", "16")
    adapted = homerack(*asked, "--lora", f"{ADAPTER}=1", home=served)
    assert adapted.returncode == 0, adapted.stderr
    # the starter alone says "The capital of France is Paris." (test_lora_api compares)
    assert adapted.stdout.strip() and "The capital of France is Paris." not in adapted.stdout
    wrong = homerack(*asked, "--lora", "gemma-style", home=served)
    assert wrong.returncode == 1 and "does not fit model" in wrong.stderr
    typo = homerack(*asked, "--lora", f"{ADAPTER}=strong", home=served)
    assert typo.returncode == 2 and "--lora" in typo.stderr


def test_mcp_imports_lists_and_calls_from_the_terminal(tmp_path):
    import json

    from support.mcp_servers import time_server

    home, fake_home = tmp_path / "home", tmp_path / "user"
    (home / "data").mkdir(parents=True)
    claude = fake_home / ".config" / "Claude" / "claude_desktop_config.json"
    claude.parent.mkdir(parents=True)
    claude.write_text(json.dumps({"mcpServers": {"time": time_server(),
                                                 "broken": {"command": 7}}}))
    refused = homerack("mcp", "import", home=home, env={"HOME": str(fake_home)})
    assert refused.returncode == 1 and "broken" in refused.stderr  # nothing half-imported
    claude.write_text(json.dumps({"mcpServers": {"time": time_server()}}))
    imported = homerack("mcp", "import", home=home, env={"HOME": str(fake_home)})
    assert imported.returncode == 0 and "added time" in imported.stdout
    listed = json.loads(homerack("mcp", "list", "--json", home=home).stdout)
    assert listed["servers"][0]["tools"] == ["get_current_time", "convert_time"]
    called = homerack("mcp", "call", "time", "get_current_time", '{"timezone": "Asia/Tokyo"}',
                      home=home)
    assert called.returncode == 0 and "+09:00" in called.stdout
    failed = homerack("mcp", "call", "time", "get_current_time", '{"timezone": "Nowhere"}',
                      home=home)
    assert failed.returncode == 1 and "Nowhere" in failed.stdout
    log = home / "data" / "logs" / "mcp" / "calls.jsonl"
    assert stat.S_IMODE(log.stat().st_mode) == 0o600 and "Asia/Tokyo" in log.read_text()
