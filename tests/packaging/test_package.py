"""The packaged app's pieces that run from a source tree too: the executable's entry
(engine mode before Qt), the starter models linked from a bundle, the native loader's
account of its build, and the self-test that `make package-test` runs on the bundle.
The bundle itself is built and run by `make package-test` (packaging/package_test.py):
it needs the portable llama.cpp build, about 8 minutes, kept out of `make test`."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from support import ROOT
from support.models import STARTER

ENTRY = ROOT / "packaging" / "homerack_entry.py"


def python(code: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, text=True,
                          capture_output=True, timeout=120, env=env)


def test_the_executable_runs_a_module_as_python_m_does_without_qt():
    """`homerack -m MODULE ARGS` is how the packaged app starts its engine, worker and RPC
    server (its executable is no Python): the module runs as __main__ with its own argv,
    and Qt is never imported on the way."""
    done = python(f"""
import sys
sys.path.insert(0, {str(ENTRY.parent)!r})
import homerack_entry
sys.argv = ["homerack", "-m", "app", "serve", "--help"]
try:
    homerack_entry.main()
except SystemExit as exc:
    print("exit", exc.code)
print("qt imported" if "PySide6" in sys.modules else "no qt")
""")
    assert done.returncode == 0, done.stderr
    assert "--response-cache-mib" in done.stdout  # serve's own help: argv was passed on
    assert "exit 0" in done.stdout and "no qt" in done.stdout


def test_the_executable_is_the_command_line_without_m():
    done = subprocess.run([sys.executable, str(ENTRY), "--help"], cwd=ROOT, text=True,
                          capture_output=True, timeout=60)
    assert done.returncode == 0 and "self-test" in done.stdout


def test_bundled_starters_are_linked_not_copied_and_relinked_when_the_app_moves(
        tmp_path, starters_dir, monkeypatch):
    import json

    import engine.catalog.gguf_file
    from engine.catalog.gguf_file import GGUFInspector
    from engine.catalog.models import BUNDLED_RECORDS, STARTERS, ModelStore

    bundle = tmp_path / "bundle" / "models"
    bundle.mkdir(parents=True)
    for starter in STARTERS:
        (bundle / f"{starter.id}.gguf").symlink_to(starters_dir / f"{starter.id}.gguf")
    build = GGUFInspector()  # what package.py ships beside them
    (bundle / BUNDLED_RECORDS).write_text(json.dumps({
        path.name: {"size": path.stat().st_size, "record": build.record(path)}
        for path in bundle.glob("*.gguf")}))

    def no_parsing(path):
        raise AssertionError(f"{path} parsed at first launch")

    monkeypatch.setattr(engine.catalog.gguf_file, "_parse", no_parsing)
    folder = tmp_path / "user-models"
    store = ModelStore(folder, GGUFInspector(), bundled=bundle)
    installed = store.install_starters(log=lambda _m: None)
    kinds = {m.id: store.kind_of(m, wait=False) for m in store.list()}
    assert kinds == {s.id: ("embedding" if "minilm" in s.id else "chat") for s in STARTERS}
    assert store.inspector.inspect(folder / f"{STARTER}.gguf").path == str(folder / f"{STARTER}.gguf")
    monkeypatch.undo()
    assert {m.id for m in installed} == {s.id for s in STARTERS}
    for model in installed:
        assert model.path.is_symlink() and model.path.resolve() == \
            (starters_dir / model.path.name).resolve()
    assert store.resolve(STARTER).size_bytes > 50 << 20
    moved = tmp_path / "moved" / "models"  # the unpacked folder moved: the links dangle
    moved.parent.mkdir()
    bundle.rename(moved)
    store = ModelStore(folder, GGUFInspector(), bundled=moved)
    assert store.list() == []
    store.install_starters(log=lambda _m: None)
    assert os.readlink(folder / f"{STARTER}.gguf") == str(moved / f"{STARTER}.gguf")


def test_a_build_compiled_for_this_machine_says_so_and_refuses_a_cpu_variant(home):
    env = dict(os.environ, HOMERACK_HOME=str(home))
    shown = subprocess.run([sys.executable, "-m", "app", "hardware"], cwd=ROOT, env=env,
                           text=True, capture_output=True, timeout=120)
    assert "llama.cpp CPU backend: compiled for this machine" in shown.stdout
    env["HOMERACK_CPU_VARIANT"] = "x64"
    refused = subprocess.run([sys.executable, "-m", "app", "hardware"], cwd=ROOT, env=env,
                             text=True, capture_output=True, timeout=120)
    assert refused.returncode == 1
    assert "HOMERACK_CPU_VARIANT needs the portable build" in refused.stderr
    assert "Traceback" not in refused.stderr


@pytest.mark.slow
def test_self_test_starts_an_engine_and_answers(home):
    env = dict(os.environ, HOMERACK_HOME=str(home))
    done = subprocess.run([sys.executable, "-m", "app", "self-test"], cwd=ROOT, env=env,
                          text=True, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "llama.cpp CPU backend: compiled for this machine" in done.stdout
    assert f"answer from {STARTER}: 'The capital of France is Paris.'" in done.stdout
    assert "s after launch; self-test passed" in done.stdout


@pytest.mark.slow
def test_self_test_through_the_window_shows_the_starter_ready_and_answers(home, tmp_path):
    env = dict(os.environ, HOMERACK_HOME=str(home), QT_QPA_PLATFORM="offscreen")
    screenshot = tmp_path / "window.png"
    done = subprocess.run([sys.executable, "-m", "app", "self-test", "--gui", str(screenshot)],
                          cwd=ROOT, env=env, text=True, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"window ready to chat with {STARTER}" in done.stdout
    # the window samples with the app's own settings (not greedily): the wording varies
    answered = next(line for line in done.stdout.splitlines() if "the window answered" in line)
    assert "Paris" in answered
    assert screenshot.stat().st_size > 10_000
