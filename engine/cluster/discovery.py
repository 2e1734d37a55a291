"""Workers announce themselves on the LAN with mDNS (zeroconf): name, gateway port,
devices and free memory, Homerack and llama.cpp RPC versions.

A worker that leaves cleanly says goodbye; one that vanishes must be noticed by its
records expiring. zeroconf stretches a service pointer's TTL to 1125 s (against query
storms), which is why exo's nodes linger for minutes; so the host record carries a short
TTL and the browser asks each known worker again every CHECK_S: one that no longer
answers once its records expire is dropped, within about TTL_S + 2 x CHECK_S."""

from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import dataclass

from zeroconf import IPVersion, ServiceBrowser, ServiceInfo, ServiceStateChange, Zeroconf

from .protocol import SERVICE

TTL_S = 10  # refreshed at 80-95% of it: four tries before a lost answer drops a live worker
CHECK_S = 3


@dataclass(frozen=True)
class Announced:
    name: str
    address: str       # host:port of its gateway
    versions: dict
    devices: tuple     # ({name, kind, free, total}, ...)
    free_bytes: int


def _properties(name: str, versions: dict, devices: list[dict], free_bytes: int) -> dict:
    return {"name": name, "homerack": versions["homerack"], "rpc": versions["rpc"],
            "free": str(free_bytes), "devices": json.dumps(devices)[:180]}


class Advertiser:
    def __init__(self, name: str, port: int, addresses: list[str], interfaces=None):
        self.name, self.port = name, port
        self.addresses = [socket.inet_aton(a) for a in addresses]
        self._zc = Zeroconf(interfaces=interfaces or ["0.0.0.0"], ip_version=IPVersion.V4Only)
        self._info: ServiceInfo | None = None

    def publish(self, versions: dict, devices: list[dict], free_bytes: int) -> None:
        info = ServiceInfo(SERVICE, f"{self.name}.{SERVICE}", port=self.port,
                           addresses=self.addresses, host_ttl=TTL_S, other_ttl=TTL_S,
                           properties=_properties(self.name, versions, devices, free_bytes))
        if self._info is None:
            self._zc.register_service(info, allow_name_change=True)
        else:
            self._zc.update_service(info)
        self._info = info

    def close(self) -> None:
        if self._info:
            self._zc.unregister_service(self._info)
        self._zc.close()


class Browser:
    """The workers announced on the LAN right now, kept up to date in the background."""

    def __init__(self, interfaces=None):
        self._zc = Zeroconf(interfaces=interfaces or ["0.0.0.0"], ip_version=IPVersion.V4Only)
        self._found: dict[str, Announced] = {}
        self._lock = threading.Lock()
        self._browser = ServiceBrowser(self._zc, SERVICE, handlers=[self._changed])
        self._stop = threading.Event()
        threading.Thread(target=self._check, name="homerack-mdns-check", daemon=True).start()

    def _check(self) -> None:
        while not self._stop.wait(CHECK_S):
            for name in list(self._found):
                if self._zc.get_service_info(SERVICE, name, timeout=3000) is None:
                    with self._lock:
                        self._found.pop(name, None)

    def _changed(self, zeroconf: Zeroconf, service_type: str, name: str,
                 state_change: ServiceStateChange) -> None:
        if state_change is ServiceStateChange.Removed:
            with self._lock:
                self._found.pop(name, None)
            return
        info = zeroconf.get_service_info(service_type, name, timeout=2000)
        if info is None or not info.parsed_addresses():
            return
        props = {k.decode(): (v or b"").decode() for k, v in info.properties.items()}
        try:
            devices = tuple(json.loads(props.get("devices") or "[]"))
        except ValueError:
            devices = ()
        announced = Announced(props.get("name", name.split(".")[0]),
                              f"{info.parsed_addresses()[0]}:{info.port}",
                              {"homerack": props.get("homerack"), "rpc": props.get("rpc")},
                              devices, int(props.get("free") or 0))
        with self._lock:
            self._found[name] = announced

    def workers(self) -> list[Announced]:
        with self._lock:
            return sorted(self._found.values(), key=lambda a: a.name)

    def wait(self, seconds: float) -> list[Announced]:
        time.sleep(seconds)
        return self.workers()

    def close(self) -> None:
        self._stop.set()
        self._browser.cancel()
        self._zc.close()
