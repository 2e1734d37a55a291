"""The head's view of its workers, in the engine process: a link to each paired worker
(heartbeat and forwarder, link.py), its devices registered with llama.cpp, and the
placement over them. Workers that do not answer, refuse, or run another version are
left out with the reason; one that answers again is taken at the next start."""

from __future__ import annotations

import socket
from dataclasses import replace
from typing import Callable

from ..machine.hardware import Hardware
from ..machine.planner import AUTO_FLOOR, Plan, Preferences
from ..llama.rpc import add_worker
from ..catalog.shape import ModelShape
from .link import LinkLoop, WorkerLink
from .pairing import Pairing
from .placement import ClusterPlan, Machine, local_machine, place_cluster
from .protocol import Refused
from ..machine.bandwidth import memory_bandwidth


class Cluster:
    def __init__(self, pairings: list[Pairing], on_lost: Callable[[str, str], None],
                 split: dict[str, int] | None = None):
        self.pairings = pairings
        self.on_lost = on_lost          # (worker name, why), from the links' thread
        self.split = split              # layers per worker, chosen by the user
        self.links: dict[str, WorkerLink] = {}
        self.devices: dict[str, list[str]] = {}   # worker -> its devices' names here
        self.left_out: dict[str, str] = {}        # worker -> why it is not used
        self.last: ClusterPlan | None = None
        self._loop = LinkLoop()
        self._bandwidth: float | None = None
        self._baseline: tuple[int, dict] = (0, {})  # tokens; (bytes sent, round trips): at load

    def connect(self) -> None:
        """Reach every paired worker not linked yet; register its devices."""
        for pairing in self.pairings:
            if pairing.name in self.links:
                continue
            link = WorkerLink(pairing, self._lost)
            try:
                self._loop.run(link.start(), timeout=10)
                _check_ready(link)
                self.devices[pairing.name] = add_worker(link.endpoint)
            except (Refused, ConnectionError, TimeoutError) as exc:
                self.left_out[pairing.name] = str(exc)
                self._loop.run(link.stop(), timeout=5)
                continue
            self.links[pairing.name] = link
            self.left_out.pop(pairing.name, None)

    def _lost(self, link: WorkerLink, why: str) -> None:
        self.left_out[link.name] = why
        self.on_lost(link.name, why)

    def machines(self, hw: Hardware) -> list[Machine]:
        """The linked workers as placement sees them: each device's free memory (capped
        by what the worker offers), its measured speed and its link's round trip."""
        free = {d.name: d.free_bytes for d in hw.devices}
        machines = []
        for name, link in self.links.items():
            if link.lost:
                continue
            info, offered = link.info, link.info.get("free_bytes")
            devices = tuple(
                (here, remote.get("kind", "cpu"),
                 min(free.get(here, 0), offered) if remote.get("kind") == "cpu" and offered
                 else free.get(here, 0))
                for here, remote in zip(self.devices[name], info.get("devices", [])))
            machines.append(Machine(name, devices, float(info.get("bandwidth") or 1e9),
                                    link.stats.rtt_min_s or 0.001))
        return machines

    def preview(self, hw: Hardware, shape: ModelShape, prefs: Preferences) -> ClusterPlan:
        """The plan over this machine and the workers, as it would be now (at 4k of
        context when none was asked: the stages' placement does not weigh a context's
        cost in speed, so it does not choose one)."""
        if prefs.auto_ctx:
            prefs = replace(prefs, ctx=AUTO_FLOOR, auto_ctx=False)
        if self._bandwidth is None:
            self._bandwidth = memory_bandwidth()
        here = local_machine(hw, prefs, self._bandwidth)
        return place_cluster(shape, hw, here, self.machines(hw), prefs, self.split)

    def place(self, hw: Hardware, shape: ModelShape, prefs: Preferences) -> Plan:
        """The loader's planner: the preview, kept as the plan the model loads by."""
        self.last = self.preview(hw, shape, prefs)
        return self.last.plan

    def mark_loaded(self, tokens: int) -> None:
        """A model finished loading (its weights went over the links): per-token figures
        count from here, `tokens` being the engine's count of evaluated tokens so far."""
        self._baseline = (tokens, {n: (link.stats.bytes_sent, link.stats.round_trips)
                                   for n, link in self.links.items()})

    def status(self, tokens: int = 0) -> dict:
        """The dashboard's figures; `tokens`: the engine's evaluated tokens so far."""
        stages = self.last.stages if self.last else ()
        base_tokens, base = self._baseline
        counted = tokens - base_tokens
        workers = []
        for pairing in self.pairings:
            link = self.links.get(pairing.name)
            stats = link.stats if link else None
            workers.append({
                "name": pairing.name, "address": pairing.address,
                "state": "lost" if link and link.lost else "linked" if link else "left out",
                "why": self.left_out.get(pairing.name),
                "rtt_ms": round(stats.rtt_s * 1000, 2) if stats and stats.rtt_s else None,
                "bytes_sent": stats.bytes_sent if stats else 0,
                "bytes_received": stats.bytes_received if stats else 0,
                "round_trips": stats.round_trips if stats else 0,
                **_per_token(stats, base.get(pairing.name, (0, 0)), counted),
                "free_bytes": link.info.get("free_bytes") if link else None,
                "stages": [vars(s) for s in stages if s.machine == pairing.name]})
        plan = self.last
        return {"host": socket.gethostname(), "workers": workers,
                "local_stages": [vars(s) for s in stages if s.machine not in self.links],
                "expected_tokens_per_s": round(plan.tokens_per_s, 1) if plan else None,
                "left_out": dict(plan.left_out) if plan else {}}

    def close(self) -> None:
        for link in self.links.values():
            try:
                self._loop.run(link.stop(), timeout=2)
            except Exception:
                pass
        self._loop.close()


def _per_token(stats, base: tuple[int, int], tokens: int) -> dict:
    """Bytes sent and round trips on a link per evaluated token, since the model loaded."""
    if stats is None or tokens <= 0:
        return {"bytes_per_token": None, "round_trips_per_token": None}
    return {"bytes_per_token": round((stats.bytes_sent - base[0]) / tokens),
            "round_trips_per_token": round((stats.round_trips - base[1]) / tokens, 2)}


def _check_ready(link: WorkerLink) -> None:
    """Refuse a worker that cannot take an RPC session now: llama.cpp aborts the process
    when registering one fails, so this is asked on the heartbeat link first."""
    if link.info.get("serving"):
        raise Refused(f"worker {link.name} is busy: it serves {link.info['serving']}")
    if link.info.get("rpc_running") is False:
        raise Refused(f"worker {link.name}: its llama.cpp RPC server is not running (restarting)")
