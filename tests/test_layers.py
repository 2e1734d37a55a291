"""The layering of DESIGN.md, checked by import-linter (contracts in pyproject.toml)."""

import os

from conftest import ROOT


def test_import_contracts_hold(monkeypatch, capsys):
    from importlinter.cli import lint_imports

    monkeypatch.chdir(ROOT)
    code = lint_imports(config_filename=os.fspath(ROOT / "pyproject.toml"), no_cache=True)
    assert code == 0, capsys.readouterr().out
