"""Build llama.cpp's own llama-bench, llama-server and ggml-rpc-server (its rpc-server)
from the exact commit that the installed llama-cpp-python vendors (its sdist), for anchors in the benchmarks, with the
same CPU choices as that build (packaging/llama_backend.py's stamp: AMX left out where
it crashes, or the portable build where the native one failed its smoke test).

    python -m bench.build_tools        # prints the bin folder; cached after the first build
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import httpx

import llama_cpp

ROOT = Path(__file__).resolve().parents[1]
TARGETS = ("llama-bench", "llama-server", "ggml-rpc-server")


def packaging_module(name: str):
    """A script of packaging/ as a module (that folder is no package: its name would
    shadow PyPI's `packaging`)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "packaging" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up while it loads
    sys.path.insert(0, str(ROOT / "packaging"))  # its own imports: its neighbours
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(ROOT / "packaging"))
    return module


def installed_build() -> dict:
    """The CMake arguments and extra compiler flags of the installed llama-cpp-python."""
    try:
        stamp = json.loads(packaging_module("llama_backend").STAMP.read_text())
    except (OSError, ValueError):
        stamp = {}
    return {"cmake_args": stamp.get("cmake_args", "-DGGML_RPC=ON"),
            "cflags": stamp.get("cflags", "")}


def tools_dir() -> Path:
    key = hashlib.sha256(json.dumps(installed_build(), sort_keys=True).encode()).hexdigest()[:8]
    return ROOT / ".cache" / f"llama-tools-{llama_cpp.__version__}-{key}"


BINS_ENV = "HOMERACK_DEVICE_BINS"  # llama-bench and llama-server built elsewhere (a GPU's)


def build() -> Path:
    """llama.cpp's tools from the vendored commit, built here once; those in the folder
    HOMERACK_DEVICE_BINS names where it is set (../shared/device builds them for CUDA)."""
    if named := os.environ.get(BINS_ENV):
        return Path(named)
    out = tools_dir()
    bins = out / "bin"
    if all((bins / t).exists() for t in TARGETS):
        return bins
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary",
                        ":all:", f"llama-cpp-python=={llama_cpp.__version__}", "-d", tmp],
                       check=True)
        sdist = next(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
        with tarfile.open(sdist) as archive:
            archive.extractall(tmp, filter="data")
        source = next(Path(tmp).glob("llama_cpp_python-*/vendor/llama.cpp"))
        build_dir = Path(tmp) / "build"
        flags = installed_build()
        subprocess.run(["cmake", "-S", str(source), "-B", str(build_dir), "-DCMAKE_BUILD_TYPE=Release",
                        "-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_TESTS=OFF",
                        "-DLLAMA_BUILD_EXAMPLES=OFF", *flags["cmake_args"].split(),
                        "-DLLAMA_CURL=OFF", "-DBUILD_SHARED_LIBS=OFF"], check=True,
                       env=packaging_module("llama_backend").compiler_env(flags["cflags"]))
        subprocess.run(["cmake", "--build", str(build_dir), "-j", str(os.cpu_count() or 2),
                        "--target", *TARGETS], check=True)
        bins.mkdir(parents=True, exist_ok=True)
        for target in TARGETS:
            (build_dir / "bin" / target).replace(bins / target)
    return bins


def llama_bench(bins: Path, model: Path, threads: int, *args: str) -> list[dict]:
    """llama-bench's rows (its JSON output) for `model` with `args` (-p, -n, -d, -r...)."""
    done = subprocess.run([str(bins / "llama-bench"), "-m", str(model), "-t", str(threads),
                           *args, "-o", "json"], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


@contextmanager
def llama_server(bins: Path, args: list[str]):
    """A llama-server on a free loopback port, ready to answer; yields its URL."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    log = tempfile.TemporaryFile("w+")
    server = subprocess.Popen([str(bins / "llama-server"), *args, "--host", "127.0.0.1",
                               "--port", str(port)], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_until_healthy(server, url, log)
        yield url
        if server.poll() is not None:
            raise RuntimeError(_why(server, log, "stopped while the benchmark used it"))
    finally:
        server.terminate()
        server.wait(30)
        log.close()


def _wait_until_healthy(server: subprocess.Popen, url: str, log, limit_s: float = 180) -> None:
    """Return once llama-server answers /health; raise saying why when it dies or hangs."""
    deadline = time.time() + limit_s
    while time.time() < deadline:
        if server.poll() is not None:
            raise RuntimeError(_why(server, log, "exited before answering"))
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(_why(server, log, f"did not answer within {limit_s:.0f} s"))


def _why(server: subprocess.Popen, log, what: str) -> str:
    log.seek(0)
    tail = "\n".join(log.read().splitlines()[-15:])
    code = server.poll()
    status = f" (exit status {code})" if code is not None else ""
    return f"llama-server {what}{status}; the end of its log:\n{tail}"


if __name__ == "__main__":
    print(build())
