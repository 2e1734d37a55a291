"""Paired machines serving whole models as replicas: each runs an engine of its own (the
worker's `--replica`), and this host's API is the one front door (api/server/front_door.py),
which sends each generation request to the machine that should answer it.

Per replica: a tunnel (a forwarder on 127.0.0.1 whose connections are carried over TLS
to the worker's gateway in mode "api", its certificate pinned, as the RPC forwarder does)
and what a poll of its engine says every POLL_S: the models it has and holds, the
requests running and queued, its measured decode speed. `choose` is a pure function of
those figures; a conversation's next turn goes back to the machine that holds its KV
(sticky by its opening) unless that machine is busier by more than a slot.

Each replica's gateway is also pinged as a pipeline stage's is (link.WorkerLink: a
heartbeat every 0.3 s, lost after 1.8 s of silence), so a frozen machine is noticed within
2 s, in the middle of a stream too. A replica that stops answering is left out, with why,
until a poll reaches it again.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
from collections import OrderedDict
from dataclasses import dataclass, replace

import httpx

from .link import LinkLoop, WorkerLink, open_link
from .pairing import Pairing
from .protocol import Refused
from .relay import Half, first_closed, from_this_process, join

POLL_S = 1.0
LOAD_COST = 0.5      # slot-equivalents a model not loaded yet costs (its load)
STICKY_SLACK = 1.0   # a conversation stays on its machine unless busier by this much
STICKY_KEYS = 4096


@dataclass(frozen=True)
class MachineLoad:
    """What a machine can do for a request now."""
    name: str
    models: frozenset[str]          # the models it has
    loaded: frozenset[str]          # those it holds in memory
    busy: float                     # requests running and queued, per slot
    speed: dict                     # model id -> measured decode tokens/s (when known)
    local: bool = False
    slots: int = 1                  # requests it generates at once


def choose(machines: list[MachineLoad], model: str, sticky: str | None = None) -> MachineLoad | None:
    """The machine for a request for `model`: the least cost, where cost is the queue a
    request joins (per slot, plus LOAD_COST when the model must load) over the machine's
    measured speed relative to the others' (when every candidate has one); this machine
    on a tie; `sticky` (the machine that served the conversation) unless its cost is
    STICKY_SLACK over the best. None when no machine has the model."""
    candidates = [m for m in machines if model in m.models]
    if not candidates:
        return None
    speeds = [m.speed.get(model) for m in candidates]
    known = all(speeds)

    def cost(m: MachineLoad) -> float:
        queue = m.busy + (0.0 if model in m.loaded else LOAD_COST)
        return (queue + 1) * max(speeds) / m.speed[model] - 1 if known else queue

    best = min(candidates, key=lambda m: (cost(m), not m.local))
    held = next((m for m in candidates if m.name == sticky), None)
    if held is not None and cost(held) <= cost(best) + STICKY_SLACK:
        return held
    return best


def opening_key(body: dict) -> str | None:
    """A conversation's identity across its turns: the client's `prompt_cache_key` where it
    sends one (OpenAI's hint: requests sharing it share a prefix, Codex sends its session's
    id), else its system prompt and its messages up to the first question (chat, Anthropic
    messages, Responses input), or a raw prompt's start."""
    hint = body.get("prompt_cache_key")
    if isinstance(hint, str) and hint:
        text = json.dumps(["prompt_cache_key", body.get("model"), hint[:1024]])
        return hashlib.sha256(text.encode()).hexdigest()[:32]
    first = None
    for field in ("messages", "input"):
        items = body.get(field)
        if isinstance(items, list) and items:
            asked = next((i for i, m in enumerate(items)
                          if isinstance(m, dict) and m.get("role") == "user"), 0)
            first = items[:asked + 1]
        elif isinstance(items, str):
            first = items[:512]
    if first is None and isinstance(body.get("prompt"), str):
        first = body["prompt"][:512]
    if first is None:
        return None
    text = json.dumps([body.get("model"), body.get("system"), first], sort_keys=True,
                      default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


class Tunnel:
    """A forwarder on 127.0.0.1 to a replica's engine; each connection is carried to the
    worker's gateway in mode "api" (only connections this process opened)."""

    def __init__(self, pairing: Pairing):
        self.pairing = pairing
        self.url: str | None = None
        self.token: str | None = None  # the replica engine's own, given by its gateway
        self._server = None
        self._tasks: set[asyncio.Task] = set()

    async def start(self) -> None:
        _, writer, answer = await open_link(self.pairing.address, "api",
                                            self.pairing.fingerprint, self.pairing.token)
        writer.close()
        self.token = str(answer.get("engine_token") or "")
        self._server = await asyncio.get_running_loop().create_server(
            lambda: Half(on_made=self._accept), "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    def _accept(self, local: Half) -> None:
        task = asyncio.get_running_loop().create_task(self._carry(local))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _carry(self, local: Half) -> None:
        transport = local.transport
        if not from_this_process(transport.get_extra_info("peername"),
                                 transport.get_extra_info("sockname")):
            transport.close()
            return
        try:
            _, writer, _ = await open_link(self.pairing.address, "api", self.pairing.fingerprint,
                                           self.pairing.token)
        except (Refused, ConnectionError, OSError):
            transport.close()  # the client sees the connection refused: not started
            return
        remote = Half().adopt(writer.transport)
        join(local, remote)
        await first_closed(local, remote)
        local.transport.close()
        remote.transport.close()

    async def stop(self) -> None:
        if self._server:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()


class Replicas:
    """`policy`: "cache-aware" (choose), or "round-robin" (in turn, as LocalAI's
    federation spreads requests: bench/fleet.py compares them)."""

    def __init__(self, pairings: list[Pairing], policy: str = "cache-aware"):
        self.pairings, self.policy = pairings, policy
        self._turn = 0  # round-robin's next
        self.tunnels: dict[str, Tunnel] = {}
        self.links: dict[str, WorkerLink] = {}     # heartbeats: a frozen machine is noticed
        self.loads: dict[str, MachineLoad] = {}   # the replicas answering now
        self.left_out: dict[str, str] = {}        # replica -> why it is not used
        self.served: dict[str, int] = {}          # requests sent to each
        self.inflight: dict[str, int] = {}        # requests sent to each, not answered yet
        self._sticky: OrderedDict[str, str] = OrderedDict()  # opening -> machine name
        self._lock = threading.Lock()
        self._loop = LinkLoop()
        self._stop = threading.Event()
        self._poller = threading.Thread(target=self._poll_forever, name="homerack-replicas",
                                        daemon=True)
        self._poller.start()

    def choose(self, model: str, key: str | None, local: MachineLoad) -> MachineLoad | None:
        """`choose` over this machine and the replicas serving now, each as busy as its
        engine says or as the requests sent to it and not answered yet make it, whichever
        is more (a burst arrives faster than polls and queues report it)."""
        with self._lock:
            machines = [replace(m, busy=max(m.busy, self.inflight.get(m.name, 0) / m.slots))
                        for m in (local, *self.loads.values())]
            sticky = self._sticky.get(key) if key else None
            if self.policy == "round-robin":
                having = [m for m in machines if model in m.models]
                self._turn += 1
                return having[self._turn % len(having)] if having else None
        return choose(machines, model, sticky)

    def begin(self, name: str) -> None:
        with self._lock:
            self.inflight[name] = self.inflight.get(name, 0) + 1

    def end(self, name: str) -> None:
        with self._lock:
            self.inflight[name] -= 1

    def tunnel(self, name: str) -> Tunnel | None:
        return self.tunnels.get(name)

    def remember(self, key: str | None, name: str) -> None:
        """The machine that answered a conversation's turn holds its KV now."""
        with self._lock:
            self.served[name] = self.served.get(name, 0) + 1
            if key:
                self._sticky[key] = name
                self._sticky.move_to_end(key)
                while len(self._sticky) > STICKY_KEYS:
                    self._sticky.popitem(last=False)

    def lose(self, name: str, why: str) -> None:
        """A request could not reach it, or its heartbeats stopped: leave it out until a
        poll reaches it again."""
        with self._lock:
            self.loads.pop(name, None)
            self.left_out[name] = why

    def lost(self, name: str) -> str | None:
        """Why the replica is left out now (None: it serves)."""
        with self._lock:
            return None if name in self.loads else self.left_out.get(name, "not reached yet")

    def status(self) -> list[dict]:
        with self._lock:
            up = [{"name": m.name, "state": "serving", "models": sorted(m.models),
                   "loaded": sorted(m.loaded), "busy": round(m.busy, 2),
                   "requests_sent": self.served.get(m.name, 0)} for m in self.loads.values()]
            down = [{"name": name, "state": "left out", "why": why,
                     "requests_sent": self.served.get(name, 0)}
                    for name, why in self.left_out.items()]
        return up + down

    def close(self) -> None:
        self._stop.set()
        for tunnel in self.tunnels.values():
            self._loop.run(tunnel.stop(), timeout=5)
        for link in self.links.values():
            self._loop.run(link.stop(), timeout=5)
        self._loop.close()

    # -- the poller thread ------------------------------------------------------------

    def _poll_forever(self) -> None:
        while not self._stop.is_set():
            for pairing in self.pairings:
                self._poll(pairing)
            self._stop.wait(POLL_S)

    def _poll(self, pairing: Pairing) -> None:
        name = pairing.name
        try:
            tunnel = self.tunnels.get(name) or self._open(pairing)
            self._heartbeat(pairing)
            load = _read_load(name, tunnel)
        except (Refused, ConnectionError, OSError, TimeoutError, httpx.HTTPError,
                KeyError, ValueError) as exc:
            self.lose(name, f"replica {name} ({pairing.address}): {exc}")
            if isinstance(exc, httpx.HTTPStatusError) and exc.response.status_code == 401:
                self._loop.run(self.tunnels.pop(name).stop(), timeout=5)  # a new engine
            return
        with self._lock:
            self.loads[name] = load
            self.left_out.pop(name, None)

    def _heartbeat(self, pairing: Pairing) -> None:
        """A live heartbeat link to the replica's gateway (a new one after a loss)."""
        link = self.links.get(pairing.name)
        if link is not None and link.lost is None:
            return
        if link is not None:
            self._loop.run(link.stop(), timeout=5)
        link = WorkerLink(pairing, lambda lost, why: self.lose(lost.name, why))
        self._loop.run(link.start(), timeout=10)
        self.links[pairing.name] = link

    def _open(self, pairing: Pairing) -> Tunnel:
        tunnel = Tunnel(pairing)
        self._loop.run(tunnel.start(), timeout=10)
        self.tunnels[pairing.name] = tunnel
        return tunnel


def _read_load(name: str, tunnel: Tunnel) -> MachineLoad:
    headers = {"Authorization": f"Bearer {tunnel.token}"}
    with httpx.Client(base_url=tunnel.url, headers=headers, timeout=3) as http:
        models = http.get("/v1/models").raise_for_status().json()["data"]
        health = http.get("/health").raise_for_status().json()
    held = health.get("models") or []
    slots = max(1, (health.get("batching") or {}).get("parallel") or 1)
    return MachineLoad(
        name, frozenset(m["id"] for m in models if m.get("kind") in ("chat", None)),
        frozenset(m["id"] for m in held),
        sum(m["running"] + m["queued"] for m in held) / slots,
        {m["id"]: m["decode_tokens_per_s"] for m in held if m.get("decode_tokens_per_s")},
        slots=slots)
