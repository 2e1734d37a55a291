"""Build llama.cpp's own llama-bench and llama-server from the exact commit that the
installed llama-cpp-python vendors (its sdist), for anchors in the benchmarks.

    python bench/build_tools.py        # prints the bin folder; cached after the first build
"""

from __future__ import annotations

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
TARGETS = ("llama-bench", "llama-server")


def tools_dir() -> Path:
    return ROOT / ".cache" / f"llama-tools-{llama_cpp.__version__}"


def build() -> Path:
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
        subprocess.run(["cmake", "-S", str(source), "-B", str(build_dir), "-DCMAKE_BUILD_TYPE=Release",
                        "-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_TESTS=OFF",
                        "-DLLAMA_BUILD_EXAMPLES=OFF", "-DGGML_RPC=ON", "-DLLAMA_CURL=OFF",
                        "-DBUILD_SHARED_LIBS=OFF"], check=True)
        subprocess.run(["cmake", "--build", str(build_dir), "-j", str(os.cpu_count() or 2),
                        "--target", *TARGETS], check=True)
        bins.mkdir(parents=True, exist_ok=True)
        for target in TARGETS:
            (build_dir / "bin" / target).replace(bins / target)
    return bins


@contextmanager
def llama_server(bins: Path, args: list[str]):
    """A llama-server on a free loopback port, ready to answer; yields its URL."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = subprocess.Popen([str(bins / "llama-server"), *args, "--host", "127.0.0.1",
                               "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 180
        while time.time() < deadline:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        yield url
    finally:
        server.terminate()
        server.wait(30)


if __name__ == "__main__":
    print(build())
