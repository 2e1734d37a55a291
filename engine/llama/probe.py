"""Reading the machine: the devices of the ggml backend registry in the shipped
libraries (through ctypes: llama-cpp-python does not bind them), plus system memory and
cores from psutil, into a frozen `Hardware` (hardware.py)."""

from __future__ import annotations

import ctypes
import os

import psutil

from ..machine.bandwidth import gpu_speed, ram_bandwidth
from ..catalog.shape import EXPERT_TENSORS
from ..machine.hardware import KINDS, Device, Hardware, one_backend_per_gpu


class DeviceProps(ctypes.Structure):
    """ggml's struct ggml_backend_dev_props (ggml-backend.h), read for `device_id`: the
    PCI bus id that tells one GPU seen by two backends."""
    _fields_ = [("name", ctypes.c_char_p), ("description", ctypes.c_char_p),
                ("memory_free", ctypes.c_size_t), ("memory_total", ctypes.c_size_t),
                ("type", ctypes.c_int), ("device_id", ctypes.c_char_p),
                ("caps", ctypes.c_bool * 5)]


def registry_lib():
    from .native import library

    lib = library("ggml")
    lib.ggml_backend_dev_count.restype = ctypes.c_size_t
    lib.ggml_backend_dev_get.restype = ctypes.c_void_p
    lib.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
    for name in ("name", "description"):
        function = getattr(lib, f"ggml_backend_dev_{name}")
        function.restype, function.argtypes = ctypes.c_char_p, [ctypes.c_void_p]
    lib.ggml_backend_dev_type.restype = ctypes.c_int
    lib.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_dev_memory.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t),
                                            ctypes.POINTER(ctypes.c_size_t)]
    lib.ggml_backend_dev_get_props.argtypes = [ctypes.c_void_p, ctypes.POINTER(DeviceProps)]
    lib.ggml_backend_dev_by_type.restype = ctypes.c_void_p
    lib.ggml_backend_dev_by_type.argtypes = [ctypes.c_int]
    lib.ggml_backend_dev_buffer_type.restype = ctypes.c_void_p
    lib.ggml_backend_dev_buffer_type.argtypes = [ctypes.c_void_p]
    return lib


NOT_GPU_BACKENDS = {"CPU", "RPC", "BLAS"}


def gpu_backends(lib=None) -> tuple[str, ...]:
    """The GPU backends llama.cpp registered (CUDA, Vulkan, Metal...), with or without a
    device."""
    from .native import registered

    return tuple(n for n in registered(lib or registry_lib()) if n not in NOT_GPU_BACKENDS)


def device_handles(lib=None):
    """(name, handle) of every device in the ggml registry, in its order."""
    lib = lib or registry_lib()
    for index in range(lib.ggml_backend_dev_count()):
        handle = lib.ggml_backend_dev_get(index)
        yield lib.ggml_backend_dev_name(handle).decode(), handle


def probe() -> Hardware:
    import llama_cpp

    from .native import backends

    lib = registry_lib()
    devices = []
    for name, handle in device_handles(lib):
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        lib.ggml_backend_dev_memory(handle, ctypes.byref(free), ctypes.byref(total))
        code = lib.ggml_backend_dev_type(handle)
        kind = KINDS[code] if 0 <= code < len(KINDS) else str(code)
        description = lib.ggml_backend_dev_description(handle).decode()
        local_gpu = kind in ("gpu", "igpu") and not name.startswith("RPC")
        speed = gpu_speed(description) if local_gpu else (0.0, 0.0)
        props = DeviceProps()
        lib.ggml_backend_dev_get_props(handle, ctypes.byref(props))
        gpu_id = (props.device_id or b"").decode() if local_gpu else ""
        devices.append(Device(name, description, kind, free.value, total.value, *speed,
                              gpu_id=gpu_id))
    devices, same_gpu = one_backend_per_gpu(tuple(devices))
    memory = psutil.virtual_memory()
    features = llama_cpp.llama_print_system_info().decode()
    cores = psutil.cpu_count(logical=False) or os.cpu_count() or 1
    return Hardware(devices, memory.total, memory.available, cores,
                    cpu_repack="REPACK = 1" in features and "AVX2 = 1" in features,
                    cpu_backend=backends().describe(), ram_bandwidth=ram_bandwidth(cores),
                    gpu_backends=gpu_backends(lib), same_gpu=same_gpu,
                    gpu_modules_refused=backends().refused)


def _handles(names, lib=None) -> list:
    """The ggml devices with these names, in this order."""
    handles = dict(device_handles(lib))
    missing = [name for name in names if name not in handles]
    if missing:
        raise LookupError(f"no such device: {', '.join(missing)}")
    return [handles[name] for name in names]


def device_array(names: tuple[str, ...]):
    """The ggml devices with these names as the NULL-terminated array llama.cpp takes
    (llama_model_params.devices): explicit, in the planner's order."""
    return (ctypes.c_void_p * (len(names) + 1))(*_handles(names), None)


class BufferOverride(ctypes.Structure):
    """llama.cpp's llama_model_tensor_buft_override: tensors whose name matches `pattern`
    (std::regex_search) go to buffer type `buft`, as `-ot` does."""
    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


def experts_on(device: str, layers: int):
    """The NULL-terminated override array that puts the routed experts of layers
    0..layers-1 in `device`'s buffer, whichever device holds the rest of each layer: the
    CPU (llama.cpp's --n-cpu-moe), or a worker's (RPC0: `-ot exps=RPC0`), which then
    computes them."""
    lib = registry_lib()
    buffer = lib.ggml_backend_dev_buffer_type(_handles([device], lib)[0])
    pattern = rf"^blk\.({'|'.join(map(str, range(layers)))})\.{EXPERT_TENSORS}".encode()
    return (BufferOverride * 2)(BufferOverride(pattern, buffer), BufferOverride(None, None))
