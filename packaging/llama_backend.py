"""Build and install llama-cpp-python for this machine's accelerator.

Run with the Python of the target virtual environment (the Makefile does):

    .venv/bin/python packaging/llama_backend.py

The backend is chosen from what the machine has (HOMERACK_BACKEND=cpu|cuda|metal|vulkan
overrides it). RPC support is always built in: the LAN cluster depends on it. The built
wheel is kept in a cache keyed by version and CMake flags, and the install is skipped
when the environment already holds a build with the same flags, so re-runs are instant.
Only the standard library is used: this runs before anything else is installed.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

VERSION = "0.3.36"
PACKAGE = "llama-cpp-python"
STAMP = Path(sys.prefix) / ".homerack-llama.json"


def _nvcc() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    default = Path("/usr/local/cuda/bin/nvcc")
    return str(default) if default.exists() else None


def _has_nvidia_gpu() -> bool:
    if Path("/proc/driver/nvidia/gpus").is_dir() and any(Path("/proc/driver/nvidia/gpus").iterdir()):
        return True
    smi = shutil.which("nvidia-smi")
    if not smi:
        return False
    result = subprocess.run([smi, "-L"], capture_output=True, text=True)
    return result.returncode == 0 and "GPU" in result.stdout


def _has_vulkan_sdk() -> bool:
    return bool(os.environ.get("VULKAN_SDK")) and shutil.which("glslc") is not None


def choose_backend() -> tuple[str, str]:
    """Return (backend, why)."""
    forced = os.environ.get("HOMERACK_BACKEND", "").strip().lower()
    if forced:
        return forced, "HOMERACK_BACKEND is set"
    if platform.system() == "Darwin":
        return "metal", "macOS"
    if _nvcc():
        if _has_nvidia_gpu():
            return "cuda", "nvcc and an NVIDIA GPU are present"
        # A CUDA build takes over an hour on small machines and is useless without a GPU.
        return "cpu", "nvcc is present but no NVIDIA GPU was found"
    if _has_vulkan_sdk():
        return "vulkan", "the Vulkan SDK is present"
    return "cpu", "no GPU toolkit found"


def cmake_args(backend: str) -> str:
    flags = ["-DGGML_RPC=ON"]
    if backend == "cuda":
        flags += ["-DGGML_CUDA=on"]
        arch = os.environ.get("CMAKE_CUDA_ARCHITECTURES")
        if arch:
            flags += [f"-DCMAKE_CUDA_ARCHITECTURES={arch}"]
    elif backend == "metal":
        flags += ["-DGGML_METAL=on"]
    elif backend == "vulkan":
        flags += ["-DGGML_VULKAN=on"]
    elif backend != "cpu":
        raise SystemExit(f"unknown backend {backend!r}: use cpu, cuda, metal or vulkan")
    return " ".join(flags)


def _wanted(args: str) -> dict:
    return {"version": VERSION, "cmake_args": args, "python": sys.version.split()[0]}


def _installed_matches(wanted: dict) -> bool:
    try:
        if json.loads(STAMP.read_text()) != wanted:
            return False
    except (OSError, ValueError):
        return False
    probe = subprocess.run(
        [sys.executable, "-c", "import llama_cpp; print(llama_cpp.__version__)"],
        capture_output=True, text=True,
    )
    return probe.returncode == 0 and probe.stdout.strip() == VERSION


def _cache_dir(args: str) -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    key = hashlib.sha256(f"{VERSION} {args} {platform.machine()}".encode()).hexdigest()[:16]
    return base / "homerack" / "wheels" / f"{VERSION}-{key}"


def _build_wheel(args: str, into: Path) -> Path:
    into.mkdir(parents=True, exist_ok=True)
    wheels = sorted(into.glob("llama_cpp_python-*.whl"))
    if wheels:
        return wheels[-1]
    print(f"building {PACKAGE} {VERSION} with CMAKE_ARGS='{args}' (about 11 minutes on 2 cores)...",
          flush=True)
    env = dict(os.environ, CMAKE_ARGS=args)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-cache-dir",
         "--no-binary", PACKAGE, "-w", str(into), f"{PACKAGE}=={VERSION}"],
        env=env, check=True,
    )
    return sorted(into.glob("llama_cpp_python-*.whl"))[-1]


def main() -> int:
    backend, why = choose_backend()
    args = cmake_args(backend)
    print(f"llama.cpp backend: {backend} ({why}); CMAKE_ARGS='{args}'", flush=True)
    wanted = _wanted(args)
    if _installed_matches(wanted):
        print(f"{PACKAGE} {VERSION} already installed with these flags", flush=True)
        return 0
    wheel = _build_wheel(args, _cache_dir(args))
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--force-reinstall", str(wheel)],
        check=True,
    )
    STAMP.write_text(json.dumps(wanted))
    print(f"installed {wheel.name}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
