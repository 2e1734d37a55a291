"""The layering of DESIGN.md, checked by import-linter (contracts in pyproject.toml)."""

import logging
import os

from support import ROOT


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
