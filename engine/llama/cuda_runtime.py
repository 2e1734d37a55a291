"""The CUDA runtime of the packaged app's CUDA module: fetched once, then loaded first.

The bundle carries llama.cpp's CUDA backend as a module (libggml-cuda.so) but not the
400+ MB of NVIDIA's runtime it links (cudart, cuBLAS): every download would carry it,
NVIDIA or not. Beside the module, `cuda-runtime.json` (packaging/portable_llama.py) names
the wheels it was built against, each with its size and sha256 from the package index at
build time and the places to get it (tried in order). On a machine whose NVIDIA driver is there (libcuda.so.1 loads) and
whose cache lacks them, `fetch` downloads those wheels, checks each against the bundle's
own sha256 (not the index's word at run time), and keeps the libraries with their sha256;
`preload` checks each library against it and loads them, globally, before ggml loads its backends, so the module finds them by SONAME as
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
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("homerack.engine")
MANIFEST = "cuda-runtime.json"
HASHES = "sha256.json"  # beside the libraries: each one's sha256, from its checked wheel
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
        """Every library there, each the very file its checked wheel held (its sha256,
        recorded when it was kept, read again here): a fetch cut short once left a
        truncated library that a presence check accepted, and loading it killed the
        process with SIGBUS."""
        try:
            expected = json.loads((self.folder / HASHES).read_text())
        except (OSError, ValueError):
            return False
        return isinstance(expected, dict) and all(
            _intact(path, expected.get(path.name)) for path in self.libraries)

    def preload(self) -> bool:
        """Loads the runtime globally (before ggml loads the CUDA module); False where it
        is not fetched, or not whole."""
        if not self.ready():
            return False
        for path in self.libraries:
            ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
        return True

    def fetch(self, progress: Callable[[int, int], None] = lambda done, total: None) -> None:
        """Downloads each wheel, checks its size and sha256 against the bundle's manifest,
        and keeps its libraries with their sha256; the folder appears whole or not at all.
        One fetch at a time (a lock beside the folder, across processes), each in a
        private folder of its own, so two never write the same files."""
        cache = self.folder.parent
        cache.mkdir(parents=True, exist_ok=True, mode=0o700)
        with _locked(cache / f"{self.folder.name}.lock"):
            if self.ready():  # another fetch kept it meanwhile
                return
            for stale in cache.glob(f"{self.folder.name}.partial*"):  # a fetch killed
                shutil.rmtree(stale, ignore_errors=True)
            partial = Path(tempfile.mkdtemp(dir=cache, prefix=f"{self.folder.name}.partial-"))
            try:
                self._fetch_into(partial, progress)
            except BaseException:
                shutil.rmtree(partial, ignore_errors=True)
                raise
            shutil.rmtree(self.folder, ignore_errors=True)
            partial.rename(self.folder)

    def _fetch_into(self, partial: Path, progress: Callable[[int, int], None]) -> None:
        done, hashes = 0, {}
        for wheel in self.wheels:
            with tempfile.TemporaryFile(dir=partial) as file:
                done = _download(wheel, file, done, self.size, progress)
                hashes.update(_extract(wheel, file, partial))
        for name, sha256 in hashes.items():  # what reached the disk, read back
            if _sha256(partial / name) != sha256:
                raise OSError(f"{name} was not written whole")
        (partial / HASHES).write_text(json.dumps(hashes))


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


def _extract(wheel: Wheel, file, into: Path) -> dict[str, str]:
    """The wheel's libraries into the folder, and the sha256 of each as the wheel held it."""
    hashes = {}
    with zipfile.ZipFile(file) as archive:
        for name in wheel.libraries:
            digest = hashlib.sha256()
            with archive.open(f"{wheel.member_folder}/{name}") as source, \
                    (into / name).open("wb") as target:
                while chunk := source.read(CHUNK):
                    digest.update(chunk)
                    target.write(chunk)
            hashes[name] = digest.hexdigest()
    return hashes


_checked: dict[tuple, bool] = {}  # (path, size, mtime, sha256) -> it matched: read once


def _intact(path: Path, sha256: str | None) -> bool:
    try:
        stat = path.stat()
    except OSError:
        return False
    key = (str(path), stat.st_size, stat.st_mtime_ns, sha256)
    if key not in _checked:
        _checked[key] = sha256 is not None and _sha256(path) == sha256
    return _checked[key]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


@contextmanager
def _locked(path: Path):
    """An exclusive lock on `path`, held by this process while the block runs."""
    with path.open("a") as handle:
        try:
            import fcntl
        except ImportError:  # (not Linux: one process fetches there)
            yield
            return
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


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
