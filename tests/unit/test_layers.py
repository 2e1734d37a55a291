"""The layering of ARCHITECTURE.md, checked by import-linter (contracts in pyproject.toml):
the contracts hold, each one breaks when an import it forbids is added, and the engine's
layers name every room in engine/."""

import logging
import os
import shutil
import subprocess
import sys
import tomllib

import pytest

from support import ROOT

CONTRACTS = {c["name"]: c for c in tomllib.loads((ROOT / "pyproject.toml").read_text())
             ["tool"]["importlinter"]["contracts"]}

# One import each contract forbids: (the contract's name starts with, file, line added).
VIOLATIONS = [
    ("ui -> app -> engine", "app/paths.py", "import ui.tasks"),
    ("the UI talks to the engine", "ui/tasks.py", "import engine.errors"),
    ("the UI never loads llama.cpp", "app/client.py", "import engine.llama.runtime"),
    ("the engine knows no Qt", "engine/metrics.py", "import PySide6"),
    ("the window's shell over its wings", "ui/chat/composer.py", "from ..models import model_bar"),
    ("the domain plans without llama.cpp", "engine/catalog/fingerprint.py", "import llama_cpp"),
    ("machine and conversation load no llama.cpp", "engine/conversation/conversation.py",
     "from ..llama import grammar"),
    ("routes go through the Engine", "engine/api/admin/admin_routes.py",
     "from ...fleet import Fleet"),
    ("the API's server over its wings", "engine/api/admin/hub_routes.py",
     "from ..wire_formats import openai_routes"),
    ("the server mounts the wire formats in one place", "engine/api/server/front_door.py",
     "from ..wire_formats import anthropic_routes"),
    ("inside the engine", "engine/model/loader.py", "from ..batching import lane"),
]


def test_import_contracts_hold(monkeypatch, capsys):
    from importlinter.cli import lint_imports

    monkeypatch.chdir(ROOT)
    loggers = [log for log in logging.root.manager.loggerDict.values()
               if isinstance(log, logging.Logger) and not log.disabled]
    try:
        code = lint_imports(config_filename=os.fspath(ROOT / "pyproject.toml"), no_cache=True)
    finally:  # its logging setup disables every logger that exists (dictConfig's default)
        for log in loggers:
            log.disabled = False
    assert code == 0, capsys.readouterr().out


def test_every_contract_has_a_violation_here():
    assert sorted(CONTRACTS) == sorted(next(name for name in CONTRACTS if name.startswith(start))
                                       for start, _, _ in VIOLATIONS)


@pytest.mark.parametrize("start, path, line", VIOLATIONS, ids=[v[0] for v in VIOLATIONS])
def test_a_forbidden_import_breaks_its_contract(tmp_path, start, path, line):
    """On a copy of the project with one import added: that contract is broken."""
    for package in ("engine", "app", "ui"):
        shutil.copytree(ROOT / package, tmp_path / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    with (tmp_path / path).open("a") as module:
        module.write(f"\n{line}\n")
    done = subprocess.run([sys.executable, "-c", "import sys; from importlinter.cli import "
                           "lint_imports; sys.exit(lint_imports(no_cache=True))"],
                          cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(tmp_path)),
                          capture_output=True, text=True, timeout=300)
    name = next(name for name in CONTRACTS if name.startswith(start))
    verdicts = " ".join(done.stdout.split())  # long names wrap
    assert done.returncode == 1 and f"{' '.join(name.split())} BROKEN" in verdicts, done.stdout


def test_the_engine_layers_name_every_room():
    layers = CONTRACTS["inside the engine, every room over the rooms below it"]["layers"]
    named = {room.strip() for layer in layers for room in layer.replace(":", "|").split("|")}
    rooms = {f"engine.{p.stem}" for p in (ROOT / "engine").glob("*.py") if p.stem != "__init__"}
    rooms |= {f"engine.{p.parent.name}" for p in (ROOT / "engine").glob("*/__init__.py")}
    assert named == rooms


def test_the_ui_layers_name_every_wing_and_floor_module():
    layers = CONTRACTS["the window's shell over its wings, the wings over the floor they "
                       "share"]["layers"]
    named = {room.strip() for layer in layers for room in layer.split("|")}
    ui = ROOT / "ui"
    found = {f"ui.{p.stem}" for p in ui.glob("*.py") if p.stem != "__init__"}
    found |= {f"ui.{p.parent.name}" for p in ui.glob("*/__init__.py")}
    assert named == found


def test_the_api_layers_name_every_wing_and_module():
    layers = CONTRACTS["the API's server over its wings, the wings over the floor they "
                       "share"]["layers"]
    named = {m.strip() for layer in layers for m in layer.replace(":", "|").split("|")}
    api = ROOT / "engine" / "api"
    found = {f"engine.api.{p.stem}" for p in api.glob("*.py") if p.stem != "__init__"}
    found |= {f"engine.api.{p.parent.name}" for p in api.glob("*/__init__.py")}
    assert named == found


def test_the_pure_tests_and_the_fixtures_load_no_llama_cpp_and_no_qt():
    """The unit tests, conftest and support/ import neither llama.cpp nor Qt: the quick
    loop loads them only for the tests that use them."""
    units = sorted(p.stem for p in (ROOT / "tests" / "unit").glob("test_*.py"))
    code = ("import importlib, sys\n"
            "import conftest, support.engines, support.models, support.hub_server\n"
            f"for name in {units!r}:\n    importlib.import_module(name)\n"
            "print(sorted(m for m in ('llama_cpp', 'PySide6') if m in sys.modules))")
    path = os.pathsep.join(str(ROOT / p) for p in ("tests/unit", "tests", "packaging", "."))
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, PYTHONPATH=path))
    assert done.stdout.strip().splitlines()[-1:] == ["[]"], done.stdout + done.stderr
