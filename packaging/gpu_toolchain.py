"""Which GPUs this machine has, and the toolchains that build llama.cpp for them without a
system toolkit (llama_backend.py chooses; standard library only, as it is).

NVIDIA: the driver alone (nvidia-smi) is enough. Without `nvcc`, CUDA comes from PyPI:
NVIDIA's CUDA 13 wheels hold a whole toolkit under `nvidia/cu13/` (nvcc, its crt headers
and nvvm, the runtime, CCCL, cuBLAS); the CUDA 12 wheels (`nvidia-cuda-nvcc-cu12`) carry
ptxas alone, no nvcc. CUDA 13 builds for Turing (compute 7.5) and later and needs a driver
that supports CUDA 13 (R580 or newer); it is installed once into a cache beside the
virtual environments, and the build targets the compute capabilities of the GPUs present.

AMD and Intel: llama.cpp's Vulkan backend, built with the distribution's glslc,
libvulkan-dev and spirv-headers (Debian's build it without a GPU); without them the CPU
build says which packages would give a GPU build. The vendored llama.cpp uses Vulkan
headers newer than Debian 12's (1.3.239 lacks VK_EXT_layer_settings): where the system's
are older, Debian 13's (1.4.309, headers only, checked by their hash) are fetched into the
cache from Debian's archive and the build reads them; the loader stays the system's.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

CUDA_RELEASE = "13.5.37"
CUDA_WHEELS = (f"nvidia-cuda-nvcc=={CUDA_RELEASE}", f"nvidia-cuda-crt=={CUDA_RELEASE}",
               f"nvidia-nvvm=={CUDA_RELEASE}", f"nvidia-cuda-runtime=={CUDA_RELEASE}",
               "nvidia-cuda-cccl==13.3.5.0.6", "nvidia-cublas==13.10.0.20")
CUDA_MIN_COMPUTE = 75    # Turing: CUDA 13's oldest
CUDA_MIN_DRIVER = (13, 0)  # the CUDA version the driver must support
RUNTIME_LIBS = ("libcudart.so.13", "libcublasLt.so.13", "libcublas.so.13")
VULKAN_PACKAGES = "glslc libvulkan-dev spirv-headers mesa-vulkan-drivers"
VULKAN_MIN_HEADER = 268  # VK_HEADER_VERSION that has VK_EXT_layer_settings
VULKAN_DEB_MAX = 16 << 20  # the package is 1.3 MB
VULKAN_HEADERS_DEB = ("https://deb.debian.org/debian/pool/main/v/vulkan-loader/"
                      "libvulkan-dev_1.4.309.0-1_amd64.deb",
                      "8d329d465e16168afff58b1bd0dd6db46aac2cc3f56054a481b25a04e90b345a")
PCI_VENDORS = {"0x1002": "AMD", "0x8086": "Intel", "0x10de": "NVIDIA"}


@dataclass(frozen=True)
class NvidiaGpus:
    computes: tuple[int, ...]       # compute capabilities, 89 for 8.9, one per GPU
    driver_cuda: tuple[int, int] | None  # the newest CUDA its driver runs

    @property
    def architectures(self) -> str:
        """CMAKE_CUDA_ARCHITECTURES for these GPUs only (each: its code and its PTX)."""
        return ";".join(str(c) for c in sorted(set(self.computes)))

    def pypi_cuda_problem(self) -> str | None:
        """Why CUDA from PyPI cannot serve these GPUs, or None."""
        if not self.computes:
            return "nvidia-smi did not report the GPUs' compute capability"
        old = [c for c in self.computes if c < CUDA_MIN_COMPUTE]
        if old:
            return (f"compute {old[0] / 10:.1f} is older than CUDA 13 builds for (7.5): "
                    "install CUDA 12's toolkit (nvcc) for a CUDA build")
        if self.driver_cuda is None or self.driver_cuda < CUDA_MIN_DRIVER:
            have = ".".join(map(str, self.driver_cuda)) if self.driver_cuda else "unknown"
            return (f"the NVIDIA driver runs CUDA {have}; CUDA 13 from PyPI needs 13.0 "
                    "(driver 580 or newer): update the driver, or install a CUDA toolkit "
                    "the driver runs (nvcc)")
        return None


def nvidia_gpus() -> NvidiaGpus | None:
    """The NVIDIA GPUs the driver reports, or None without a driver."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    try:
        listed = subprocess.run([smi, "--query-gpu=compute_cap", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=30)
        header = subprocess.run([smi], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if listed.returncode != 0:
        return None
    computes = tuple(int(float(line) * 10 + 0.5) for line in listed.stdout.split()
                     if re.fullmatch(r"\d+\.\d+", line))
    match = re.search(r"CUDA Version:\s*(\d+)\.(\d+)", header.stdout)
    return NvidiaGpus(computes, (int(match[1]), int(match[2])) if match else None)


def gpu_vendors(sysfs: Path = Path("/sys/class/drm")) -> set[str]:
    """The vendors of the display adapters the kernel sees (AMD, Intel, NVIDIA)."""
    found = set()
    for vendor in sysfs.glob("card*/device/vendor"):
        try:
            name = PCI_VENDORS.get(vendor.read_text().strip())
        except OSError:
            continue
        if name:
            found.add(name)
    return found


def vulkan_build_tools() -> str | None:
    """What llama.cpp's Vulkan backend still needs to build here, or None."""
    missing = []
    if not shutil.which("glslc"):
        missing.append("glslc")
    if not os.environ.get("VULKAN_SDK"):
        if not Path("/usr/include/vulkan/vulkan.h").exists():
            missing.append("libvulkan-dev")
        if not any(Path(p).exists() for p in ("/usr/share/cmake/SPIRV-Headers",
                                              "/usr/lib/cmake/SPIRV-Headers")):
            missing.append("spirv-headers")
    return " ".join(missing) or None


def cache_base() -> Path:
    """The user's cache folder (XDG_CACHE_HOME or ~/.cache): builds' wheels and toolchains."""
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))


def private_folder(folder: Path) -> Path:
    """`folder` and Homerack's folders above it in the cache made, and kept, 0700: what
    they hold is code this environment installs or loads at every start."""
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    ours = cache_base() / "homerack"
    for path in (folder, *folder.parents):
        if path == ours or ours in path.parents:
            path.chmod(0o700)
    return folder


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def cuda_home(cache: Path | None = None) -> Path:
    return (cache or cache_base()) / "homerack" / f"cuda-{CUDA_RELEASE}"


def cuda_root(cache: Path | None = None) -> Path:
    """The toolkit's root inside the install: what CMake and the .pth line point at."""
    return cuda_home(cache) / "nvidia" / "cu13"


def install_cuda(wheels=CUDA_WHEELS, cache: Path | None = None) -> Path:
    """CUDA from PyPI into the cache (pip checks each wheel's hash against the index):
    the toolkit's root, `nvidia/cu13`, with the unversioned library names CMake links
    against. Installed once, and checked at every setup against the sha256 pip recorded
    of each file (the wheels' RECORD): a marker file alone once stood for a toolkit
    whatever its files had become."""
    home, root = private_folder(cuda_home(cache)), cuda_root(cache)
    done = home / ".installed"
    if not (done.exists() and done.read_text() == " ".join(wheels)) or toolkit_damage(home):
        print(f"CUDA {CUDA_RELEASE} from PyPI into {home} (once: about 1 GB)...", flush=True)
        done.unlink(missing_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "--disable-pip-version-check",
                        "--no-deps", "--upgrade", "--force-reinstall", "--target", str(home),
                        *wheels], check=True)
        if damage := toolkit_damage(home):
            raise SystemExit(f"CUDA from PyPI in {home} is not what pip installed: {damage}")
        done.write_text(" ".join(wheels))
    driver_stub(root)
    for versioned in (root / "lib").glob("lib*.so.*"):
        plain = versioned.with_name(versioned.name.split(".so.")[0] + ".so")
        if not plain.exists():
            plain.symlink_to(versioned.name)
    return root


def toolkit_damage(home: Path) -> str | None:
    """The first file of the installed wheels that is not as their RECORD has it (its
    sha256 and size), or None when all are; a toolkit without RECORDs is damaged."""
    records = list(home.glob("*.dist-info/RECORD"))
    if not records:
        return "no wheel's RECORD"
    for record in records:
        for row in csv.reader(record.read_text().splitlines()):
            if len(row) < 3 or not row[1].startswith("sha256="):
                continue  # the RECORD itself, and .pyc files, carry no hash
            path = home / row[0]
            expected = base64.urlsafe_b64decode(row[1][7:] + "==").hex()
            try:
                if path.stat().st_size != int(row[2]) or sha256_of(path) != expected:
                    return f"{row[0]} differs"
            except (OSError, ValueError):
                return f"{row[0]} is missing"
    return None


def cuda_cmake_args(root: Path) -> str:
    return (f"-DCMAKE_CUDA_COMPILER={root / 'bin' / 'nvcc'} -DCUDAToolkit_ROOT={root} "
            f"-DCUDA_cuda_driver_LIBRARY={root / 'lib' / 'stubs' / 'libcuda.so'}")


def driver_stub(root: Path) -> Path:
    """A link-time stand-in for the driver's libcuda (ggml's CUDA backend links the driver
    API): every function cuda.h declares, empty, under the driver's SONAME, as the
    toolkit's own lib/stubs holds (PyPI's wheels ship none). At run time the dynamic
    linker loads the real libcuda.so.1 the driver installed, or the module does not load."""
    stub = root / "lib" / "stubs" / "libcuda.so"
    if stub.exists():
        return stub
    header = (root / "include" / "cuda.h").read_text()
    names = set(re.findall(r"CUDAAPI\s+(cu\w+)\s*\(", header))
    names |= set(re.findall(r"^#define\s+cu\w+\s+(cu\w+)\s*$", header, re.MULTILINE))
    stub.parent.mkdir(parents=True, exist_ok=True)
    source = stub.with_suffix(".c")
    source.write_text("".join(f"void {name}(void) {{}}\n" for name in sorted(names)))
    compiler = os.environ.get("CC") or shutil.which("cc") or "cc"
    subprocess.run([compiler, "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o",
                    str(stub), str(source)], check=True)
    return stub


def preload_line(root: Path) -> str:
    """A .pth line for the environment: CUDA's libraries from the cache loaded at start
    (globally, so llama.cpp's CUDA library finds them by name), as PyTorch loads its
    nvidia wheels; nothing happens where they are gone. Each is loaded only while it is
    the file setup checked (hashed against pip's RECORD): its size and modification time
    then, compared at each start (hashing 500 MB at every start would cost a second)."""
    libs = []
    for name in RUNTIME_LIBS:
        path = root / "lib" / name
        if path.exists():
            stat = path.resolve().stat()
            libs.append((str(path), stat.st_size, stat.st_mtime_ns))
    return ("import ctypes, os; [ctypes.CDLL(p, mode=ctypes.RTLD_GLOBAL) for p, n, t in "
            f"{libs!r} if os.path.exists(p) and (os.stat(p).st_size, os.stat(p).st_mtime_ns)"
            " == (n, t)]\n")


def system_vulkan_header(include: Path = Path("/usr/include")) -> int | None:
    """VK_HEADER_VERSION of the system's Vulkan headers, or None without them."""
    try:
        text = (include / "vulkan" / "vulkan_core.h").read_text(errors="replace")
    except OSError:
        return None
    match = re.search(r"#define VK_HEADER_VERSION (\d+)", text)
    return int(match[1]) if match else None


def vulkan_cmake_args(cache: Path | None = None) -> str:
    """Where the Vulkan headers are not the system's: newer ones from the cache."""
    version = system_vulkan_header()
    if os.environ.get("VULKAN_SDK") or (version or 0) >= VULKAN_MIN_HEADER:
        return ""
    return f"-DVulkan_INCLUDE_DIR={vulkan_headers_home(cache) / 'usr' / 'include'}"


def vulkan_headers_home(cache: Path | None = None) -> Path:
    return (cache or cache_base()) / "homerack" / "vulkan-headers-1.4.309"


def install_vulkan_headers(cache: Path | None = None, source=None) -> Path:
    """Debian 13's Vulkan headers into the cache (once): the .deb fetched over HTTPS into
    a file (at most VULKAN_DEB_MAX bytes: never read whole into memory), checked against
    its hash before anything reads it, its files unpacked with dpkg-deb. `source`: the
    (url, sha256) to use (the tests' own server)."""
    home = private_folder(vulkan_headers_home(cache))
    include = home / "usr" / "include"
    if (include / "vulkan" / "vulkan.hpp").exists():
        return include
    url, digest = source or VULKAN_HEADERS_DEB
    print(f"Vulkan headers 1.4.309 from Debian's archive into {home}...", flush=True)
    with tempfile.NamedTemporaryFile(suffix=".deb", dir=home) as deb:
        sha256, size = hashlib.sha256(), 0
        with urllib.request.urlopen(url, timeout=120) as reply:
            while chunk := reply.read(1 << 20):
                size += len(chunk)
                if size > VULKAN_DEB_MAX:
                    raise SystemExit(f"{url} is larger than the package: not used")
                sha256.update(chunk)
                deb.write(chunk)
        if sha256.hexdigest() != digest:
            raise SystemExit(f"{url} does not have the expected SHA-256: not used")
        deb.flush()
        subprocess.run(["dpkg-deb", "-x", deb.name, str(home)], check=True)
    return include
