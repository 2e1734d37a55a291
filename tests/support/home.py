"""A serving engine sharing with its home, and a paired device of it, as the tests drive
them: the engine with the tiny model and the starter, its sharing listener on 127.0.0.2
(standing for the LAN: `sharing_engine`), a device paired by the owner's code (`pair`),
then its key on that listener (`device`)."""

from __future__ import annotations

import time
from contextlib import contextmanager

import httpx

from fixtures.network import free_port

from .engines import api_client, models_once_read, start_engine
from .models import STARTER

LAN = "127.0.0.2"


@contextmanager
def sharing_engine(home, tiny_model, starters_dir, name: str, args: list[str]):
    """A real `homerack serve ARGS --share-home` on 127.0.0.2, the tiny model and the
    starter in its folder: (the owner's client, the LAN's URL, its address, its process),
    once sharing is open and the models are read."""
    models = home / "data" / "models"
    models.mkdir(parents=True)
    (models / "tiny.gguf").symlink_to(tiny_model)
    (models / f"{STARTER}.gguf").symlink_to(starters_dir / f"{STARTER}.gguf")
    port = free_port(LAN)
    process, address, _ = start_engine(home, name, [
        *args, "--share-home", "--share-host", LAN, "--share-port", str(port)])
    try:
        with api_client(address) as owner:
            deadline = time.monotonic() + 30
            while not owner.get("/v1/home").json()["enabled"] and time.monotonic() < deadline:
                time.sleep(0.05)
            models_once_read(owner)
            yield owner, f"http://{LAN}:{port}", address, process
    finally:
        process.stop()


def pair(owner, lan: str, name: str) -> str:
    """A device called `name` paired through the LAN listener; its key."""
    made = owner.post("/v1/home/devices", json={"name": name}).json()
    assert made["url"] == lan and len(made["code"]) == 6
    paired = httpx.post(f"{lan}/pair", json={"code": made["code"]})
    assert paired.status_code == 200, paired.text
    cookie = paired.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie
    return paired.json()["key"]


def device(lan: str, key: str, **kw) -> httpx.Client:
    return httpx.Client(base_url=lan, headers={"Authorization": f"Bearer {key}"}, timeout=120,
                        **kw)
