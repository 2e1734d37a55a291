"""Driving engines: an in-process Engine's jobs (`run`, `Collector`) and real `homerack
serve` processes (`start_engine`)."""

from __future__ import annotations

import os
import queue
import shutil
import time
from pathlib import Path

from engine.events import SamplingParams

GREEDY = SamplingParams(temperature=0)


class Collector:
    """An Engine job's `emit`: collects its events; result() waits for the end."""

    def __init__(self):
        self.events = queue.Queue()

    def __call__(self, event):
        self.events.put(event)

    def result(self, timeout=60):
        from engine.events import Delta, Failed, Finished, Started

        started, text = None, ""
        while True:
            event = self.events.get(timeout=timeout)
            if isinstance(event, Started):
                started = event
            elif isinstance(event, Delta):
                text += event.text
            elif isinstance(event, (Finished, Failed)):
                return started, text, event


def run(engine, **request):
    """Submit one GenerationRequest and wait for (Started, text, Finished or Failed)."""
    from engine.events import GenerationRequest

    collector = Collector()
    engine.submit(GenerationRequest(**request), collector)
    return collector.result()


def settled(engine) -> dict:
    """An in-process engine's batching figures once no request runs (they are published
    by the worker a moment after the last event)."""
    from engine.batching.lane import PUBLISH_S

    deadline = time.monotonic() + 5
    while engine.status()["batching"].get("active") and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(PUBLISH_S * 2)
    return engine.status()["batching"]


GGUF_INFO = Path("cache") / "gguf-info.json"  # the inspector's cache, under a home


def seed_gguf_info(home: Path, new_home: Path) -> None:
    """Give `new_home` what the session home's inspector already read of the models they
    share (keyed by each file's real path, size and mtime, so valid in both): each engine
    started on a fresh home otherwise parses every model's header in the background again,
    Gemma's 262,144-token vocabulary twice (itself and gemma-style): ~7 s of CPU that the
    test's own requests wait behind. A model only this test has is read as before."""
    seeded, target = home / GGUF_INFO, new_home / GGUF_INFO
    if seeded.exists() and not target.exists():
        target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        shutil.copyfile(seeded, target)
        target.chmod(0o600)  # as the engine writes it (test_private_files)


def start_engine(home: Path, name: str, args: list[str], env: dict | None = None):
    """A real `homerack serve` with a HOMERACK_HOME of its own under `home`, sharing the
    starter models: (its process, the address it listens on, its models folder).

    Without the response cache unless `args` ask for it: these engines are started to
    watch them generate, and a repeated greedy question would be replayed instead."""
    from app.engine_proc import EngineProcess

    if "--response-cache-mib" not in args:
        args = [*args, "--response-cache-mib", "0"]
    env = dict(os.environ, HOMERACK_HOME=str(home / name), **(env or {}))
    (home / name / "data").mkdir(parents=True, exist_ok=True)
    seed_gguf_info(home, home / name)
    models = home / name / "data" / "models"
    if not models.exists():
        models.symlink_to(home / "data" / "models")
    process = EngineProcess(args, env=env)
    return process, process.wait_ready(), models


def start_tiny_engine(home: Path, name: str, tiny_model: Path):
    """start_engine with the tiny model alone in its folder, loaded: (process, address)."""
    (home / "data" / "models").mkdir(parents=True, exist_ok=True)
    (home / "data" / "models" / "tiny.gguf").symlink_to(tiny_model)
    process, address, _ = start_engine(home, name, ["--model", "tiny", "--ctx", "512"])
    return process, address


def api_client(address, timeout: float = 120):
    """An httpx client of a serving engine's API, with its token."""
    import httpx

    return httpx.Client(base_url=address.url, timeout=timeout,
                        headers={"Authorization": f"Bearer {address.token}"})


def models_once_read(http, limit_s: float = 120) -> dict[str, dict]:
    """/v1/models by id, once the engine has read every file's header (its kind is null
    meanwhile: Gemma's 262k-token vocabulary takes seconds to parse at the first start)."""
    deadline = time.monotonic() + limit_s
    while True:
        models = {m["id"]: m for m in http.get("/v1/models").json()["data"]}
        if all(m["kind"] for m in models.values()) or time.monotonic() > deadline:
            return models
        time.sleep(0.2)
