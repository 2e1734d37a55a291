"""The household as the engine holds it: the paired devices, what they use, their
conversations, and the owner's choices for them (limits, the owner's precedence, the
models shared), kept in a private file beside the devices."""

from __future__ import annotations

import itertools
import json
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from ..errors import Forbidden, InvalidRequest
from ..events import LOCAL_DOOR
from ..files import write_atomic
from .conversations import Conversations
from .devices import Device, Devices
from .meter import Limits, Meter, Metered


@dataclass(frozen=True)
class Choices:
    limits: Limits = Limits()
    owner_first: bool = True   # the owner's requests are admitted before the devices'
    shared: tuple[str, ...] | None = None  # model ids the devices may use; None: all


class Household:
    def __init__(self, folder: Path | None):
        if folder is not None:
            folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._file = folder / "home.json" if folder else None
        self.devices = Devices(folder / "devices.json" if folder else None)
        self.conversations = Conversations(folder / "conversations.sqlite" if folder else None)
        self.meter = Meter()
        self.choices = self._read()
        self.sharing: dict = {"enabled": False, "url": None}  # told by the listener
        self.door = None  # the listener's caps (api/listeners.DoorCaps): what the LAN holds

    def _read(self) -> Choices:
        try:
            raw = json.loads(self._file.read_text(encoding="utf-8"))
            return Choices(Limits(**raw["limits"]), bool(raw["owner_first"]),
                           tuple(raw["shared"]) if raw.get("shared") is not None else None)
        except (AttributeError, OSError, ValueError, KeyError, TypeError):
            return Choices()

    def choose(self, parallel=None, tokens_per_minute=None, owner_first=None,
               shared=..., ) -> Choices:
        """The owner's choices, changed where given, kept."""
        limits = self.choices.limits
        if parallel is not None:
            limits = replace(limits, parallel=_count(parallel, "parallel", 1))
        if tokens_per_minute is not None:
            limits = replace(limits, tokens_per_minute=_count(
                tokens_per_minute, "tokens_per_minute", 0))
        choices = replace(self.choices, limits=limits)
        if owner_first is not None:
            choices = replace(choices, owner_first=bool(owner_first))
        if shared is not ...:
            choices = replace(choices, shared=None if shared is None else tuple(shared))
        self.choices = choices
        if self._file is not None:
            write_atomic(self._file, json.dumps(asdict(choices), indent=1))
        return choices

    def limits_of(self, device: Device | None) -> Limits:
        limits = self.choices.limits
        if device is None:
            return limits
        return Limits(device.parallel or limits.parallel,
                      limits.tokens_per_minute if device.tokens_per_minute is None
                      else device.tokens_per_minute)

    def take(self, job) -> None:
        """A request on its way to a lane: the owner's given precedence when chosen; a
        device's checked against what is shared and its limits, then metered."""
        client = job.request.client
        if client is None and self.choices.owner_first:
            job.request = replace(job.request, precedence=True)
        if not is_device(client):
            return
        self.check_shared(job.request.model.id)
        if job.request.draft_model is not None:
            self.check_shared(job.request.draft_model.id, "draft_model")
        self.meter.take(client, job, self.limits_of(self.devices.get(client)))
        job.emit = Metered(job.emit, self.meter, client, job.id)

    @contextmanager
    def working(self, client: str | None, model_id: str | None, param: str = "model",
                counted: bool = True):
        """A device's request that generates no chat (speech, a transcription, embeddings,
        a token count): its model checked against what is shared, and the request
        counted in flight against the device's limits while it runs; what it used
        (`charge.tokens`, set by the route) counts against its tokens a minute. The
        owner's (`client` None) and the Ollama door's pass as they are. `counted`: one of
        its requests today (a turn being built is counted when it is submitted)."""
        charge = Charge()
        if not is_device(client):
            yield charge
            return
        if model_id is not None:
            self.check_shared(model_id, param)
        self.meter.take(client, charge, self.limits_of(self.devices.get(client)), counted)
        try:
            yield charge
        finally:
            self.meter.ended(client, charge.id, charge.tokens, 0.0)

    def release(self, job) -> None:
        """A device's request that never reached a lane is no longer in flight."""
        if is_device(job.request.client):
            self.meter.ended(job.request.client, job.id, 0, 0.0)

    def check_shared(self, model_id: str, param: str = "model") -> None:
        if self.choices.shared is not None and model_id not in self.choices.shared:
            raise Forbidden(f"the owner does not share {model_id!r} with this home's "
                            "devices", param=param)

    def revoke(self, name: str) -> Device:
        """The device's key stops working now, and what it has running stops."""
        device = self.devices.remove(name)
        self.meter.cancel(name)
        self.conversations.forget_device(name)
        return device

    def status(self) -> dict:
        return {**self.sharing, "door": self.door.status() if self.door else None,
                "owner_first": self.choices.owner_first,
                "limits": asdict(self.choices.limits),
                "shared": list(self.choices.shared) if self.choices.shared is not None else None,
                "devices": [{**d.public(), **self.meter.status(d.name)}
                            for d in self.devices.listed()],
                "codes": [c.public() for c in self.devices.codes()],
                "codes_withdrawn": self.devices.withdrawn}


class Charge:
    """A device's request that is no generation job, as the meter counts it."""
    _ids = itertools.count(-1, -1)  # apart from the jobs' ids

    def __init__(self):
        self.id, self.tokens = next(Charge._ids), 0

    def cancel(self) -> None:
        """(A revoked key: the work ends on its own, in bounded time.)"""


def is_device(client: str | None) -> bool:
    """A request's client is a paired device (checked, metered): not the owner (None),
    nor a program of this computer through the Ollama door (LOCAL_DOOR)."""
    return client is not None and client != LOCAL_DOOR


def _count(value, name: str, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise InvalidRequest(f"{name}: a whole number, at least {least}", param=name)
    return value
