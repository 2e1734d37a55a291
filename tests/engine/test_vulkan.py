"""Homerack on a GPU through llama.cpp's Vulkan backend, proven here on Mesa's software
GPU (lavapipe): the build of packaging/vulkan_extra.py (build/llama-vulkan/, first on a
child's PYTHONPATH), llama.cpp told to list a CPU-type Vulkan device
(GGML_VK_VISIBLE_DEVICES). `homerack hardware` and `homerack plan` name the device and its
memory, the plan puts the layers on it, the starter's answers match the CPU backend's
(first-token log-probabilities within a tolerance measured here, greedy text equal), and a
model whose logits are NaN still ends its request with a model_error."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import openai
import pytest

from support import ROOT
from support.engines import api_client, start_engine
from support.models import STARTER, with_nan_rows

VULKAN = ROOT / "build" / "llama-vulkan"
pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not (VULKAN / ".homerack-llama.json").exists(),
    reason="no Vulkan build: make test makes one where glslc, libvulkan-dev, spirv-headers "
           "and mesa-vulkan-drivers are installed (packaging/vulkan_extra.py)")]
ON_VULKAN = {"PYTHONPATH": os.pathsep.join([str(VULKAN), str(ROOT)]),
             "GGML_VK_VISIBLE_DEVICES": "0"}
# The last token's log-probabilities of the CPU's top 20, Vulkan (lavapipe) against the CPU
# backend, on these prompts: measured at most 0.46 apart, another prompt's 6.7 or more (on
# four prompts, these two among them):
# 1.0 tells a right answer from a mix-up. A greedy pick whose margin on the CPU is over
# twice 0.46 is the same on both.
TOLERANCE = 1.0
GREEDY_MARGIN = 1.0
# Prompts whose greedy picks have margins (the first: all 12 over 1.7 on SmolLM2)
PROMPTS = ["1, 2, 3, 4, 5, 6, 7, 8,", "The capital of France is Paris. The capital of Germany is"]


def homerack(home, *args) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "app", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=180,
                          env={**os.environ, **ON_VULKAN, "HOMERACK_HOME": str(home)})
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def test_hardware_and_the_plan_name_the_vulkan_device(home):
    shown = homerack(home, "hardware").stdout
    assert "Vulkan0" in shown and "llvmpipe" in shown, shown
    listed = json.loads(homerack(home, "hardware", "--json").stdout)  # ggml's device props read
    assert [d["name"] for d in listed["devices"]] == ["Vulkan0", "CPU"] and not listed["same_gpu"]
    hidden = subprocess.run(  # lavapipe not asked for: no GPU, and said so
        [sys.executable, "-m", "app", "hardware"], cwd=ROOT, capture_output=True, text=True,
        timeout=180, env={**os.environ, "PYTHONPATH": ON_VULKAN["PYTHONPATH"],
                          "HOMERACK_HOME": str(home)})
    assert "runs on the CPU: no GPU driver found (llama.cpp's Vulkan backend found no GPU)" \
        in hidden.stdout, hidden.stdout + hidden.stderr
    planned = json.loads(homerack(home, "plan", STARTER, "--json").stdout)
    assert planned["gpus"] == ["Vulkan0"] and planned["n_gpu_layers"] > 0, planned
    vulkan = next(d for d in planned["devices"] if d["device"] == "Vulkan0")
    assert vulkan["weights"] > 0 and vulkan["budget"] > vulkan["total"]


def log_softmax(rows: np.ndarray) -> np.ndarray:
    shifted = rows - rows.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def logits_on(device: str, model, out) -> dict:
    env = {**os.environ, **(ON_VULKAN if device != "CPU" else {"PYTHONPATH": str(ROOT)})}
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "support" / "device_logits.py"),
                           str(model), str(out), device, *PROMPTS], capture_output=True,
                          text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return dict(np.load(out))


def test_the_starter_on_lavapipe_computes_what_the_cpu_does(home, tmp_path):
    """Every layer on the Vulkan device against the CPU backend: the prompts' last-token
    log-probabilities within TOLERANCE, and greedy tokens the same up to the first step
    whose margin on the CPU is under GREEDY_MARGIN (a nearer tie may turn either way:
    lavapipe computes in other precisions and orders)."""
    model = home / "data" / "models" / f"{STARTER}.gguf"
    vulkan = logits_on("Vulkan0", model, tmp_path / "vulkan.npz")
    cpu = logits_on("CPU", model, tmp_path / "cpu.npz")
    ours, theirs = log_softmax(vulkan["logits"]), log_softmax(cpu["logits"])
    for i, row in enumerate(theirs):
        top = np.argsort(-row)[:20]
        assert np.abs(ours[i][top] - row[top]).max() < TOLERANCE, i
        other = theirs[(i + 1) % len(theirs)]  # the comparison can tell prompts apart
        assert np.abs(ours[i][top] - other[top]).max() > 3 * TOLERANCE, i
    compared = 0
    for ours, theirs, margins in zip(vulkan["greedy"], cpu["greedy"], cpu["margins"]):
        for token, expected, margin in zip(ours, theirs, margins):
            if margin < GREEDY_MARGIN:
                break  # a near tie: what follows may be another text on either backend
            assert token == expected, (ours, theirs, margins)
            compared += 1
    assert compared >= 12, (vulkan["greedy"], cpu["greedy"], cpu["margins"])


def test_the_engine_plans_its_layers_onto_lavapipe_and_answers(home):
    process, address, _ = start_engine(home, "vk-serve", [
        "--model", STARTER, "--ctx", "1024", "--parallel", "1"], env=ON_VULKAN)
    try:
        client = openai.OpenAI(base_url=f"{address.url}/v1", api_key=address.token)
        answer = client.chat.completions.create(
            model=STARTER, messages=[{"role": "user", "content": PROMPTS[0]}], temperature=0,
            max_tokens=8)
        assert answer.choices[0].message.content and answer.usage.completion_tokens > 0
        with api_client(address) as http:  # (loaded by the request)
            health = http.get("/health").json()
        assert health["offload"] == "31 layers on GPU", health["offload"]
        assert health["no_gpu_driver"] is False  # the window names no missing driver
        assert [d["device"] for d in health["memory"]["devices"]][:1] == ["Vulkan0"], health
    finally:
        process.stop()


def test_a_nan_model_on_lavapipe_ends_with_a_model_error(home, tiny_model):
    models = home / "data" / "models"
    nan = models / "nan-output-vk.gguf"
    if not nan.exists():
        with_nan_rows(tiny_model, nan, "output.weight")
    process, address, _ = start_engine(home, "vk-nan", ["--model", "nan-output-vk", "--ctx",
                                                       "512", "--parallel", "1"], env=ON_VULKAN)
    try:
        client = openai.OpenAI(base_url=f"{address.url}/v1", api_key=address.token,
                               max_retries=0)
        with pytest.raises(openai.APIStatusError) as raised:
            client.chat.completions.create(model="nan-output-vk", temperature=0, max_tokens=4,
                                           messages=[{"role": "user", "content": "hi"}])
    finally:
        process.stop()
    assert raised.value.status_code == 500 and raised.value.body["type"] == "model_error"
    assert "NaN" in raised.value.body["message"] and "Vulkan0" in raised.value.body["message"]
