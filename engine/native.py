"""llama.cpp's native libraries as llama-cpp-python ships them (libllama, libggml,
libggml-rpc), found with the platform's names (.so on Linux, .dylib on macOS, .dll on
Windows) in one place. For the parts llama-cpp-python does not bind: the ggml device
registry and the RPC backend (through ctypes), and the build's identity."""

from __future__ import annotations

import ctypes
import functools
import sys
from pathlib import Path

import llama_cpp

LIB_DIR = Path(llama_cpp.__file__).parent / "lib"


def library_file(name: str) -> Path:
    """The file of library `name` ("llama", "ggml", "ggml-rpc")."""
    if sys.platform == "win32":
        candidates = [f"{name}.dll", f"lib{name}.dll"]
    elif sys.platform == "darwin":
        candidates = [f"lib{name}.dylib", f"lib{name}.so"]
    else:
        candidates = [f"lib{name}.so"]
    for candidate in candidates:
        if (LIB_DIR / candidate).exists():
            return LIB_DIR / candidate
    raise FileNotFoundError(f"llama-cpp-python ships no {candidates[0]} in {LIB_DIR} "
                            "(rebuild it: make setup)")


@functools.cache
def library(name: str) -> ctypes.CDLL:
    """Library `name`, loaded once (llama.cpp's backends are initialised first)."""
    llama_cpp.llama_backend_init()
    return ctypes.CDLL(str(library_file(name)))


def die_with_parent() -> None:
    """Linux: this process gets SIGKILL when its parent dies (a worker's RPC server, a
    supervised engine), so none outlives the process that serves or supervises it."""
    if sys.platform.startswith("linux"):
        import signal

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
