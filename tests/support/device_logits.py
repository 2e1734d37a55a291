"""Run as a child process (`python tests/support/device_logits.py MODEL OUT DEVICE PROMPT...`):
the last-token logits of each prompt, the model's every layer on DEVICE ("CPU": none),
evaluated by engine/llama's LlamaModel as the engine loads a model, then 12 greedy tokens
(argmax) of each with the margin of each pick over the runner-up, saved to OUT (.npz). A process of its own: the build on its PYTHONPATH
(build/llama-vulkan/ for Vulkan) is the one it runs."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from engine.llama.runtime import LlamaModel
from engine.settings import LoadSettings


def main(model: str, out: str, device: str, *prompts: str) -> None:
    on_gpu = device != "CPU"
    llama = LlamaModel(Path(model), LoadSettings(
        n_ctx=512, n_gpu_layers=999 if on_gpu else 0, devices=(device,) if on_gpu else ()))
    logits, greedy, margins = [], [], []
    for seq, prompt in enumerate(prompts):
        tokens = llama.tokenize(prompt, add_special=True, parse_special=True)
        llama.decode(tokens, 0, 0)
        logits.append(np.array(llama.logits(), copy=True))
        made, margin = [], []
        for _ in range(12):
            row = llama.logits()
            second, first = np.argsort(row)[-2:]
            made.append(int(first))
            margin.append(float(row[first] - row[second]))
            llama.decode(made[-1:], len(tokens) + len(made) - 1, 0)
        greedy.append(made)
        margins.append(margin)
        llama.forget(0, 0)
    np.savez(out, logits=np.stack(logits), greedy=np.array(greedy), margins=np.array(margins))
    llama.close()


if __name__ == "__main__":
    main(*sys.argv[1:])
