"""Fault injection for the crash-journal tests (docs/planner.md, "Surviving a crash"): an engine
process started with HOMERACK_FAULT=repacked-eval dies as llama.cpp's AMX kernels do
(SIGSEGV on the first evaluation with repacked weights). Nothing happens without it."""

from __future__ import annotations

import os
import signal

_FAULT = os.environ.get("HOMERACK_FAULT", "")


def before_evaluation(repacked: bool) -> None:
    """Called before every llama_decode: dies here when the fault asks for it."""
    if _FAULT == "repacked-eval" and repacked:
        os.kill(os.getpid(), signal.SIGSEGV)
