"""Plans MODEL with LAYERS (llama.cpp's count) on a llama.cpp RPC worker started here on
127.0.0.1, loads it by the plan and prints, as the last line, a JSON list of
{device, predicted, measured} bytes. Run by test_planner in its own process.

With a third argument N (a mixture-of-experts model), the routed experts of the first N
layers stay in this process's RAM, and the last line is a JSON object: those devices,
plus the greedy tokens and logits of a few steps there and in an all-local load.

With `remote-experts` instead of LAYERS, the reverse: every layer here, and the routed
experts of the first N layers on the worker (a machine with RAM to spare), reached through
a relay here that counts the bytes and round trips of each generated token."""

import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from engine.catalog.gguf_file import GGUFInspector  # noqa: E402
from engine.llama.probe import probe  # noqa: E402
from engine.llama.runtime import LlamaModel  # noqa: E402
from engine.settings import LoadSettings  # noqa: E402
from engine.model.loader import LoadJournal, load  # noqa: E402
from engine.machine.planner import Preferences  # noqa: E402
from engine.llama.rpc import add_worker  # noqa: E402
from fixtures.network import free_port  # noqa: E402


def start_worker(endpoint: str) -> subprocess.Popen:
    code = f"import sys; sys.path.insert(0, {str(ROOT)!r}); " \
           f"from engine.llama.rpc import serve; serve({endpoint!r}, 1)"
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


class Relay:
    """A loopback TCP relay to the worker that counts the bytes each way and the turns
    (a request followed by its answer: one round trip)."""

    def __init__(self, target: str):
        self.sent = self.received = self.turns = 0
        self._last = None
        self._lock = threading.Lock()
        self._target = target
        self._server = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"127.0.0.1:{self._server.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def figures(self) -> tuple[int, int, int]:
        with self._lock:
            return self.sent, self.received, self.turns

    def _accept(self) -> None:
        while True:
            client, _ = self._server.accept()
            host, port = self._target.split(":")
            upstream = socket.create_connection((host, int(port)))
            for a, b, way in ((client, upstream, "out"), (upstream, client, "in")):
                threading.Thread(target=self._pipe, args=(a, b, way), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, way: str) -> None:
        while data := source.recv(1 << 16):
            with self._lock:
                if way == "out":
                    self.sent += len(data)
                else:
                    self.received += len(data)
                    self.turns += self._last == "out"
                self._last = way
            sink.sendall(data)
        # the worker serves one client at a time: a closed client must reach it
        try:
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            pass


GREEDY_STEPS = 8


def greedy(llama, prompted=lambda: None) -> tuple[list[int], list[list[float]]]:
    """Greedy tokens from a fixed prompt, and the logits each was picked from;
    `prompted` is called once the prompt is evaluated."""
    tokens = llama.tokenize("The capital of France is", add_special=True)
    llama.decode(tokens, 0)
    prompted()
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


def remote_experts(model: str, layers: int, with_gpu: bool) -> None:
    """Every layer here, the routed experts of the first `layers` on the worker: the
    bytes each device holds against the shape's expert bytes, what crosses the link per
    generated token, and the logits against an all-local run. `with_gpu`: the layers on
    a second worker standing in for this machine's GPU, the experts' worker listed among
    the model's devices with no layers, as the cluster's plan does."""
    endpoint, gpu_endpoint = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    workers = [start_worker(endpoint)] + ([start_worker(gpu_endpoint)] if with_gpu else [])
    try:
        gpu = add_worker(gpu_endpoint)[0] if with_gpu else None
        relay = Relay(endpoint)
        (device, *_) = add_worker(relay.endpoint)
        path = Path(model)
        shape = GGUFInspector().inspect(path).shape
        placed = dict(n_gpu_layers=shape.n_layers + 1, devices=(gpu, device),
                      tensor_split=(1.0, 0.0)) if with_gpu else {}
        split = LlamaModel(path, LoadSettings(n_ctx=2048, cpu_moe_layers=layers,
                                              expert_device=device, **placed))
        loaded = relay.figures()
        marks = []
        split_tokens, split_logits = greedy(split, lambda: marks.append(relay.figures()))
        prompted, done = marks[0], relay.figures()
        held = {}
        for (name, _kind), size in split.buffers.items():
            held[name] = held.get(name, 0) + size
        split.close()
        local = LlamaModel(path, LoadSettings(n_ctx=2048))
        local_tokens, local_logits = greedy(local)
        local.close()
        per_token = [(b - a) / GREEDY_STEPS for a, b in zip(prompted, done)]
        print(json.dumps({
            "device": device, "held": held,
            "expert_bytes": sum(shape.experts(i) for i in range(layers)),
            "weights_sent_at_load": loaded[0], "tokens": split_tokens,
            "local_tokens": local_tokens,
            "per_token": {"sent": per_token[0], "received": per_token[1],
                          "round_trips": per_token[2]},
            "max_logit_difference": max(abs(a - b) for x, y in zip(split_logits, local_logits)
                                        for a, b in zip(x, y))}))
    finally:
        for worker in workers:
            worker.kill()


if __name__ == "__main__":
    if sys.argv[2].startswith("remote-experts"):
        remote_experts(sys.argv[1], int(sys.argv[3]), sys.argv[2].endswith("gpu"))
    else:
        main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else None)
