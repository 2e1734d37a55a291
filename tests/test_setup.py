"""The llama.cpp backend choice made by `make run` / `make test`."""

import importlib.util
import sys

import pytest

from conftest import ROOT


@pytest.fixture
def backend(monkeypatch):
    spec = importlib.util.spec_from_file_location("llama_backend",
                                                  ROOT / "packaging" / "llama_backend.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.delenv("HOMERACK_BACKEND", raising=False)
    monkeypatch.setattr(module.platform, "system", lambda: "Linux")
    return module


def test_rpc_is_always_built(backend):
    for name in ("cpu", "cuda", "metal", "vulkan"):
        assert "-DGGML_RPC=ON" in backend.cmake_args(name)


def test_cuda_needs_both_nvcc_and_a_gpu(backend, monkeypatch):
    monkeypatch.setattr(backend, "_nvcc", lambda: "/usr/local/cuda/bin/nvcc")
    monkeypatch.setattr(backend, "_has_nvidia_gpu", lambda: False)
    assert backend.choose_backend()[0] == "cpu"
    monkeypatch.setattr(backend, "_has_nvidia_gpu", lambda: True)
    assert backend.choose_backend()[0] == "cuda"
    assert "-DGGML_CUDA=on" in backend.cmake_args("cuda")


def test_macos_gets_metal_and_override_wins(backend, monkeypatch):
    monkeypatch.setattr(backend.platform, "system", lambda: "Darwin")
    assert backend.choose_backend()[0] == "metal"
    monkeypatch.setenv("HOMERACK_BACKEND", "vulkan")
    assert backend.choose_backend()[0] == "vulkan"


def test_installed_build_is_recognised(backend):
    """The environment running these tests was set up by the script: a re-run is a no-op."""
    args = backend.cmake_args(backend.choose_backend()[0])
    assert backend._installed_matches(backend._wanted(args)), sys.prefix
