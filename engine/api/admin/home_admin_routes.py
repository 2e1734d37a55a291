"""The owner's side of sharing with the home (the loopback listener, with the token):
the sharing listener on or off, pairing codes, the paired devices and their limits,
and who is waiting for a turn."""

from __future__ import annotations

import ipaddress

from fastapi import APIRouter
from pydantic import BaseModel, Field, field_validator

from ... import status as engine_status
from ...engine import Engine
from ...errors import InvalidRequest

DEFAULT_SHARE_PORT = 8580


class ShareBody(BaseModel):
    enabled: bool
    # an address of this machine; None: its LAN address (0.0.0.0, every interface, only
    # when asked)
    host: str | None = Field(None, max_length=100)
    port: int = Field(DEFAULT_SHARE_PORT, ge=0, le=65535)

    @field_validator("host")
    @classmethod
    def _an_address(cls, host: str | None) -> str | None:
        if host is None:
            return None
        try:
            return str(ipaddress.ip_address(host))
        except ValueError:
            raise ValueError("an IP address of this machine (0.0.0.0: every one)") from None


class NameBody(BaseModel):
    name: str = Field(max_length=100)


class DeviceLimits(BaseModel):
    parallel: int | None = Field(None, ge=1, le=256)
    tokens_per_minute: int | None = Field(None, ge=0)


class HomeChoices(BaseModel):
    parallel: int | None = Field(None, ge=1, le=256)
    tokens_per_minute: int | None = Field(None, ge=0)
    owner_first: bool | None = None
    shared: list[str] | None = Field(None, max_length=1000)
    share_all: bool = False  # shared: None means "unchanged"; this means "every model"


def router(engine: Engine, door) -> APIRouter:
    """`door`: home_door.HomeDoor, the sharing listener (given: the route modules import
    no other route module, and the door serves them)."""
    api = APIRouter()

    def status() -> dict:
        return engine_status.home_status(engine)

    @api.get("/v1/home")
    async def show():
        return status()

    @api.put("/v1/home/share")
    async def share(body: ShareBody):
        if body.enabled:
            try:
                await door.open(body.host, body.port)
            except (OSError, ValueError) as exc:  # not an address here, or the port taken
                why = getattr(exc, "strerror", None) or str(exc)
                raise InvalidRequest(f"host: cannot listen on {body.host}:{body.port} ({why})",
                                     param="host") from None
        else:
            await door.close()
        return status()

    @api.post("/v1/home/devices")
    async def add(body: NameBody):
        made = engine.home.devices.add(body.name)
        return {**made.public(), "url": engine.home.sharing.get("url")}

    @api.get("/v1/home/devices")
    async def listed():
        return {"data": status()["devices"]}

    @api.delete("/v1/home/devices/{name}")
    async def remove(name: str):
        engine.home.revoke(name)
        return {"name": name, "removed": True}

    @api.patch("/v1/home/devices/{name}")
    async def limit(name: str, body: DeviceLimits):
        engine.home.devices.set_limits(name, body.parallel, body.tokens_per_minute)
        return {"name": name, **body.model_dump()}

    @api.patch("/v1/home")
    async def choose(body: HomeChoices):
        shared = None if body.share_all else body.shared if body.shared is not None else ...
        engine.home.choose(body.parallel, body.tokens_per_minute, body.owner_first, shared)
        return status()

    return api
