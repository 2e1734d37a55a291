"""Plans MODEL with LAYERS (llama.cpp's count) on a llama.cpp RPC worker started here on
127.0.0.1, loads it by the plan and prints, as the last line, a JSON list of
{device, predicted, measured} bytes. Run by test_planner in its own process."""

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
from engine.llama.runtime import LoadSettings  # noqa: E402
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


def main(model: str, layers: int) -> None:
    endpoint = f"127.0.0.1:{free_port()}"
    worker = start_worker(endpoint)
    try:
        add_worker(endpoint)
        path = Path(model)
        outcome = load(path, GGUFInspector().inspect(path), LoadSettings(n_ctx=2048), probe(),
                       Preferences(ctx=2048, min_ctx=2048, gpu_layers=layers), LoadJournal(None))
        measured: dict[str, int] = {}
        for (device, _kind), size in outcome.llama.buffers.items():
            measured[device] = measured.get(device, 0) + size
        outcome.llama.close()
        print(json.dumps([{"device": u.device, "predicted": u.total,
                           "measured": measured.get(u.device, 0)}
                          for u in outcome.plan.uses if u.total]))
    finally:
        worker.kill()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
