"""The CUDA runtime of the packaged app's CUDA module: fetched once, then loaded first.

The bundle carries llama.cpp's CUDA backend as a module (libggml-cuda.so) but not the
400+ MB of NVIDIA's runtime it links (cudart, cuBLAS): every download would carry it,
NVIDIA or not. Beside the module, `cuda-runtime.json` (packaging/portable_llama.py) names
the wheels it was built against, each with its size and sha256 from the package index at
build time and the places to get it (tried in order). On a machine whose NVIDIA driver is there (libcuda.so.1 loads) and
whose cache lacks them, `fetch` downloads those wheels, checks each against the bundle's
own sha256 (not the index's word at run time), and keeps the libraries; `preload` loads
them, globally, before ggml loads its backends, so the module finds them by SONAME as
PyTorch's nvidia wheels are found. Without the driver or the runtime the module does not
load (ggml skips it) and the GPU runs through Vulkan, or the model on the CPU.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import logging
import shutil
import tempfile
import threading
import urllib.request
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("homerack.engine")
MANIFEST = "cuda-runtime.json"
CUDA_RUNTIME_ENV = "HOMERACK_CUDA_RUNTIME"  # the folder the app keeps the runtime in
DRIVER = "libcuda.so.1"
CHUNK = 1 << 20


@dataclass(frozen=True)
class Wheel:
    name: str
    version: str
    urls: tuple[str, ...]        # where to get it, tried in order (the sha256 decides)
    size: int
    sha256: str
    member_folder: str           # where the libraries are inside the wheel
    libraries: tuple[str, ...]   # by SONAME, in the order they load


@dataclass(frozen=True)
class Runtime:
    """What the CUDA module next to it needs, and where this machine keeps it."""
    cuda: str
    wheels: tuple[Wheel, ...]
    folder: Path

    @classmethod
    def beside(cls, lib_dir: Path, cache: Path) -> "Runtime | None":
        """The runtime the CUDA module in `lib_dir` needs (None: no CUDA module there)."""
        try:
            manifest = json.loads((lib_dir / MANIFEST).read_text())
        except FileNotFoundError:
            return None
        wheels = tuple(Wheel(w["name"], w["version"], tuple(w["urls"]), int(w["size"]),
                             w["sha256"], w["member_folder"], tuple(w["libraries"]))
                       for w in manifest["wheels"])
        key = hashlib.sha256("".join(w.sha256 for w in wheels).encode()).hexdigest()[:12]
        return cls(manifest["cuda"], wheels, cache / f"cuda-runtime-{manifest['cuda']}-{key}")

    @property
    def libraries(self) -> tuple[Path, ...]:
        return tuple(self.folder / name for wheel in self.wheels for name in wheel.libraries)

    @property
    def size(self) -> int:
        return sum(wheel.size for wheel in self.wheels)

    def ready(self) -> bool:
        return all(path.exists() for path in self.libraries)

    def preload(self) -> bool:
        """Loads the runtime globally (before ggml loads the CUDA module); False where it
        is not fetched."""
        if not self.ready():
            return False
        for path in self.libraries:
            ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
        return True

    def fetch(self, progress: Callable[[int, int], None] = lambda done, total: None) -> None:
        """Downloads each wheel, checks its size and sha256 against the bundle's manifest,
        and keeps its libraries; the folder appears whole or not at all."""
        partial = self.folder.with_name(self.folder.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        try:
            done = 0
            for wheel in self.wheels:
                with tempfile.TemporaryFile(dir=partial) as file:
                    done = _download(wheel, file, done, self.size, progress)
                    _extract(wheel, file, partial)
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        shutil.rmtree(self.folder, ignore_errors=True)
        partial.rename(self.folder)


class Fetching:
    """The runtime fetched in the background while the engine serves on what it has
    (Vulkan, or the CPU): its state for GET /health, which the window shows and acts on
    (the engine restarted, once idle, loads the CUDA module)."""

    def __init__(self, runtime: Runtime):
        self.runtime = runtime
        self.state, self.done, self.error = "fetching", 0, None
        threading.Thread(target=self._run, name="cuda-runtime", daemon=True).start()

    def _run(self) -> None:
        log.info("fetching NVIDIA's CUDA %s runtime (%.0f MB) for the CUDA module",
                 self.runtime.cuda, self.runtime.size / 1e6)
        try:
            self.runtime.fetch(self._progress)
            self.state = "ready"
            log.info("NVIDIA's CUDA runtime is in %s: the engine's next start uses the GPU "
                     "through it", self.runtime.folder)
        except (OSError, ValueError, zipfile.BadZipFile, KeyError) as exc:
            self.state, self.error = "failed", str(exc)
            log.warning("NVIDIA's CUDA runtime could not be fetched: %s", exc)

    def _progress(self, done: int, _total: int) -> None:
        self.done = done

    def status(self) -> dict:
        return {"state": self.state, "cuda": self.runtime.cuda, "done_bytes": self.done,
                "total_bytes": self.runtime.size, "error": self.error}


def _extract(wheel: Wheel, file, into: Path) -> None:
    with zipfile.ZipFile(file) as archive:
        for name in wheel.libraries:
            with archive.open(f"{wheel.member_folder}/{name}") as source, \
                    (into / name).open("wb") as target:
                shutil.copyfileobj(source, target, CHUNK)


def _download(wheel: Wheel, file, done: int, total: int,
              progress: Callable[[int, int], None]) -> int:
    """The wheel from the first of its URLs that serves the very file, into `file`."""
    failures = []
    for url in wheel.urls:
        file.seek(0)
        file.truncate()
        try:
            return _download_from(url, wheel, file, done, total, progress)
        except (OSError, ValueError) as exc:
            failures.append(f"{url}: {exc}")
    raise ValueError("; ".join(failures))


def _download_from(url: str, wheel: Wheel, file, done: int, total: int,
                   progress: Callable[[int, int], None]) -> int:
    digest = hashlib.sha256()
    got = 0
    with urllib.request.urlopen(url, timeout=60) as reply:
        while chunk := reply.read(CHUNK):
            got += len(chunk)
            if got > wheel.size:
                break
            digest.update(chunk)
            file.write(chunk)
            progress(done + got, total)
    if got != wheel.size or digest.hexdigest() != wheel.sha256:
        raise ValueError(f"not the file the bundle was built against ({got} bytes, sha256 "
                         f"{digest.hexdigest()[:16]}...; expected {wheel.size} bytes, "
                         f"{wheel.sha256[:16]}...)")
    file.seek(0)
    return done + got


def driver_present() -> bool:
    """NVIDIA's driver library loads: the one part of CUDA the person installs."""
    try:
        ctypes.CDLL(DRIVER)
    except OSError:
        return False
    return True
