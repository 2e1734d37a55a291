"""Plans MODEL with LAYERS (llama.cpp's count) on a llama.cpp RPC worker started here on
127.0.0.1, loads it by the plan and prints, as the last line, a JSON list of
{device, predicted, measured} bytes. Run by test_planner in its own process.

With a third argument N (a mixture-of-experts model), the routed experts of the first N
layers stay in this process's RAM, and the last line is a JSON object: those devices,
plus the greedy tokens and logits of a few steps there and in an all-local load."""

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from engine.catalog.gguf_file import GGUFInspector  # noqa: E402
from engine.machine.probe import probe  # noqa: E402
from engine.llama.runtime import LlamaModel, LoadSettings  # noqa: E402
from engine.model.loader import LoadJournal, load  # noqa: E402
from engine.machine.planner import Preferences  # noqa: E402
from engine.machine.rpc import add_worker  # noqa: E402


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_worker(endpoint: str) -> subprocess.Popen:
    code = f"import sys; sys.path.insert(0, {str(ROOT)!r}); " \
           f"from engine.machine.rpc import serve; serve({endpoint!r}, 1)"
    worker = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    host, port = endpoint.split(":")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection((host, int(port)), timeout=1).close()
            return worker
        except OSError:
            time.sleep(0.1)
    worker.kill()
    raise SystemExit("the RPC worker did not start")


GREEDY_STEPS = 8


def greedy(llama) -> tuple[list[int], list[list[float]]]:
    """Greedy tokens from a fixed prompt, and the logits each was picked from."""
    tokens = llama.tokenize("The capital of France is", add_special=True)
    llama.decode(tokens, 0)
    picked, logits = [], []
    for step in range(GREEDY_STEPS):
        row = llama.logits()
        logits.append([float(x) for x in row])
        picked.append(int(row.argmax()))
        llama.decode([picked[-1]], len(tokens) + step)
    return picked, logits


def devices(outcome) -> list[dict]:
    measured: dict[str, int] = {}
    for (device, _kind), size in outcome.llama.buffers.items():
        measured[device] = measured.get(device, 0) + size
    return [{"device": u.device, "predicted": u.total + u.mapped_gaps,
             "measured": measured.get(u.device, 0)}
            for u in outcome.plan.uses if u.total]


def main(model: str, layers: int, cpu_moe: int | None) -> None:
    endpoint = f"127.0.0.1:{free_port()}"
    worker = start_worker(endpoint)
    try:
        add_worker(endpoint)
        path = Path(model)
        info = GGUFInspector().inspect(path)
        prefs = Preferences(ctx=2048, min_ctx=2048, gpu_layers=layers, cpu_moe_layers=cpu_moe)
        outcome = load(path, info, LoadSettings(n_ctx=2048), probe(), prefs, LoadJournal(None))
        if cpu_moe is None:
            print(json.dumps(devices(outcome)))
            outcome.llama.close()
            return
        split_tokens, split_logits = greedy(outcome.llama)
        result = {"devices": devices(outcome), "cpu_moe_layers": outcome.plan.cpu_moe_layers,
                  "tokens": split_tokens}
        outcome.llama.close()
        local = LlamaModel(path, LoadSettings(n_ctx=2048))
        local_tokens, local_logits = greedy(local)
        local.close()
        result["local_tokens"] = local_tokens
        result["max_logit_difference"] = max(
            abs(a - b) for x, y in zip(split_logits, local_logits) for a, b in zip(x, y))
        print(json.dumps(result))
    finally:
        worker.kill()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else None)
