"""The llama.cpp build made by `make run` / `make test`: the backend, the CPU it is
compiled for (AMX left out), the smoke test that proves it and the fallback when it
fails."""

import importlib.util
import json
import sys

import pytest

from support import ROOT

AMX_XEON = ("avx", "avx2", "avx512f", "avx512_vnni", "amx_bf16", "amx_int8", "amx_tile",
            "bmi2", "f16c", "fma", "sse4_2")
EPYC = ("avx", "avx2", "avx512f", "avx512_vnni", "bmi2", "f16c", "fma", "sse4_2")


def _load_backend():
    spec = importlib.util.spec_from_file_location("llama_backend",
                                                  ROOT / "packaging" / "llama_backend.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def backend(monkeypatch):
    """The setup script on a simulated x86-64 Linux machine."""
    module = _load_backend()
    monkeypatch.delenv("HOMERACK_BACKEND", raising=False)
    monkeypatch.delenv("HOMERACK_AMX", raising=False)
    monkeypatch.setattr(module.platform, "system", lambda: "Linux")
    monkeypatch.setattr(module.platform, "machine", lambda: "x86_64")
    return module


def test_rpc_is_always_built(backend):
    for name in ("cpu", "cuda", "metal", "vulkan"):
        assert "-DGGML_RPC=ON" in backend.cmake_args(name)


def fake_driver(tmp_path, monkeypatch, computes=("8.9",), cuda="13.0"):
    """An NVIDIA driver as the build sees it: nvidia-smi on the PATH (a script that answers
    what the real one does for these two questions)."""
    bin_dir = tmp_path / "driver-bin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\nif [ \"$1\" = --query-gpu=compute_cap ]; then\n" +
                   "".join(f"echo {c}\n" for c in computes) +
                   f"else echo '| NVIDIA-SMI 580.65  Driver Version: 580.65  CUDA Version: {cuda} |'; fi\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")


@pytest.fixture
def no_gpu(backend, monkeypatch, tmp_path):
    """No driver, no nvcc, no display adapter; the caches in tmp_path."""
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("VULKAN_SDK", raising=False)
    monkeypatch.delenv("CMAKE_CUDA_ARCHITECTURES", raising=False)
    monkeypatch.setattr(backend, "_nvcc", lambda: None)
    monkeypatch.setattr(backend.gpu, "gpu_vendors", lambda: set())
    return backend


def test_cuda_needs_both_nvcc_and_a_gpu(no_gpu, monkeypatch, tmp_path):
    backend = no_gpu
    monkeypatch.setattr(backend, "_nvcc", lambda: "/usr/local/cuda/bin/nvcc")
    assert backend.choose_backend()[0] == "cpu"
    fake_driver(tmp_path, monkeypatch)
    assert backend.choose_backend() == ("cuda", "nvcc and an NVIDIA GPU are present")
    args = backend.cmake_args("cuda")
    assert "-DGGML_CUDA=on" in args and "-DCMAKE_CUDA_ARCHITECTURES=89" in args
    assert "CUDAToolkit_ROOT" not in args  # the system's toolkit


def test_a_driver_without_nvcc_gets_cuda_from_pypi_for_its_gpus_only(no_gpu, monkeypatch,
                                                                      tmp_path):
    backend = no_gpu
    assert backend.choose_backend() == ("cpu", "no GPU found")
    fake_driver(tmp_path, monkeypatch, computes=("8.9", "12.0", "8.9"))
    chosen, why = backend.choose_backend()
    assert chosen == "cuda" and "from PyPI" in why and "89;120" in why
    args = backend.cmake_args("cuda")
    root = tmp_path / "cache" / "homerack" / f"cuda-{backend.gpu.CUDA_RELEASE}" / "nvidia" / "cu13"
    assert f"-DCUDAToolkit_ROOT={root}" in args and f"{root}/bin/nvcc" in args
    assert "-DCMAKE_CUDA_ARCHITECTURES=89;120" in args  # the GPUs present, nothing else
    assert not (tmp_path / "cache").exists()  # chosen, nothing downloaded yet


@pytest.mark.parametrize("computes, cuda, says", [
    (("6.1",), "13.0", "older than CUDA 13"), (("8.6",), "12.4", "runs CUDA 12.4")])
def test_a_gpu_or_driver_cuda_13_cannot_serve_falls_back_and_says_why(
        no_gpu, monkeypatch, tmp_path, computes, cuda, says):
    backend = no_gpu
    fake_driver(tmp_path, monkeypatch, computes, cuda)
    monkeypatch.setattr(backend.gpu, "vulkan_build_tools", lambda: "glslc")
    chosen, why = backend.choose_backend()
    assert chosen == "cpu" and says in why and "apt install glslc" in why
    monkeypatch.setattr(backend.gpu, "vulkan_build_tools", lambda: None)
    assert backend.choose_backend()[0] == "vulkan"


def test_an_amd_or_intel_gpu_gets_vulkan_or_the_packages_to_install(no_gpu, monkeypatch):
    backend = no_gpu
    monkeypatch.setattr(backend.gpu, "gpu_vendors", lambda: {"AMD"})
    monkeypatch.setattr(backend.gpu, "vulkan_build_tools", lambda: "glslc spirv-headers")
    chosen, why = backend.choose_backend()
    assert chosen == "cpu" and "an AMD GPU" in why and "spirv-headers" in why
    monkeypatch.setattr(backend.gpu, "vulkan_build_tools", lambda: None)
    assert backend.choose_backend() == ("vulkan", "an AMD GPU and Vulkan's build tools")


def test_display_adapters_are_read_from_sysfs(backend, tmp_path):
    for card, vendor in (("card0", "0x8086"), ("card1", "0x1002"), ("card2", "0x1af4")):
        (tmp_path / card / "device").mkdir(parents=True)
        (tmp_path / card / "device" / "vendor").write_text(vendor + "\n")
    assert backend.gpu.gpu_vendors(tmp_path) == {"Intel", "AMD"}


@pytest.mark.slow
def test_cuda_from_pypi_compiles_for_the_gpus_architecture(backend, tmp_path):
    """The toolchain fetched from PyPI as a build on an NVIDIA machine does (cuBLAS, 423
    MB, left out here), then its nvcc compiles a kernel for compute 8.9 with no GPU and
    no system toolkit; the program it made, run here, is refused by the missing driver.
    A program of the driver API links against the driver stub and needs libcuda.so.1."""
    wheels = [w for w in backend.gpu.CUDA_WHEELS if "cublas" not in w]
    # its own cache beside the builds' (kept between runs: pip's cache holds the wheels,
    # unpacking them is most of the time)
    root = backend.gpu.install_cuda(wheels, cache=backend.gpu.cuda_home().parent / "tests")
    assert (root / "lib" / "libcudart.so").resolve().name == "libcudart.so.13"
    (tmp_path / "k.cu").write_text(
        "#include <cstdio>\n__global__ void twice(float *x) { x[threadIdx.x] *= 2; }\n"
        "int main() { float *d; printf(\"%s\\n\", cudaGetErrorString(cudaMalloc(&d, 64))); }\n")
    import subprocess
    built = subprocess.run([str(root / "bin" / "nvcc"), "-arch=sm_89", "-o", str(tmp_path / "k"),
                            str(tmp_path / "k.cu")], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    ran = subprocess.run([str(tmp_path / "k")], capture_output=True, text=True, timeout=60,
                         env={"LD_LIBRARY_PATH": str(root / "lib")})
    assert "driver" in ran.stdout.lower()  # no libcuda here: refused, not crashed
    # ggml's CUDA backend links the driver API: against the stub install_cuda made (PyPI
    # ships none), naming the driver's own library, which the dynamic linker finds at run
    # time or refuses to start without
    (tmp_path / "d.cu").write_text("#include <cuda.h>\n#include <cstdio>\n"
                                   "int main() { printf(\"%d\\n\", (int) cuInit(0)); }\n")
    linked = subprocess.run([str(root / "bin" / "nvcc"), "-o", str(tmp_path / "d"),
                             str(tmp_path / "d.cu"), "-L", str(root / "lib" / "stubs"), "-lcuda"],
                            capture_output=True, text=True, timeout=300)
    assert linked.returncode == 0, linked.stderr
    needed = subprocess.run(["readelf", "-d", str(tmp_path / "d")], capture_output=True,
                            text=True).stdout
    assert "[libcuda.so.1]" in needed
    assert f"-DCUDA_cuda_driver_LIBRARY={root}/lib/stubs/libcuda.so" in \
        backend.gpu.cuda_cmake_args(root)
    ran = subprocess.run([str(tmp_path / "d")], capture_output=True, text=True, timeout=60)
    assert ran.returncode != 0 and "libcuda.so.1" in ran.stderr
    preload = subprocess.run([sys.executable, "-c", backend.gpu.preload_line(root)],
                             capture_output=True, text=True, timeout=60)
    assert preload.returncode == 0, preload.stderr  # (cuBLAS absent: skipped, no error)


def test_macos_gets_metal_and_override_wins(backend, monkeypatch):
    monkeypatch.setattr(backend.platform, "system", lambda: "Darwin")
    assert backend.choose_backend()[0] == "metal"
    monkeypatch.setenv("HOMERACK_BACKEND", "vulkan")
    assert backend.choose_backend()[0] == "vulkan"


def test_amx_is_left_out_keeping_avx512_and_the_user_can_opt_back_in(backend, monkeypatch):
    native, portable = backend.candidates("cpu", AMX_XEON)
    assert native.cflags == "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    assert "GGML_NATIVE" not in native.cmake_args  # -march=native: AVX-512, repack kept
    assert any("#20824" in note for note in native.notes)
    monkeypatch.setenv("HOMERACK_AMX", "on")
    opted, _ = backend.candidates("cpu", AMX_XEON)
    assert opted.cflags == "" and backend.cache_dir(opted) != backend.cache_dir(native)


def test_a_compiler_that_predates_amx_gets_no_amx_flags(backend, monkeypatch):
    monkeypatch.setattr(backend, "_compiler_accepts", lambda flags: False)
    native, _ = backend.candidates("cpu", AMX_XEON)
    assert native.cflags == "" and "predates" in native.notes[0]


def test_a_cpu_without_amx_builds_as_before(backend):
    native, _ = backend.candidates("cpu", EPYC)
    assert native.cflags == "" and native.cmake_args == "-DGGML_RPC=ON" and not native.notes


def test_portable_build_asks_only_for_what_this_cpu_has(backend):
    _, portable = backend.candidates("cpu", ("sse4_2", "avx"))
    assert "-DGGML_NATIVE=OFF" in portable.cmake_args
    assert "-DGGML_AVX=ON" in portable.cmake_args and "-DGGML_AVX2=OFF" in portable.cmake_args


def test_another_cpu_needs_another_wheel_and_stamp(backend, monkeypatch, tmp_path):
    """A venv or wheel cache copied to a CPU with other features is rebuilt, not reused."""
    here, there = backend.candidates("cpu", EPYC)[0], backend.candidates("cpu", AMX_XEON)[0]
    assert backend.cache_dir(here) != backend.cache_dir(there)
    stamp = tmp_path / "stamp.json"
    monkeypatch.setattr(backend, "STAMP", stamp)
    stamp.write_text(json.dumps({**here.stamp(), "smoke": {"summary": "ok", "seconds": 1}}))
    assert backend._installed(here) and not backend._installed(there)


def test_installed_build_is_recognised():
    """The environment running these tests was set up by the script: a re-run is a no-op,
    and it passed its smoke test."""
    backend = _load_backend()
    builds = backend.candidates(backend.choose_backend()[0], backend.cpu_features())
    stamps = [backend._installed(build) for build in builds]
    assert any(stamps), sys.prefix
    assert next(s for s in stamps if s)["smoke"]["ok"]


@pytest.mark.slow
def test_smoke_test_passes_on_this_build_and_names_a_test_that_dies(monkeypatch):
    from llama_smoke import run_smoke

    result = run_smoke()
    assert result.ok, result.summary
    assert "Q4_K" in result.summary and "F16" in result.summary
    monkeypatch.setenv("HOMERACK_SMOKE_FAULT", "Q4_K")
    died = run_smoke()
    assert not died.ok and died.failed == "Q4_K"
    assert "SIGSEGV" in died.summary and "Q4_K" in died.summary


def test_smoke_judges_garbage_and_missing_reports():
    from llama_smoke import _judge

    kinds = ("F16", "Q4_0")
    ok = ['{"kind": "F16"}', '{"kind": "F16", "ok": true, "detail": null}',
          '{"kind": "Q4_0"}', '{"kind": "Q4_0", "ok": true, "detail": null}']
    assert _judge(ok, 0, "", 1.0, kinds).ok
    garbage = ok[:3] + ['{"kind": "Q4_0", "ok": false, "detail": "non-finite logits"}']
    judged = _judge(garbage, 0, "", 1.0, kinds)
    assert not judged.ok and judged.failed == "Q4_0" and "garbage" in judged.summary
    assert _judge(ok[:2], 0, "", 1.0, kinds).failed == "report"
    assert _judge(ok[:3], -4, "", 1.0, kinds).summary.startswith("the test process died with SIGILL")
    missing = _judge(['{"missing": "typing_extensions"}'], 3, "", 1.0, kinds)
    assert missing.failed == "environment" and "typing_extensions" in missing.summary


def test_a_build_that_fails_its_smoke_test_is_replaced_by_a_portable_one(backend, monkeypatch,
                                                                         tmp_path, capsys):
    """Setup's decisions with the 11-minute build and the install stubbed out: native dies,
    portable passes and is stamped; the next run goes straight to the portable build; when
    both fail, setup stops naming the tests that died."""
    from llama_smoke import SmokeResult

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(backend, "STAMP", tmp_path / "stamp.json")
    monkeypatch.setattr(backend, "cpu_features", lambda: AMX_XEON)
    monkeypatch.setattr(backend, "choose_backend", lambda: ("cpu", "test"))
    built, installed = [], []

    def build(build, into):
        built.append(build.variant)
        into.mkdir(parents=True, exist_ok=True)
        return into / f"{build.variant}.whl"

    monkeypatch.setattr(backend, "build_wheel", build)
    monkeypatch.setattr(backend, "_install", lambda wheel: installed.append(wheel.name))
    verdicts = {"native.whl": SmokeResult(False, "the test process died with SIGSEGV while "
                                                 "testing the Q4_K model", 1.0, "Q4_K"),
                "portable.whl": SmokeResult(True, "passed", 1.0)}
    monkeypatch.setattr(backend, "_smoke", lambda: verdicts[installed[-1]])
    monkeypatch.setattr(backend.subprocess, "run", lambda *a, **k: type(
        "Done", (), {"returncode": 0, "stdout": backend.VERSION + "\n"})())
    assert backend.main() == 0
    assert built == ["native", "portable"]
    assert json.loads((tmp_path / "stamp.json").read_text())["variant"] == "portable"
    out = capsys.readouterr().out
    assert "GGML_NATIVE=OFF" in out and "Q4_K" in out
    assert backend.main() == 0 and built == ["native", "portable"]  # nothing rebuilt
    assert "already installed (portable build" in capsys.readouterr().out

    (tmp_path / "stamp.json").unlink()
    verdicts["portable.whl"] = SmokeResult(False, "portable died too", 1.0, "F16")
    with pytest.raises(SystemExit) as stopped:
        backend.main()
    message = str(stopped.value)
    assert "does not run correctly" in message and "Q4_K" in message and "portable died" in message
    assert not (tmp_path / "stamp.json").exists()


def test_a_smoke_test_that_cannot_run_stops_setup_without_blaming_the_build(
        backend, monkeypatch, tmp_path):
    from llama_smoke import SmokeResult

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(backend, "STAMP", tmp_path / "stamp.json")
    monkeypatch.setattr(backend, "choose_backend", lambda: ("cpu", "test"))
    monkeypatch.setattr(backend, "build_wheel", lambda build, into: into / "native.whl")
    monkeypatch.setattr(backend, "_install", lambda wheel: None)
    monkeypatch.setattr(backend, "_smoke", lambda: SmokeResult(
        False, "the Python package 'typing_extensions' is not installed", 0.1, "environment"))
    with pytest.raises(SystemExit, match="could not run.*typing_extensions"):
        backend.main()
    assert not list((tmp_path / "cache").rglob("smoke-failed.txt"))


# -- the build's caches, checked by hash (issue 80) -----------------------------------

def test_a_cached_wheel_is_used_only_while_it_is_the_file_built(backend, monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    into = backend.gpu.private_folder(tmp_path / "cache" / "homerack" / "wheels" / "k")
    wheel = into / "llama_cpp_python-0.3.36-cp311-cp311-linux_x86_64.whl"
    wheel.write_bytes(b"the wheel as built")
    assert backend.cached_wheel(into) is None and not wheel.exists()  # no record: not trusted
    wheel.write_bytes(b"the wheel as built")
    (into / backend.WHEEL_HASH).write_text(json.dumps(
        {"wheel": wheel.name, "sha256": backend.gpu.sha256_of(wheel)}))
    assert backend.cached_wheel(into) == wheel
    wheel.write_bytes(b"a wheel put there since")
    assert backend.cached_wheel(into) is None and not wheel.exists()
    for folder in (into, into.parent, into.parent.parent):  # code lives here: the user's
        assert folder.stat().st_mode & 0o777 == 0o700


def _target_install(home, files: dict) -> None:
    """A `pip install --target` as pip leaves it: the files and the RECORD of their hashes."""
    import base64
    import hashlib

    info = home / "nvidia_cuda_runtime-13.5.37.dist-info"
    info.mkdir(parents=True)
    rows = []
    for name, data in files.items():
        (home / name).parent.mkdir(parents=True, exist_ok=True)
        (home / name).write_bytes(data)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        rows.append(f"{name},sha256={digest},{len(data)}")
    (info / "RECORD").write_text("\n".join([*rows, f"{info.name}/RECORD,,"]) + "\n")


def test_the_cuda_toolkit_is_checked_against_pips_record(backend, tmp_path):
    home = tmp_path / "cuda"
    _target_install(home, {"nvidia/cu13/lib/libcudart.so.13": b"\x7fELF runtime",
                           "nvidia/cu13/bin/nvcc": b"#!nvcc"})
    assert backend.gpu.toolkit_damage(home) is None
    (home / "nvidia/cu13/bin/nvcc").write_bytes(b"#!something else")
    assert "nvidia/cu13/bin/nvcc differs" == backend.gpu.toolkit_damage(home)
    (home / "nvidia/cu13/bin/nvcc").unlink()
    assert "missing" in backend.gpu.toolkit_damage(home)
    assert backend.gpu.toolkit_damage(tmp_path / "empty") == "no wheel's RECORD"


def test_the_start_loads_only_the_libraries_setup_checked(backend, tmp_path):
    import subprocess

    lib = tmp_path / "nvidia" / "cu13" / "lib"
    lib.mkdir(parents=True)
    source = tmp_path / "r.c"
    source.write_text("int cudart_here(void) { return 13; }\n")
    subprocess.run(["cc", "-shared", "-fPIC", "-Wl,-soname,libcudart.so.13", "-o",
                    str(lib / "libcudart.so.13"), str(source)],
                   check=True)
    line = backend.gpu.preload_line(tmp_path / "nvidia" / "cu13")
    loaded = subprocess.run([sys.executable, "-c", line + "import ctypes; "
                             "print(ctypes.CDLL('libcudart.so.13').cudart_here())"],
                            capture_output=True, text=True, timeout=60)
    assert loaded.stdout.strip() == "13", loaded.stderr
    (lib / "libcudart.so.13").write_bytes(b"not the library setup checked")
    skipped = subprocess.run([sys.executable, "-c", line], capture_output=True, text=True,
                             timeout=60)
    assert skipped.returncode == 0, skipped.stderr  # not loaded (loading it would fail)


def test_the_vulkan_headers_are_fetched_over_https_and_checked_before_use(backend, tmp_path,
                                                                            monkeypatch):
    import hashlib
    import http.server
    import threading

    assert backend.gpu.VULKAN_HEADERS_DEB[0].startswith("https://")
    served = tmp_path / "served"
    served.mkdir()
    (served / "vulkan.deb").write_bytes(b"not the package" * 1000)

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                             lambda *a: Quiet(*a, directory=str(served)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/vulkan.deb"
    try:
        with pytest.raises(SystemExit, match="expected SHA-256"):
            backend.gpu.install_vulkan_headers(tmp_path / "c1", (url, "0" * 64))
        monkeypatch.setattr(backend.gpu, "VULKAN_DEB_MAX", 4096)
        right = hashlib.sha256((served / "vulkan.deb").read_bytes()).hexdigest()
        with pytest.raises(SystemExit, match="larger than the package"):
            backend.gpu.install_vulkan_headers(tmp_path / "c2", (url, right))
    finally:
        server.shutdown()
    home = backend.gpu.vulkan_headers_home(tmp_path / "c1")
    assert not (home / "usr").exists() and not list(home.glob("*.deb"))
