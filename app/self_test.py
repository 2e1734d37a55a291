"""`homerack self-test`: proves an installation works end to end, as a person would use
it: the engine started as the app starts it (a child process of this executable), the
starter chat model loaded, a question answered. `--gui PNG` does it through the desktop
window instead and saves what the window shows. `make package-test` runs both on the
packaged app; it works the same from a source checkout.

Prints the seconds from this process's launch to the first token of the answer (the
launch includes unpacking and importing the app: what a person waits for).
"""

from __future__ import annotations

import sys
import time

import httpx
import psutil

from engine.catalog.models import DEFAULT_MODEL

from .client import EngineClient, EngineError, StreamedReply
from .engine_proc import EngineProcess

PROMPT = "What is the capital of France? Answer in one sentence."


def since_launch() -> float:
    return time.time() - psutil.Process().create_time()


def check_engine(prompt: str = PROMPT, timeout: float = 180.0) -> int:
    engine = EngineProcess(["--model", DEFAULT_MODEL, "--response-cache-mib", "0"])
    reply, first = StreamedReply(), None
    try:
        client = EngineClient(engine.wait_ready(timeout), timeout=timeout)
        print(f"llama.cpp CPU backend: {client.hardware()['cpu_backend']}", flush=True)
        messages = [{"role": "user", "content": prompt}]
        for _piece in client.stream_chat(messages, reply, model=DEFAULT_MODEL,
                                         temperature=0, max_tokens=48):
            first = first or since_launch()
        print(f"the model ran on: {client.health().get('offload')}", flush=True)
        client.close()
    except RuntimeError as exc:  # it did not start; the message ends with its output
        print(f"self-test failed: {exc}", file=sys.stderr)
        return 1
    except (EngineError, httpx.HTTPError) as exc:
        tail = "\n".join(engine.output[-20:])
        print(f"self-test failed: {exc}\nthe engine's last lines:\n{tail}", file=sys.stderr)
        return 1
    finally:
        engine.stop()
    if not reply.text.strip():
        print(f"self-test failed: {DEFAULT_MODEL} gave no answer ({reply.finish_reason})",
              file=sys.stderr)
        return 1
    print(f"answer from {reply.model}: {reply.text.strip()!r}")
    print(f"first token {first:.1f} s after launch; self-test passed", flush=True)
    return 0
