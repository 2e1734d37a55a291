"""llama.cpp's backend, started once per process: its native libraries (the best build
for this CPU, llama/native.py) and its log, which is where loads are measured: the
buffer sizes llama.cpp prints are the memory a model really takes, and its allocation
failures say on which device memory ran out."""

from __future__ import annotations

import ctypes
import os
import re
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

import llama_cpp as llama

from .native import init as native_init, library_file
from .rpc import device_of_buffer

_init_lock = threading.Lock()
_initialized = False


def build_id() -> str:
    """Identifies the llama.cpp build, whose state files only it may load."""
    try:
        size = library_file("llama").stat().st_size
    except FileNotFoundError:
        size = 0
    return f"llama-cpp-python {llama.__version__} libllama {size}"


_BUFFER_LINE = re.compile(r"(\S+)\s+(model|KV|compute|output) buffer size =\s+([\d.]+) MiB")
_PROJECTOR_LINE = re.compile(r"load_hparams: model size:\s+([\d.]+) MiB")  # libmtmd's weights
_FLASH_LINE = re.compile(r"Flash Attention (enabled|disabled)")  # auto, as it resolved
_NO_MEMORY_LINE = re.compile(r"(?:failed|unable) to allocate (\S+) buffer")


@dataclass
class LoadLog:
    """What llama.cpp's log said while one model loaded."""
    buffers: list[tuple[str, str, int]] = field(default_factory=list)  # (device, kind, bytes)
    no_memory: list[str] = field(default_factory=list)  # devices where an allocation failed
    flash_attn: bool | None = None  # what llama.cpp's "auto" chose for the context

    def totals(self) -> dict[tuple[str, str], int]:
        """Bytes allocated by (device, kind): weights are "model"."""
        out: dict[tuple[str, str], int] = {}
        for device, kind, size in self.buffers:
            out[(device, kind)] = out.get((device, kind), 0) + size
        return out


_listening: LoadLog | None = None
# Loads take turns: the log lines they are measured by come through one callback (two
# lanes of the engine, or the embedding model, may load at the same time).
_load_lock = threading.Lock()


@contextmanager
def measured_load() -> Iterator[LoadLog]:
    """The log of the load done inside the block (one load at a time)."""
    global _listening
    with _load_lock:
        _listening = LoadLog()
        try:
            yield _listening
        finally:
            _listening = None


def _device(name: str) -> str:
    """The ggml device name of a buffer type ("CPU_Mapped" -> "CPU"; an RPC buffer type
    "RPC0[host:port]" -> the name that worker's device has here)."""
    if name.startswith("RPC") and "[" in name:
        return device_of_buffer(name)
    return name.split("[")[0].removesuffix("_Mapped").removesuffix("_REPACK")


@llama.llama_log_callback
def _log(level: int, text: bytes, _user_data) -> None:
    """llama.cpp's log: buffer sizes are recorded (they are the measured memory use);
    everything is printed only when HOMERACK_LLAMA_VERBOSE is set."""
    line = text.decode("utf-8", "replace")
    listening = _listening
    if listening is not None:
        match = _BUFFER_LINE.search(line)
        if match:
            device, kind, mib = match.groups()
            listening.buffers.append((_device(device), kind, int(float(mib) * (1 << 20))))
        elif match := _PROJECTOR_LINE.search(line):  # its device is the projector's own
            listening.buffers.append(("projector", "model", int(float(match[1]) * (1 << 20))))
        elif match := _NO_MEMORY_LINE.search(line):
            listening.no_memory.append(_device(match.group(1)))
        elif match := _FLASH_LINE.search(line):
            listening.flash_attn = match.group(1) == "enabled"
    if os.environ.get("HOMERACK_LLAMA_VERBOSE"):
        sys.stderr.write(line)


def ensure_backend() -> None:
    """Load the native libraries and take over llama.cpp's log, once."""
    global _initialized
    with _init_lock:
        if not _initialized:
            llama.llama_log_set(_log, ctypes.c_void_p(0))  # replaces llama-cpp-python's
            native_init()
            _initialized = True
