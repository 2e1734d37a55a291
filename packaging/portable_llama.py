"""Build llama.cpp's libraries for the packaged app: one build for every CPU of a kind.

    python packaging/portable_llama.py            # prints the folder of the libraries

The bundle cannot be compiled for the machine it lands on, so it carries llama.cpp the
way llama.cpp's own releases do: the CPU backend in every variant the compiler can make
(`GGML_CPU_ALL_VARIANTS`), each a module loaded at run time (`GGML_BACKEND_DL`); the
loader (engine/llama/native.py) asks each for its score on this CPU and keeps the best. The
AMX variant (sapphirerapids) is left out: its kernels crash on the first decode on such
CPUs (llama.cpp #20824, unfixed), so a Xeon with AMX gets the AVX-512 one instead.

Beside them, the Vulkan backend as a module (every vendor's GPU, through the driver the
user has): built where Vulkan's build tools are (gpu_toolchain.py: the distribution's
glslc, libvulkan-dev and spirv-headers, newer headers fetched where those are old), else
left out with the reason printed. ggml loads it at start; without a Vulkan loader or
driver on the user's machine it does not load, and the app runs on the CPU.

And the CUDA backend as a module (NVIDIA), built apart with CUDA from PyPI
(gpu_toolchain.install_cuda) for the GPUs people own: SASS for Turing, Ampere's and Ada's
consumer cards and Blackwell's, Turing's PTX for every other (the driver compiles it once).
Its runtime (cudart, cuBLAS: 400+ MB) is not bundled: `cuda-runtime.json` beside the
module names the wheels it was built against, with their sha256 from the package index,
and the app fetches them once on a machine whose NVIDIA driver is there
(engine/llama/cuda_runtime.py). Hours on 2 cores the first time; resumable (an
interrupted build goes on from where it stopped), then cached.

The source is the llama.cpp commit llama-cpp-python vendors (its sdist, from the package
index), so the Python bindings match the libraries. The result is cached under a key of
version, flags, compiler and machine: about 8 minutes on 2 cores the first time.
Standard library only.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import urllib.parse
import urllib.request
from pathlib import Path

import gpu_toolchain as gpu
from llama_backend import PACKAGE, VERSION

# llama.cpp's variant list (ggml/src/CMakeLists.txt) minus the one that crashes
EXCLUDED_VARIANTS = ("sapphirerapids",)
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=ON",
    "-DGGML_BACKEND_DL=ON", "-DGGML_CPU_ALL_VARIANTS=ON", "-DGGML_NATIVE=OFF",
    "-DGGML_RPC=ON", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_COMMON=OFF",
    "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_TOOLS=OFF",
    "-DLLAMA_BUILD_SERVER=OFF",
    # the pictures' library (engine/llama/vision.py), alone: the tools stay unbuilt
    "-DLLAMA_BUILD_MTMD=ON",
    # the libraries find each other in their own folder, wherever it is unpacked
    "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON", "-DCMAKE_INSTALL_RPATH=$ORIGIN",
)
# GPU backends for the bundle, built as modules beside the CPU variants (macOS: Metal;
# Windows: Vulkan, CUDA; packaging/build_macos.sh and build_windows.ps1 set it)
EXTRA_FLAGS = tuple(os.environ.get("HOMERACK_PORTABLE_CMAKE_ARGS", "").split())
# what the bindings load by name, and what those need by SONAME
LINKED = ("llama", "ggml", "ggml-base", "mtmd")
MODULE_PREFIX, MODULE_SUFFIX = ("ggml-", ".dll") if sys.platform == "win32" else ("libggml-", ".so")


# Turing (7.5: its SASS, and its PTX for the rest), RTX 30 (8.6), RTX 40 (8.9), RTX 50 (12.0)
CUDA_ARCHITECTURES = os.environ.get("HOMERACK_CUDA_ARCHITECTURES", "75;86-real;89-real;120a-real")
CUDA_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=ON", "-DGGML_BACKEND_DL=ON",
    "-DGGML_NATIVE=OFF", "-DGGML_CPU=OFF", "-DGGML_CUDA=ON", "-DLLAMA_CURL=OFF",
    "-DLLAMA_BUILD_COMMON=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_TOOLS=OFF", "-DLLAMA_BUILD_SERVER=OFF",
    "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON", "-DCMAKE_INSTALL_RPATH=$ORIGIN",
    f"-DCMAKE_CUDA_ARCHITECTURES={CUDA_ARCHITECTURES}",
)
CUDA_MODULE = f"{MODULE_PREFIX}cuda{MODULE_SUFFIX}"
RUNTIME_MANIFEST = "cuda-runtime.json"  # engine/llama/cuda_runtime.py reads it
PYPI = "https://pypi.org/pypi"
FILES = "https://files.pythonhosted.org/packages"  # PyPI's file host


def gpu_flags() -> tuple[tuple[str, ...], list[str]]:
    """The GPU backends this machine can build as modules (their CMake flags), and a line
    for each left out, saying why."""
    if EXTRA_FLAGS:  # a platform's own script chose them
        return (), []
    missing = gpu.vulkan_build_tools()
    if missing:
        return (), [f"no Vulkan module: Vulkan's build tools are missing ({missing}; "
                    f"apt install {gpu.VULKAN_PACKAGES})"]
    args = gpu.vulkan_cmake_args()
    if args:  # the distribution's headers are too old for this llama.cpp
        gpu.install_vulkan_headers()
    return ("-DGGML_VULKAN=ON", *args.split()), []


def linked_files(name: str) -> tuple[str, ...]:
    """A linked library's plain name (what the bindings open) and its SONAME."""
    if sys.platform == "win32":
        return (f"{name}.dll",)
    if sys.platform == "darwin":
        return (f"lib{name}.dylib", f"lib{name}.0.dylib")
    return (f"lib{name}.so", f"lib{name}.so.0")


def all_linked_files() -> set[str]:
    """Every file of the linked libraries (the rest of the folder is backend modules)."""
    return {file for name in LINKED for file in linked_files(name)}


def _compiler() -> str:
    compiler = os.environ.get("CXX") or shutil.which("c++") or "c++"
    done = subprocess.run([compiler, "--version"], capture_output=True, text=True)
    return done.stdout.splitlines()[0] if done.returncode == 0 else compiler


def cache_folder(gpu_modules: tuple[str, ...] = ()) -> Path:
    identity = {"version": VERSION, "flags": CMAKE_FLAGS + EXTRA_FLAGS + gpu_modules,
                "excluded": EXCLUDED_VARIANTS}
    return _cached(identity, VERSION)


def _cached(identity: dict, name: str) -> Path:
    """A build's folder in the cache, keyed by what it was built from and with."""
    identity = {**identity, "compiler": _compiler(), "machine": platform.machine()}
    key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    return gpu.cache_base() / "homerack" / "portable" / f"{name}-{key}"


def _source(work: Path) -> Path:
    """llama-cpp-python's sdist, unpacked; its vendored llama.cpp with the AMX variant
    taken out of the variant list."""
    tree = work / f"llama_cpp_python-{VERSION}"
    if not tree.exists():
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary",
                        ":all:", "-d", str(work), f"{PACKAGE}=={VERSION}"], check=True)
        with tarfile.open(work / f"llama_cpp_python-{VERSION}.tar.gz") as archive:
            archive.extractall(work, filter="data")
    return without_excluded_variants(tree / "vendor" / "llama.cpp")


def without_excluded_variants(source: Path) -> Path:
    """llama.cpp's tree at `source` with the AMX variant taken out of the variant list."""
    lists = source / "ggml" / "src" / "CMakeLists.txt"
    text = lists.read_text()
    kept = [line for line in text.splitlines(keepends=True)
            if not any(f"ggml_add_cpu_backend_variant({name} " in line
                       for name in EXCLUDED_VARIANTS)]
    lists.write_text("".join(kept))
    return source


def build(into: Path, gpu_modules: tuple[str, ...] = (), source: Path | None = None) -> Path:
    """Compile and collect the libraries into `into`/lib; returns that folder. `source`:
    a llama.cpp tree already here (default: the vendored one, from PyPI's sdist)."""
    work = into / "work"
    work.mkdir(parents=True, exist_ok=True)
    source = without_excluded_variants(source) if source else _source(work)
    binary = work / "build"
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    subprocess.run(["cmake", "-S", str(source), "-B", str(binary), *generator, *CMAKE_FLAGS,
                    *EXTRA_FLAGS, *gpu_modules],
                   check=True)
    jobs = str(os.cpu_count() or 2)
    subprocess.run(["cmake", "--build", str(binary), "--target", "llama", "ggml", "mtmd",
                    "--parallel", jobs], check=True)
    return collect(binary / "bin", into / "lib")


def collect(built: Path, lib: Path) -> Path:
    """The backend modules as they are, and each linked library under its plain name
    (what the bindings open) and its SONAME (what the others need): real files, not
    links, so every archive and installer keeps them."""
    staging = lib.with_name("lib.partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    linked = all_linked_files()
    for module in sorted(built.glob(f"{MODULE_PREFIX}*{MODULE_SUFFIX}")):
        if module.name not in linked and not module.is_symlink():
            shutil.copy2(module, staging / module.name)
    for file in sorted(linked):
        shutil.copy2(built / file, staging / file, follow_symlinks=True)
    variants = sorted(p.name for p in staging.glob(f"{MODULE_PREFIX}cpu-*{MODULE_SUFFIX}"))
    if not variants or any(name in v for v in variants for name in EXCLUDED_VARIANTS):
        raise SystemExit(f"unexpected CPU variants in {built}: {variants}")
    shutil.rmtree(lib, ignore_errors=True)
    staging.rename(lib)
    return lib


def cuda_problem() -> str | None:
    """Why this machine builds no CUDA module for the bundle, or None."""
    if os.environ.get("HOMERACK_PACKAGE_CUDA", "1") == "0":
        return "no CUDA module: HOMERACK_PACKAGE_CUDA=0"
    if EXTRA_FLAGS:
        return "no CUDA module apart: the platform's script chose the GPU backends"
    if sys.platform != "linux" or platform.machine() != "x86_64":
        return "no CUDA module: CUDA from PyPI is built here for Linux x86-64 only"
    return None


def runtime_manifest() -> dict:
    """The CUDA runtime wheels the module was built against, as the package index lists
    them (the manylinux x86-64 file: its size and sha256; where to get it: PyPI's file
    host, at the path its blake2b digest gives, then the URL the index gave), and the
    libraries each gives: what the app fetches and checks at first use."""
    wanted = {"nvidia-cuda-runtime": gpu.RUNTIME_LIBS[:1], "nvidia-cublas": gpu.RUNTIME_LIBS[1:]}
    wheels = []
    for pin in gpu.CUDA_WHEELS:
        name, version = pin.split("==")
        if name not in wanted:
            continue
        listing = f"{PYPI}/{name}/json"
        with urllib.request.urlopen(listing, timeout=60) as reply:
            files = json.load(reply)["releases"][version]
        wheel = next(f for f in files if f["filename"].endswith(".whl")
                     and "manylinux" in f["filename"] and "x86_64" in f["filename"])
        blake = wheel["digests"]["blake2b_256"]
        hosted = f"{FILES}/{blake[:2]}/{blake[2:4]}/{blake[4:]}/{wheel['filename']}"
        given = urllib.parse.urljoin(listing, wheel["url"])
        wheels.append({"name": name, "version": version, "size": wheel["size"],
                       "sha256": wheel["digests"]["sha256"],
                       "urls": list(dict.fromkeys((hosted, given))),
                       "member_folder": "nvidia/cu13/lib", "libraries": list(wanted[name])})
    return {"cuda": gpu.CUDA_RELEASE, "architectures": CUDA_ARCHITECTURES, "wheels": wheels}


def ensure_cuda() -> Path | None:
    """The folder of the CUDA module and its runtime manifest (built the first time,
    then from the cache), or None where none is built here (the reason printed)."""
    problem = cuda_problem()
    if problem:
        print(problem, file=sys.stderr, flush=True)
        return None
    into = _cached({"version": VERSION, "cuda": gpu.CUDA_RELEASE, "flags": CUDA_FLAGS},
                   f"cuda-{VERSION}")
    lib = into / "lib"
    if not (lib / CUDA_MODULE).exists():
        print(f"building llama.cpp {VERSION}'s CUDA module for {CUDA_ARCHITECTURES} (hours "
              "on 2 cores the first time; an interrupted build goes on where it stopped) ...",
              file=sys.stderr, flush=True)
        build_cuda(into, lib)
    size = (lib / CUDA_MODULE).stat().st_size / 2**20
    print(f"CUDA module: {CUDA_ARCHITECTURES}, {size:.0f} MiB", file=sys.stderr, flush=True)
    return lib


def build_cuda(into: Path, lib: Path) -> None:
    """Compiles the CUDA module in `into`/work (kept until done: ninja goes on where an
    interrupted build stopped), then `lib` gets it and the runtime's manifest, whole."""
    root = gpu.install_cuda()
    work = into / "work"
    work.mkdir(parents=True, exist_ok=True)
    binary = work / "build"
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    subprocess.run(["cmake", "-S", str(_source(work)), "-B", str(binary), *generator,
                    *CUDA_FLAGS, *gpu.cuda_cmake_args(root).split()], check=True)
    subprocess.run(["cmake", "--build", str(binary), "--target", "ggml-cuda", "--parallel",
                    str(os.cpu_count() or 2)], check=True)
    staging = into / "lib.partial"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    shutil.copy2(binary / "bin" / CUDA_MODULE, staging / CUDA_MODULE)
    (staging / RUNTIME_MANIFEST).write_text(json.dumps(runtime_manifest(), indent=1))
    staging.rename(lib)
    shutil.rmtree(work, ignore_errors=True)


def ensure() -> Path:
    """The folder of the portable libraries: built the first time, then from the cache."""
    gpu_modules, left_out = gpu_flags()
    for line in left_out:
        print(line, file=sys.stderr, flush=True)
    into = cache_folder(gpu_modules)
    lib = into / "lib"
    if not (lib / linked_files("llama")[0]).exists():
        print(f"building portable llama.cpp {VERSION} (every CPU variant but "
              f"{', '.join(EXCLUDED_VARIANTS)}{', and Vulkan' if gpu_modules else ''}; "
              f"about {20 if gpu_modules else 8} minutes on 2 cores) ...",
              file=sys.stderr, flush=True)
        build(into, gpu_modules)
        shutil.rmtree(into / "work", ignore_errors=True)
    variants = sorted(p.stem.removeprefix(f"{MODULE_PREFIX}cpu-")
                      for p in lib.glob(f"{MODULE_PREFIX}cpu-*{MODULE_SUFFIX}"))
    others = sorted(p.stem.removeprefix(MODULE_PREFIX) for p in lib.glob(
        f"{MODULE_PREFIX}*{MODULE_SUFFIX}") if not p.name.startswith(f"{MODULE_PREFIX}cpu-")
        and p.name not in all_linked_files())
    print(f"portable llama.cpp: {len(variants)} CPU variants ({' '.join(variants)}); "
          f"modules: {' '.join(others)}", file=sys.stderr, flush=True)
    return lib


def main() -> int:
    """The CPU (and Vulkan) build's folder, then the CUDA module's (`--cuda`). On a GPU
    machine that reaches no package index (packaging/device_bundle_check.sh), `--here
    SOURCE INTO ARCHITECTURES`: what the bundle carries, the CUDA module built in the same
    tree by that machine's own toolkit, from llama.cpp at SOURCE."""
    if sys.argv[1:2] == ["--here"]:
        if len(sys.argv) != 5:
            raise SystemExit("usage: portable_llama.py --here LLAMA_CPP_SOURCE INTO ARCHITECTURES")
        source, into, architectures = sys.argv[2:]
        print(build(Path(into), ("-DGGML_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={architectures}"),
                    Path(source)))
    else:
        print(ensure_cuda() if "--cuda" in sys.argv[1:] else ensure())
    return 0


if __name__ == "__main__":
    sys.exit(main())
