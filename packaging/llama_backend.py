"""Build and install llama-cpp-python for this machine's accelerator.

Run with the Python of the target virtual environment (the Makefile does):

    .venv/bin/python packaging/llama_backend.py

The backend is chosen from what the machine has (HOMERACK_BACKEND=cpu|cuda|metal|vulkan
overrides it): an NVIDIA driver gets CUDA, from the system's nvcc or else from PyPI, for
the GPUs present only; an AMD or Intel GPU gets Vulkan where its build tools are installed
(gpu_toolchain.py). RPC support is always built in: the LAN cluster depends on it.

The CPU code is compiled for this CPU (-march=native) without known-bad paths: on a CPU
with AMX, llama.cpp's AMX weight repack faults on the first decode (llama.cpp #20824),
so it is compiled out unless HOMERACK_AMX=on. Every installed build is proven first by
llama_smoke.py in a child process; a build that dies or computes garbage is replaced by
a portable one (GGML_NATIVE=OFF, only the instruction sets every CPU of this kind has
that ggml uses by default), and if that fails too, setup stops and says why.

Wheels are cached under a key of version, flags and the CPU features they were compiled
for; the stamp in the environment records the same, so a venv or cache that meets a
different CPU (a copied folder, a changed VM type) is rebuilt instead of dying with
SIGILL. Only the standard library is used here (the smoke test needs numpy and gguf).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import gpu_toolchain as gpu

VERSION = "0.3.36"
PACKAGE = "llama-cpp-python"
STAMP = Path(sys.prefix) / ".homerack-llama.json"


def _nvcc() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    default = Path("/usr/local/cuda/bin/nvcc")
    return str(default) if default.exists() else None


def choose_backend() -> tuple[str, str]:
    """Return (backend, why)."""
    forced = os.environ.get("HOMERACK_BACKEND", "").strip().lower()
    if forced:
        return forced, "HOMERACK_BACKEND is set"
    if platform.system() == "Darwin":
        return "metal", "macOS"
    nvidia, why_not = gpu.nvidia_gpus(), ""
    if nvidia is not None:
        if _nvcc():
            return "cuda", "nvcc and an NVIDIA GPU are present"
        why_not = nvidia.pypi_cuda_problem() or ""
        if not why_not:
            return "cuda", (f"an NVIDIA GPU (compute {nvidia.architectures}) and its driver, "
                            f"no nvcc: CUDA {gpu.CUDA_RELEASE} from PyPI")
        why_not = f"no CUDA build: {why_not}; "
    elif _nvcc():
        # A CUDA build takes over an hour on small machines and is useless without a GPU.
        return "cpu", "nvcc is present but no NVIDIA GPU was found"
    if os.environ.get("VULKAN_SDK") and shutil.which("glslc"):
        return "vulkan", why_not + "the Vulkan SDK is present"
    vendors = gpu.gpu_vendors() | ({"NVIDIA"} if nvidia is not None else set())
    if not vendors:
        return "cpu", "no GPU found"
    named = " and ".join(sorted(vendors))
    missing = gpu.vulkan_build_tools()
    if missing is None:
        return "vulkan", f"{why_not}an {named} GPU and Vulkan's build tools"
    return "cpu", (f"{why_not}an {named} GPU, but Vulkan's build tools are missing ({missing}): "
                   f"apt install {gpu.VULKAN_PACKAGES} for a GPU build; the CPU meanwhile")


def _cuda_flags() -> list[str]:
    """The CUDA toolkit (the system's, else PyPI's) and the GPUs' architectures."""
    flags = [] if _nvcc() else gpu.cuda_cmake_args(gpu.cuda_root()).split()
    arch = os.environ.get("CMAKE_CUDA_ARCHITECTURES")
    if not arch and (nvidia := gpu.nvidia_gpus()) is not None and nvidia.computes:
        arch = nvidia.architectures
    return flags + ([f"-DCMAKE_CUDA_ARCHITECTURES={arch}"] if arch else [])


def cmake_args(backend: str) -> str:
    flags = ["-DGGML_RPC=ON"]
    if backend == "cuda":
        flags += ["-DGGML_CUDA=on", *_cuda_flags()]
    elif backend == "metal":
        flags += ["-DGGML_METAL=on"]
    elif backend == "vulkan":
        flags += ["-DGGML_VULKAN=on", *gpu.vulkan_cmake_args().split()]
    elif backend != "cpu":
        raise SystemExit(f"unknown backend {backend!r}: use cpu, cuda, metal or vulkan")
    return " ".join(flags)


NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
FAILED = "smoke-failed.txt"  # in a wheel's cache folder: that build failed on this CPU
# x86 instruction sets ggml enables by default in a non-native build, by cpuinfo flag;
# a portable build asks for the ones this CPU has and no others.
PORTABLE_X86 = {"sse4_2": "GGML_SSE42", "avx": "GGML_AVX", "avx2": "GGML_AVX2",
                "fma": "GGML_FMA", "f16c": "GGML_F16C", "bmi2": "GGML_BMI2"}
# cpuinfo flags that name instruction sets a compiler can target (the rest, such as
# "hypervisor" or "constant_tsc", do not change what -march=native emits)
_ISA = re.compile(r"^(sse|ssse|avx|amx|fma|f16c|bmi|popcnt|abm|movbe|aes|vaes|pclmul|vpclmul|"
                  r"gfni|sha|adx|rdrand|rdseed|xsave|cx16|lzcnt)")


def cpu_features() -> tuple[str, ...]:
    """The instruction sets this CPU reports (x86 cpuinfo flags, Arm features)."""
    if platform.system() == "Darwin":
        out = subprocess.run(["sysctl", "hw.optional"], capture_output=True, text=True).stdout
        return tuple(sorted(line.split(":")[0].removeprefix("hw.optional.")
                            for line in out.splitlines() if line.endswith(": 1")))
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ()
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() in ("flags", "Features"):
            flags = value.split()
            if name.strip() == "flags":
                flags = [f for f in flags if _ISA.match(f)]
            return tuple(sorted(set(flags)))
    return ()


@dataclass(frozen=True)
class Build:
    """One way to build llama-cpp-python here, and why."""
    backend: str
    cmake_args: str
    cflags: str  # added to CFLAGS and CXXFLAGS
    portable: bool
    features: tuple[str, ...]  # the CPU it is compiled for
    notes: tuple[str, ...] = ()

    @property
    def variant(self) -> str:
        return "portable" if self.portable else "native"

    def stamp(self) -> dict:
        return {"version": VERSION, "python": sys.version.split()[0], "backend": self.backend,
                "cmake_args": self.cmake_args, "cflags": self.cflags,
                "variant": self.variant, "cpu_features": list(self.features)}

    def describe(self) -> str:
        flags = f", CFLAGS+='{self.cflags}'" if self.cflags else ""
        return f"{self.variant} build, CMAKE_ARGS='{self.cmake_args}'{flags}"


def candidates(backend: str, features: tuple[str, ...]) -> list[Build]:
    """The builds to try in order: for this CPU (without AMX unless asked), then portable."""
    args = cmake_args(backend)
    notes, cflags = [], ""
    amx = [f for f in features if f.startswith("amx")]
    if amx and not _compiler_accepts(NO_AMX):
        notes.append("this CPU has AMX but the C compiler predates it (no -mno-amx-tile): "
                     "it cannot emit llama.cpp's AMX kernels, so nothing is left out")
    elif amx and os.environ.get("HOMERACK_AMX", "").lower() != "on":
        cflags = NO_AMX
        notes.append(f"this CPU has AMX ({' '.join(amx)}): llama.cpp's AMX kernels are left out, "
                     "because they crash on the first decode on such CPUs (llama.cpp #20824); "
                     "AVX-512 and the CPU weight repack stay on. HOMERACK_AMX=on builds them.")
    elif amx:
        notes.append("HOMERACK_AMX=on: llama.cpp's AMX kernels are built (they crash on some "
                     "CPUs; the smoke test checks this one)")
    portable = args + " -DGGML_NATIVE=OFF"
    if platform.machine().lower() in ("x86_64", "amd64"):
        portable += "".join(f" -D{option}={'ON' if flag in features else 'OFF'}"
                            for flag, option in PORTABLE_X86.items())
    return [Build(backend, args, cflags, False, features, tuple(notes)),
            Build(backend, portable, "", True, features)]


def _compiler_accepts(flags: str) -> bool:
    """Whether the C compiler the build will use knows these flags (GCC 11 and Clang 12
    brought the AMX ones; an older one cannot target AMX at all)."""
    compiler = os.environ.get("CC") or shutil.which("cc") or "cc"
    try:
        done = subprocess.run([compiler, *flags.split(), "-E", "-x", "c", os.devnull],
                              capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def _installed(build: Build) -> dict | None:
    """The stamp of the installed build when it is `build` and imports; else None."""
    try:
        stamp = json.loads(STAMP.read_text())
    except (OSError, ValueError):
        return None
    if {k: stamp.get(k) for k in build.stamp()} != build.stamp() or "smoke" not in stamp:
        return None
    probe = subprocess.run(
        [sys.executable, "-c", "import llama_cpp; print(llama_cpp.__version__)"],
        capture_output=True, text=True,
    )
    return stamp if probe.returncode == 0 and probe.stdout.strip() == VERSION else None


def cache_dir(build: Build) -> Path:
    base = gpu.cache_base()
    identity = {**build.stamp(), "python": None, "machine": platform.machine()}
    key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    return base / "homerack" / "wheels" / f"{VERSION}-{key}"


def build_wheel(build: Build, into: Path) -> Path:
    gpu.private_folder(into)
    cached = cached_wheel(into)
    if cached is not None:
        return cached
    if "-DCUDAToolkit_ROOT=" in build.cmake_args:  # CUDA from PyPI, fetched now
        gpu.install_cuda()
    if "-DVulkan_INCLUDE_DIR=" in build.cmake_args:  # newer Vulkan headers, fetched now
        gpu.install_vulkan_headers()
    print(f"building {PACKAGE} {VERSION}: {build.describe()} (about 11 minutes on 2 cores)...",
          flush=True)
    env = dict(compiler_env(build.cflags), CMAKE_ARGS=build.cmake_args)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-cache-dir",
         "--no-binary", PACKAGE, "-w", str(into), f"{PACKAGE}=={VERSION}"],
        env=env, check=True,
    )
    wheel = sorted(into.glob("llama_cpp_python-*.whl"))[-1]
    (into / WHEEL_HASH).write_text(json.dumps({"wheel": wheel.name,
                                               "sha256": gpu.sha256_of(wheel)}))
    return wheel


WHEEL_HASH = "wheel.sha256.json"  # beside a built wheel: its name and sha256, when built


def cached_wheel(into: Path) -> Path | None:
    """The wheel built into `into` before, if it is still the very file built (its
    sha256 recorded then): a cache trusted on presence installed whatever wheel lay there
    into the environment. Anything else there is cleared for a new build."""
    try:
        made = json.loads((into / WHEEL_HASH).read_text())
        wheel = into / made["wheel"]
        if wheel.parent == into and gpu.sha256_of(wheel) == made["sha256"]:
            return wheel
    except (OSError, ValueError, KeyError, TypeError):
        pass
    for stale in into.glob("llama_cpp_python-*.whl"):
        stale.unlink()
    return None


def _preload_cuda(build: Build) -> None:
    """A build against CUDA from PyPI finds its libraries through a .pth line that loads
    them at start (gpu_toolchain.preload_line); other builds have none."""
    pth = Path(sysconfig_purelib()) / "homerack_cuda.pth"
    if "-DCUDAToolkit_ROOT=" in build.cmake_args:
        pth.write_text(gpu.preload_line(gpu.install_cuda()))  # checked again, then named
    else:
        pth.unlink(missing_ok=True)


def sysconfig_purelib() -> str:
    import sysconfig
    return sysconfig.get_paths()["purelib"]


def compiler_env(cflags: str) -> dict:
    """This process's environment with `cflags` added to CFLAGS and CXXFLAGS (CMake reads
    them; the benchmarks' llama.cpp tools are built the same way)."""
    env = dict(os.environ)
    for name in ("CFLAGS", "CXXFLAGS"):
        env[name] = f"{env.get(name, '')} {cflags}".strip()
    return env


def _install(wheel: Path) -> None:
    """Replace the installed build with `wheel`, then add what it needs to run (numpy,
    typing-extensions, ...) without reinstalling what is already there."""
    pip = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check"]
    subprocess.run([*pip, "--no-deps", "--force-reinstall", str(wheel)], check=True)
    subprocess.run([*pip, "-q", str(wheel)], check=True)


def _smoke():
    try:
        from llama_smoke import run_smoke
    except ImportError as exc:
        raise SystemExit(f"the llama.cpp smoke test needs numpy and gguf ({exc}): "
                         "pip install -r packaging/requirements-setup.txt") from None
    return run_smoke()


def smoke_line(smoke: dict, when: str) -> str:
    return f"llama.cpp smoke test: {smoke['summary']} ({when}, {smoke['seconds']:.1f} s)"


def main() -> int:
    backend, why = choose_backend()
    builds = candidates(backend, cpu_features())
    print(f"llama.cpp backend: {backend} ({why})", flush=True)
    for note in builds[0].notes:
        print(note, flush=True)
    for build in builds:
        stamp = _installed(build)
        if stamp:
            print(f"{PACKAGE} {VERSION} already installed ({build.describe()})")
            print(smoke_line(stamp["smoke"], "when it was installed"), flush=True)
            return 0
    failures = []
    for build in builds:
        cache = cache_dir(build)
        if (cache / FAILED).exists():
            before = (cache / FAILED).read_text()
            failures.append(f"{build.variant} build: {before}")
            print(f"skipping the {build.variant} build: it failed its smoke test on this CPU "
                  f"before ({before})", flush=True)
            continue
        wheel = build_wheel(build, cache)
        _install(wheel)
        result = _smoke()
        print(smoke_line(asdict(result), build.variant + " build"), flush=True)
        if result.failed == "environment":  # not the build's fault: another build won't help
            raise SystemExit(f"the llama.cpp smoke test could not run: {result.summary}")
        if result.ok:
            STAMP.write_text(json.dumps({**build.stamp(), "smoke": asdict(result)}))
            _preload_cuda(build)
            print(f"installed {wheel.name} ({build.describe()})", flush=True)
            return 0
        STAMP.unlink(missing_ok=True)
        (cache / FAILED).write_text(result.summary)
        failures.append(f"{build.variant} build: {result.summary}")
        if not build.portable:
            print("rebuilding with the native optimisations off (GGML_NATIVE=OFF, "
                  "a portable baseline)", flush=True)
    raise SystemExit(
        f"{PACKAGE} {VERSION} does not run correctly on this machine: " + "; ".join(failures)
        + ". Nothing else was changed; please report this with the output above "
        f"(remove {cache_dir(builds[0]).parent} to try every build again).")


if __name__ == "__main__":
    sys.exit(main())
