"""The packaged app's CUDA runtime (engine/llama/cuda_runtime.py): fetched once from the
index the bundle names, checked against the sha256 the bundle was built with, kept whole
or not at all, loaded before ggml loads the CUDA module; `homerack gpu-runtime` says and
does it. The index is a real HTTP server on loopback serving real wheels of real shared
libraries (NVIDIA's are 400+ MB: stood in for by two small ones under their SONAMEs)."""

import ctypes
import hashlib
import http.server
import json
import os
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import pytest

from engine.llama import native
from engine.llama.cuda_runtime import MANIFEST, Runtime, driver_present
from support import ROOT

LIBS = {"nvidia-cuda-runtime": ("libcudart.so.13",),
        "nvidia-cublas": ("libcublasLt.so.13", "libcublas.so.13")}


def _library(folder: Path, soname: str) -> Path:
    source = folder / f"{soname}.c"
    symbol = soname.split(".")[0].removeprefix("lib")
    source.write_text(f"int {symbol}_here(void) {{ return 13; }}\n")
    subprocess.run(["cc", "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o",
                    str(folder / soname), str(source)], check=True)
    return folder / soname


@pytest.fixture
def index(tmp_path):
    """A loopback index serving one wheel per package; its base URL and the wheels."""
    served = tmp_path / "served"
    served.mkdir()
    wheels = {}
    for name, sonames in LIBS.items():
        wheel = served / f"{name.replace('-', '_')}-13.5.37-py3-none-manylinux_2_27_x86_64.whl"
        with zipfile.ZipFile(wheel, "w") as archive:
            for soname in sonames:
                archive.write(_library(tmp_path, soname), f"nvidia/cu13/lib/{soname}")
        wheels[name] = wheel

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), lambda *a: Quiet(*a, directory=str(served)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", wheels
    server.shutdown()


def _module_folder(tmp_path, index, tamper: str = "") -> Path:
    """A lib folder as the bundle's: the manifest portable_llama writes beside the module."""
    base, wheels = index
    lib = tmp_path / "lib"
    lib.mkdir(exist_ok=True)
    listed = [{"name": name, "version": "13.5.37",
               # a host that is down first: the next one serves it
               "urls": [f"{base}/gone/{wheel.name}", f"{base}/{wheel.name}"],
               "size": wheel.stat().st_size,
               "sha256": hashlib.sha256(wheel.read_bytes() + tamper.encode()).hexdigest(),
               "member_folder": "nvidia/cu13/lib", "libraries": list(LIBS[name])}
              for name, wheel in wheels.items()]
    (lib / MANIFEST).write_text(json.dumps({"cuda": "13.5.37", "wheels": listed}))
    return lib


def test_fetched_once_whole_and_loaded_first(tmp_path, index):
    runtime = Runtime.beside(_module_folder(tmp_path, index), tmp_path / "cache")
    assert not runtime.ready() and not runtime.preload()
    seen = []
    runtime.fetch(lambda done, total: seen.append((done, total)))
    assert runtime.ready()
    assert seen[-1] == (runtime.size, runtime.size)
    assert [done for done, _ in seen] == sorted(done for done, _ in seen)
    assert sorted(p.name for p in runtime.folder.iterdir()) == sorted(
        [*(soname for sonames in LIBS.values() for soname in sonames), "sha256.json"])
    assert runtime.preload()
    maps = Path("/proc/self/maps").read_text()
    assert all(str(path) in maps for path in runtime.libraries)
    # by SONAME, as the CUDA module asks for it: the loaded one, not a search
    assert ctypes.CDLL("libcublas.so.13").cublas_here() == 13


def test_a_file_not_the_one_built_against_is_refused_and_nothing_kept(tmp_path, index):
    runtime = Runtime.beside(_module_folder(tmp_path, index, tamper="x"), tmp_path / "cache")
    with pytest.raises(ValueError, match="not the file the bundle was built against"):
        runtime.fetch()
    assert not runtime.ready() and not runtime.folder.exists()
    assert not [p for p in (tmp_path / "cache").iterdir()
                if p.is_dir()]  # no partial folder left behind (the lock's file stays)


def test_no_module_no_runtime(tmp_path):
    assert Runtime.beside(tmp_path, tmp_path / "cache") is None


def _command(lib: Path, home: Path, *argv: str) -> subprocess.CompletedProcess:
    """`homerack ARGV` with the bundle's lib folder at `lib` (its own process: the
    command makes its files private, process-wide)."""
    code = ("import sys; from pathlib import Path; import engine.llama.native as n; "
            f"n.LIB_DIR = Path({str(lib)!r}); from app.cli import main; "
            f"sys.exit(main({list(argv)!r}))")
    env = {k: v for k, v in os.environ.items() if k != native.CUDA_RUNTIME_ENV}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=120, env={**env, "HOMERACK_HOME": str(home)})


def test_the_command_says_then_fetches(tmp_path, index):
    lib, home = _module_folder(tmp_path, index), tmp_path / "home"
    said = _command(lib, home, "gpu-runtime")
    assert said.returncode == 1, said.stderr
    assert "is not fetched" in said.stdout and "homerack gpu-runtime --fetch" in said.stdout
    fetched = _command(lib, home, "gpu-runtime", "--fetch")
    assert fetched.returncode == 0 and "runtime is here" in fetched.stderr, fetched.stderr
    again = _command(lib, home, "gpu-runtime")
    assert again.returncode == 0 and str(home / "cache" / "gpu-runtime") in again.stdout


def test_a_build_without_the_module_has_nothing_to_fetch(tmp_path):
    said = _command(tmp_path, tmp_path / "home", "gpu-runtime")
    assert said.returncode == 0 and "no CUDA module in this build" in said.stdout


@pytest.mark.skipif(driver_present(), reason="an NVIDIA driver is here")
def test_without_the_driver_the_module_stays_out_and_says_so(tmp_path, index, monkeypatch):
    monkeypatch.setattr(native, "LIB_DIR", _module_folder(tmp_path, index))
    assert native._why_not("cuda") == "no NVIDIA driver (libcuda.so.1)"


def test_the_engine_fetches_it_in_the_background_where_the_driver_is(tmp_path, index,
                                                                       monkeypatch):
    """Where the CUDA module and NVIDIA's driver are there (the driver, which cannot be
    here, stood in for) and the runtime is not, the engine's fetch runs in the background
    and /health's state goes from fetching to ready; nothing starts without the driver, or
    once the runtime is there."""
    import time

    from engine.llama import cuda_runtime

    monkeypatch.setattr(native, "LIB_DIR", _module_folder(tmp_path, index))
    monkeypatch.setenv(native.CUDA_RUNTIME_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(native, "driver_present", lambda: False)
    assert native.fetch_cuda_runtime() is None
    monkeypatch.setattr(native, "driver_present", lambda: True)
    fetching = native.fetch_cuda_runtime()
    assert fetching.status()["total_bytes"] == fetching.runtime.size
    deadline = time.monotonic() + 60
    while fetching.status()["state"] == "fetching" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert fetching.status() == {"state": "ready", "cuda": "13.5.37", "error": None,
                                 "done_bytes": fetching.runtime.size,
                                 "total_bytes": fetching.runtime.size}
    assert native.fetch_cuda_runtime() is None  # here now: nothing more to fetch
    broken = cuda_runtime.Fetching(Runtime.beside(_module_folder(tmp_path, index, tamper="x"),
                                                  tmp_path / "other"))
    while broken.status()["state"] == "fetching" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert broken.status()["state"] == "failed"
    assert "not the file the bundle was built against" in broken.status()["error"]


def test_two_fetches_at_once_keep_one_whole_runtime(tmp_path, index):
    """Two processes' fetches (threads here, the lock is the file's) write no file twice:
    one fetches, the other finds it kept; no partial folder is left."""
    lib = _module_folder(tmp_path, index)
    runtimes = [Runtime.beside(lib, tmp_path / "cache") for _ in range(2)]
    errors = []
    threads = [threading.Thread(target=lambda r=r: _catching(r.fetch, errors)) for r in runtimes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == [] and all(r.ready() for r in runtimes)
    assert [p.name for p in (tmp_path / "cache").iterdir() if p.is_dir()] == \
        [runtimes[0].folder.name]


def _catching(call, errors):
    try:
        call()
    except Exception as exc:  # noqa: BLE001 (what failed is the test's to show)
        errors.append(exc)


def test_a_runtime_cut_short_is_not_ready_nor_loaded_and_fetched_again(tmp_path, index):
    """A library truncated (a fetch killed as the folder was written, a disk that filled)
    is never loaded: loading it killed a new process with SIGBUS; the next fetch replaces
    it, and what a killed fetch left is cleared."""
    runtime = Runtime.beside(_module_folder(tmp_path, index), tmp_path / "cache")
    runtime.fetch()
    cut = runtime.libraries[-1]
    data = cut.read_bytes()
    cut.write_bytes(data[:len(data) // 2])
    assert not runtime.ready() and not runtime.preload()
    left = tmp_path / "cache" / f"{runtime.folder.name}.partial-killed"
    left.mkdir()
    runtime.fetch()
    assert runtime.ready() and cut.read_bytes() == data and not left.exists()
    assert (runtime.folder.stat().st_mode & 0o777) == 0o700
