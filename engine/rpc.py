"""llama.cpp's RPC backend through ctypes (llama-cpp-python binds none of it): a worker
serves this machine's CPU as a device to one remote llama.cpp at a time, and a client
adds such a worker, whose device then appears in the ggml registry before the GPUs
(so in `probe.probe()` and in llama.cpp's own device list)."""

from __future__ import annotations

import ctypes
from pathlib import Path


def _libs():
    from .native import library

    ggml, rpc = library("ggml"), library("ggml-rpc")
    rpc.ggml_backend_rpc_add_server.restype = ctypes.c_void_p
    rpc.ggml_backend_rpc_add_server.argtypes = [ctypes.c_char_p]
    rpc.ggml_backend_rpc_start_server.argtypes = [
        ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t,
        ctypes.POINTER(ctypes.c_void_p)]
    ggml.ggml_backend_register.argtypes = [ctypes.c_void_p]
    ggml.ggml_backend_dev_by_type.restype = ctypes.c_void_p
    ggml.ggml_backend_dev_by_type.argtypes = [ctypes.c_int]
    return ggml, rpc


def add_worker(endpoint: str) -> None:
    """Make the worker at host:port a device of this process (before loading a model)."""
    ggml, rpc = _libs()
    registry = rpc.ggml_backend_rpc_add_server(endpoint.encode())
    if not registry:
        raise ConnectionError(f"no llama.cpp RPC worker answers at {endpoint}")
    ggml.ggml_backend_register(registry)


def serve_cpu(endpoint: str, threads: int, cache_dir: Path | None = None) -> None:
    """Serve this machine's CPU device at host:port; blocks for the process's life."""
    ggml, rpc = _libs()
    devices = (ctypes.c_void_p * 1)(ggml.ggml_backend_dev_by_type(0))  # the CPU
    rpc.ggml_backend_rpc_start_server(endpoint.encode(),
                                      str(cache_dir).encode() if cache_dir else None,
                                      threads, 1, devices)
