"""llama.cpp's RPC backend through ctypes (llama-cpp-python binds none of it): a worker
serves this machine's devices to one remote llama.cpp at a time, and a client
adds such a worker, whose device then appears in the ggml registry before the GPUs
(so in `probe.probe()` and in llama.cpp's own device list)."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

from .probe import registry_lib, device_handles


def _libs():
    from .native import library

    ggml, rpc = registry_lib(), library("ggml-rpc")
    rpc.ggml_backend_rpc_add_server.restype = ctypes.c_void_p
    rpc.ggml_backend_rpc_add_server.argtypes = [ctypes.c_char_p]
    rpc.ggml_backend_rpc_start_server.argtypes = [
        ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t,
        ctypes.POINTER(ctypes.c_void_p)]
    ggml.ggml_backend_register.argtypes = [ctypes.c_void_p]
    return ggml, rpc


RPC_NICE = 5
_devices: dict[str, list[str]] = {}  # endpoint -> its devices' names here, in its order


def add_worker(endpoint: str) -> list[str]:
    """Make the worker at host:port a device of this process (before loading a model);
    returns the names its devices have here (RPC0, RPC1, ...)."""
    ggml, rpc = _libs()
    registry = rpc.ggml_backend_rpc_add_server(endpoint.encode())
    if not registry:
        raise ConnectionError(f"no llama.cpp RPC worker answers at {endpoint}")
    ggml.ggml_backend_register(registry)
    lib = registry_lib()
    _devices[endpoint] = [
        name for name, handle in device_handles(lib)
        if name.startswith("RPC") and lib.ggml_backend_dev_description(handle).decode() == endpoint]
    return _devices[endpoint]


def device_of_buffer(name: str) -> str:
    """The device here of an RPC buffer type named by llama.cpp "RPC<i>[host:port]" (i
    counts the worker's own devices, so two workers both have an RPC0 buffer)."""
    index, _, endpoint = name.partition("[")
    names = _devices.get(endpoint.rstrip("]"), [])
    remote = int(index.removeprefix("RPC") or 0)
    return names[remote] if remote < len(names) else index


def serve(endpoint: str, threads: int, cache_dir: Path | None = None) -> None:
    """Serve every device of this machine (CPU and GPUs) at host:port, with the local
    tensor cache in `cache_dir` (a second load of the same weights sends only hashes);
    blocks for the process's life."""
    _ggml, rpc = _libs()
    local = [handle for name, handle in device_handles() if not name.startswith("RPC")]
    devices = (ctypes.c_void_p * len(local))(*local)
    rpc.ggml_backend_rpc_start_server(endpoint.encode(),
                                      str(cache_dir).encode() if cache_dir else None,
                                      threads, len(local), devices)


if __name__ == "__main__":  # the worker's RPC server process: ENDPOINT THREADS [CACHE]
    import sys

    from .native import die_with_parent

    die_with_parent()
    if hasattr(os, "nice"):
        # Below the worker's gateway, which relays every RPC message: when the compute
        # threads finish (and spin) the gateway must get a core at once to pass the result
        # on (bench/cluster.py: +10% per token at the same priority, within noise at +5).
        # It also keeps a shared machine responsive to its owner.
        os.nice(RPC_NICE)
    serve(sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]) if len(sys.argv) > 3 else None)
