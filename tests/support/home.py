"""A paired device of a serving engine's home, as the tests drive one: paired by the
owner's code (`pair`), then its key on the sharing listener (`device`)."""

from __future__ import annotations

import httpx


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
