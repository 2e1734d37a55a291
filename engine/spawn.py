"""How this installation starts one of its modules in a child process (the engine, an
RPC server, a worker): `python -m MODULE` from a source tree or a virtual environment;
in the packaged app, whose executable is no Python, the app itself, which takes the same
`-m MODULE ARGS` (packaging/homerack_entry.py) before it imports anything else."""

from __future__ import annotations

import sys


def frozen() -> bool:
    """True inside the packaged app (PyInstaller sets sys.frozen)."""
    return bool(getattr(sys, "frozen", False))


def module_command(module: str, *args: str) -> list[str]:
    """The argv that runs `module` as __main__ with `args`, in a child of this process."""
    return [sys.executable, "-m", module, *args]
