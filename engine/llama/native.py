"""llama.cpp's native libraries, found in one place: llama-cpp-python's `lib` folder, in
a virtual environment or inside the packaged app (.so on Linux, .dylib on macOS, .dll on
Windows). For the parts llama-cpp-python does not bind: loading the backends, the ggml
device registry and the RPC backend (through ctypes), and the build's identity.

Two kinds of build land there. One compiled for this machine links its CPU backend into
libggml. The packaged app's is portable (packaging/portable_llama.py): every backend is a
module of its own, the CPU one in several variants, one per instruction-set level; they
are loaded from that folder before anything else touches llama.cpp, the best variant this
CPU can run first (`ggml_backend_load_all_from_path`), or the one HOMERACK_CPU_VARIANT
names. Its GPU modules load where their driver is (the CUDA module also needs its runtime,
fetched once: cuda_runtime.py, loaded first from the folder HOMERACK_CUDA_RUNTIME names);
one that does not load is no error, only a line saying why (`Backends.refused`).
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import llama_cpp

from ..errors import BackendLoadFailed
from .cuda_runtime import CUDA_RUNTIME_ENV, Fetching, Runtime, driver_present

LIB_DIR = Path(llama_cpp.__file__).parent / "lib"
CPU_VARIANT_ENV = "HOMERACK_CPU_VARIANT"


def _names(name: str) -> list[str]:
    if sys.platform == "win32":
        return [f"{name}.dll", f"lib{name}.dll"]
    if sys.platform == "darwin":
        return [f"lib{name}.dylib", f"lib{name}.so"]
    return [f"lib{name}.so"]


def library_file(name: str) -> Path:
    """The file of library `name` ("llama", "ggml", "ggml-rpc"). On Linux the one named
    by its SONAME when there is one (libggml.so.0): what libllama loads. A copy under
    another name would be a second instance of the library, with a backend registry of
    its own that llama.cpp never sees."""
    candidates = _names(name)
    if sys.platform.startswith("linux"):
        candidates = sorted(p.name for p in LIB_DIR.glob(f"lib{name}.so.*"))[:1] + candidates
    for candidate in candidates:
        if (LIB_DIR / candidate).exists():
            return LIB_DIR / candidate
    raise FileNotFoundError(f"llama-cpp-python ships no {_names(name)[0]} in {LIB_DIR} "
                            "(rebuild it: make setup)")


def backend_modules() -> dict[str, Path]:
    """The backend modules of a portable build, by name ("cpu-haswell", "rpc", ...);
    empty for a build that links its backends into libggml."""
    prefix, suffix = ("ggml-", ".dll") if sys.platform == "win32" else ("libggml-", ".so")
    modules = {path.name.removeprefix(prefix).removesuffix(suffix): path
               for path in LIB_DIR.glob(f"{prefix}*{suffix}")}
    modules.pop("base", None)  # linked by every other library, not a backend
    return modules if any(name.startswith("cpu-") for name in modules) else {}


@dataclass(frozen=True)
class Backends:
    """What was loaded: for a portable build, the CPU variant chosen and those there
    were (variant -> its score on this CPU; 0: this CPU cannot run it)."""
    portable: bool
    cpu_variant: str | None = None
    forced: bool = False
    scores: tuple[tuple[str, int], ...] = ()
    refused: tuple[str, ...] = ()  # a line for each GPU module that did not load, and why

    def describe(self) -> str:
        if not self.portable:
            return "compiled for this machine (linked in)"
        runnable = sum(1 for _name, score in self.scores if score > 0)
        how = f"forced by {CPU_VARIANT_ENV}" if self.forced else "the best this CPU runs"
        return (f"{self.cpu_variant} ({how}; portable build, {runnable} of "
                f"{len(self.scores)} variants run here)")


def _score(path: Path) -> int:
    """The variant's own verdict on this CPU (its ggml_backend_score; 0: cannot run),
    asked as ggml's loader asks it: opened, asked, closed."""
    import _ctypes

    module = ctypes.CDLL(str(path))
    try:
        module.ggml_backend_score.restype = ctypes.c_int
        return module.ggml_backend_score()
    finally:
        (_ctypes.FreeLibrary if sys.platform == "win32" else _ctypes.dlclose)(module._handle)


def cuda_runtime() -> Runtime | None:
    """The runtime the bundle's CUDA module needs, kept where the app says (None: no CUDA
    module, or no folder named)."""
    folder = os.environ.get(CUDA_RUNTIME_ENV)
    return Runtime.beside(LIB_DIR, Path(folder)) if folder else None


def fetch_cuda_runtime() -> Fetching | None:
    """The CUDA runtime's fetch, started where this build has the CUDA module, NVIDIA's
    driver is there and the runtime is not (None: nothing to fetch)."""
    runtime = cuda_runtime()
    if runtime is None or runtime.ready() or not driver_present():
        return None
    return Fetching(runtime)


def registered(ggml) -> tuple[str, ...]:
    """The backends ggml registered, by name ("CPU", "CUDA", "Vulkan", "RPC"), in order."""
    ggml.ggml_backend_reg_count.restype = ctypes.c_size_t
    ggml.ggml_backend_reg_get.restype = ctypes.c_void_p
    ggml.ggml_backend_reg_get.argtypes = [ctypes.c_size_t]
    ggml.ggml_backend_reg_name.restype = ctypes.c_char_p
    ggml.ggml_backend_reg_name.argtypes = [ctypes.c_void_p]
    return tuple(ggml.ggml_backend_reg_name(ggml.ggml_backend_reg_get(i)).decode()
                 for i in range(ggml.ggml_backend_reg_count()))


def _refused(ggml, modules: dict[str, Path]) -> tuple[str, ...]:
    """Why each GPU module ggml did not register stayed out."""
    loaded = {name.lower() for name in registered(ggml)}
    lines = []
    for name in sorted(set(modules) - loaded):
        if name.startswith("cpu-") or name == "rpc":
            continue
        lines.append(f"llama.cpp's {name.upper() if name == 'cuda' else name.title()} "
                     f"module not loaded: {_why_not(name)}")
    return tuple(lines)


def _why_not(module: str) -> str:
    if module == "cuda":
        if not driver_present():
            return "no NVIDIA driver (libcuda.so.1)"
        runtime = cuda_runtime()
        if runtime and not runtime.ready():
            return (f"NVIDIA's CUDA runtime is not fetched yet ({runtime.size / 1e6:,.0f} MB: "
                    "homerack gpu-runtime fetches it)")
    if module == "vulkan":
        try:
            ctypes.CDLL("libvulkan.so.1")
        except OSError:
            return "no Vulkan loader (libvulkan.so.1: apt install libvulkan1)"
    return "it did not load (the engine's log says why)"


@functools.cache
def backends() -> Backends:
    """Loads the backends of a portable build once, before llama.cpp is first used."""
    modules = backend_modules()
    if not modules:
        if os.environ.get(CPU_VARIANT_ENV):
            raise BackendLoadFailed(f"{CPU_VARIANT_ENV} needs the portable build of the "
                                    f"packaged app; {LIB_DIR} holds one compiled for this machine")
        return Backends(portable=False)
    ggml = ctypes.CDLL(str(library_file("ggml")))
    ggml.ggml_backend_load.restype = ctypes.c_void_p
    ggml.ggml_backend_load.argtypes = [ctypes.c_char_p]
    ggml.ggml_backend_load_all_from_path.argtypes = [ctypes.c_char_p]
    variants = {name.removeprefix("cpu-"): path for name, path in modules.items()
                if name.startswith("cpu-")}
    scores = {name: _score(path) for name, path in sorted(variants.items())}
    forced = os.environ.get(CPU_VARIANT_ENV, "").strip()
    if (runtime := cuda_runtime()) and "cuda" in modules:
        runtime.preload()
    if not forced:
        ggml.ggml_backend_load_all_from_path(str(LIB_DIR).encode())
        best = max(scores, key=scores.get) if scores else None
        return Backends(True, best, False, tuple(scores.items()), _refused(ggml, modules))
    if forced not in variants:
        raise BackendLoadFailed(f"{CPU_VARIANT_ENV}={forced}: no such CPU variant "
                                f"(there are: {', '.join(sorted(variants))})")
    if not scores[forced]:
        raise BackendLoadFailed(f"{CPU_VARIANT_ENV}={forced}: this CPU lacks the "
                                "instructions that variant is compiled for")
    for name, path in modules.items():  # the chosen CPU variant, and every other backend
        if not name.startswith("cpu-") or name == f"cpu-{forced}":
            ggml.ggml_backend_load(str(path).encode())
    return Backends(True, forced, True, tuple(scores.items()), _refused(ggml, modules))


def init() -> None:
    """Backends loaded, then llama.cpp's own initialisation (idempotent)."""
    backends()
    llama_cpp.llama_backend_init()


@functools.cache
def library(name: str) -> ctypes.CDLL:
    """Library `name`, loaded once (llama.cpp's backends are initialised first)."""
    init()
    return ctypes.CDLL(str(library_file(name)))


def die_with_parent() -> None:
    """Linux: this process gets SIGKILL when its parent dies (a worker's RPC server, a
    supervised engine), so none outlives the process that serves or supervises it."""
    if sys.platform.startswith("linux"):
        import signal

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
