"""The sharing listener: the engine on the LAN for the household's paired devices, beside
the owner's loopback listener (whose token never works here), started and stopped while
the engine runs, and announced by mDNS as homerack.local.

Every request passes, in order: the guard (its Host: an IP literal or homerack.local,
so no rebound name reaches it; its body's size), the gate (a paired device's key, from
the page's cookie or a Bearer token; without one, only the pairing page; with one, only
the routes in DEVICE_ROUTES, else 403), and a cross-site check for the cookie (a
request it authenticates must be JSON, which no form can send, from this page's own
origin). Every answer carries a strict Content-Security-Policy.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from typing import Callable

import uvicorn
from fastapi import FastAPI

from ...engine import Engine
from ..home import home_routes
from ..wire import error_body
from .guard import asgi_headers, host_name
from .listeners import BesideServer, DoorCaps, bind, capped, open_files

log = logging.getLogger("homerack")
MDNS_NAME = "homerack.local"
# What a device may reach: generation, the page and its own conversations.
DEVICE_ROUTES = frozenset({("GET", "/v1/models"), ("GET", "/api/version")} | {
    ("POST", p) for p in ("/v1/chat/completions", "/v1/completions", "/v1/messages",
                          "/v1/messages/count_tokens", "/v1/embeddings", "/api/chat",
                          "/api/generate", "/api/embed", "/v1/audio/transcriptions",
                          "/v1/audio/translations", "/v1/audio/speech")})
PUBLIC = frozenset({("POST", "/pair"), ("GET", "/health")} |
                   {("GET", p) for p in home_routes.PAGES})
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
       "media-src blob:; connect-src 'self'; manifest-src 'self'; form-action 'none'; "
       "base-uri 'none'; frame-ancestors 'none'")
# The LAN's share of the engine's open files (the owner's API, the models and the caches
# need the rest): connections at once, from one address, and the time a request has to
# arrive (headers, then its body: a 25 MiB recording on a slow link).
MAX_CONNECTIONS, PER_ADDRESS, HEADERS_S, BODY_S = 256, 32, 10.0, 120.0
PAGE_HEADER = "x-homerack-page"  # set by the web chat's own script on an upload
HEADERS = [(b"content-security-policy", CSP.encode()), (b"x-content-type-options", b"nosniff"),
           (b"referrer-policy", b"no-referrer"), (b"x-frame-options", b"DENY"),
           (b"cache-control", b"no-store")]


class DeviceGate:
    """ASGI middleware: finds the device a request comes from and lets it reach only what
    devices may; marks the request with it (request.state.device)."""

    def __init__(self, app, engine: Engine):
        self.app, self.engine = app, engine

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = asgi_headers(scope)
        route = (scope["method"], scope["path"])
        key, by_cookie = _key(headers)
        device = self.engine.home.devices.device_for(key) if key else None
        if by_cookie or route == ("POST", "/pair"):
            refused = _cross_site(scope["method"], headers)
            if refused:
                return await _refuse(scope, send, 403, refused, "permission_error")
        if route in PUBLIC or (device and (route in DEVICE_ROUTES
                                           or scope["path"].startswith("/home/api/"))):
            scope.setdefault("state", {})["device"] = device.name if device else None
            return await self.app(scope, receive, _secured(send))
        if device is None:
            return await _refuse(scope, send, 401, "pair this device first: open this "
                                 "address in a browser and enter the code the desktop shows",
                                 "invalid_api_key")
        return await _refuse(scope, send, 403, "the owner shares generation with this home's "
                             "devices, not this", "permission_error")


def _key(headers: dict) -> tuple[str, bool]:
    """The key a request carries, and whether it came in the page's cookie. Cookies are
    no port's own: another service on this host could plant one beside the page's
    (cookie tossing), so a request carrying two is taken as carrying none."""
    bearer = headers.get("authorization", "")
    if bearer.startswith("Bearer "):
        return bearer[7:].strip(), False
    if headers.get("x-api-key"):
        return headers["x-api-key"], False
    keys = [value for name, _, value in (part.strip().partition("=") for part in
                                         headers.get("cookie", "").split(";"))
            if name == home_routes.KEY_COOKIE]
    return (keys[0], True) if len(keys) == 1 else ("", bool(keys))


def _cross_site(method: str, headers: dict) -> str | None:
    """Why a request the cookie would authenticate is refused: a change that is not JSON
    (an HTML form's) nor marked by the page's own script (PAGE_HEADER: a recording's
    upload; a header no form can send, and no other site's script without a CORS approval
    this server never gives), or one from another origin."""
    if method in ("GET", "HEAD"):
        return None
    origin = headers.get("origin")
    if origin is not None and _authority(origin.split("://", 1)[-1]) != \
            _authority(headers.get("host", "")):
        return "a request from another site's page"
    if not headers.get("content-type", "").startswith("application/json") and \
            headers.get(PAGE_HEADER) != "1":
        return "a change is sent as JSON (Content-Type: application/json)"
    return None


def _authority(host: str) -> tuple[str, str]:
    """A Host header's (or an Origin's) name and port: another port of this host is
    another site (another service, another page)."""
    name = host_name(host)
    port = host.strip().rsplit("]", 1)[-1].rpartition(":")[2] if ":" in host.strip().rsplit(
        "]", 1)[-1] else "80"
    return name, port


def _secured(send):
    async def sending(message):
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", ()), *HEADERS]}
        await send(message)
    return sending


async def _refuse(scope, send, status: int, message: str, kind: str) -> None:
    body = json.dumps(error_body(scope["path"], status, message, kind, None)).encode()
    await _secured(send)({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


class HomeDoor:
    """The sharing listener on the engine's event loop: opened, closed (at once: open
    connections end too, and every device's request running or waiting, the web chat's
    replies among them), and announced on the LAN."""

    def __init__(self, engine: Engine, share_app: Callable[[], FastAPI]):
        """`share_app`: the app the devices reach, made anew at each opening (factory.py's
        create_share_app: the routes mounted behind `DeviceGate`)."""
        self.engine, self.share_app = engine, share_app
        self._server: BesideServer | None = None
        self._task: asyncio.Task | None = None
        self._mdns = None
        self.caps: DoorCaps | None = None  # made at each opening

    async def open(self, host: str | None, port: int) -> str:
        """Listen on `host` (None: this machine's LAN address, not every interface)."""
        if self._server is not None:
            await self.close()
        # a quarter of the files the engine may open; counted afresh at each opening
        self.caps = self.engine.home.door = DoorCaps(
            min(MAX_CONNECTIONS, open_files() // 4), PER_ADDRESS, HEADERS_S, BODY_S)
        sock = bind(host or lan_address(), port)
        bound_host, bound_port = sock.getsockname()[:2]
        shown = lan_address() if bound_host in ("0.0.0.0", "::") else bound_host
        url = f"http://{shown}:{bound_port}"
        self._server = BesideServer(uvicorn.Config(self.share_app(),
                                              http=capped(self.caps), ws="none",
                                              log_level="warning", access_log=False,
                                              lifespan="off", timeout_graceful_shutdown=1))
        self._task = asyncio.get_running_loop().create_task(self._server.serve(sockets=[sock]))
        self.engine.home.sharing = {"enabled": True, "url": url, "host": bound_host,
                                    "port": bound_port}
        log.warning("sharing with the home on %s%s: paired devices can use the models "
                    "(plain HTTP on the LAN; each device's key is its own)", url,
                    " (every interface)" if bound_host in ("0.0.0.0", "::") else "")
        self._mdns = await asyncio.to_thread(_announce, shown, bound_port)
        return url

    async def close(self) -> None:
        server, task, mdns = self._server, self._task, self._mdns
        self._server = self._task = self._mdns = None
        if server is not None:
            self.engine.home.sharing = {"enabled": False, "url": None}
            self.engine.home.meter.cancel()  # the devices' streams and web-chat replies end
            server.should_exit = server.force_exit = True
            for listener in server.servers:
                listener.close()
            if task is not None:
                await asyncio.wait([task], timeout=3)
        if mdns is not None:
            await asyncio.to_thread(mdns.close)


def lan_address() -> str:
    """This machine's address on the LAN (the route out; no packet is sent)."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("10.255.255.255", 1))
        return probe.getsockname()[0]
    except OSError:
        return "127.0.0.1"
    finally:
        probe.close()


class _Announcement:
    def __init__(self, zeroconf, info):
        self._zc, self._info = zeroconf, info

    def close(self) -> None:
        try:
            self._zc.unregister_service(self._info)
        finally:
            self._zc.close()


def _announce(address: str, port: int) -> _Announcement | None:
    """homerack.local and an _http._tcp service for it, best effort (a LAN without
    multicast still reaches the address the app shows)."""
    try:
        from zeroconf import IPVersion, ServiceInfo, Zeroconf

        zc = Zeroconf(ip_version=IPVersion.V4Only)
        info = ServiceInfo("_http._tcp.local.", "Homerack._http._tcp.local.", port=port,
                           addresses=[socket.inet_aton(address)], server=f"{MDNS_NAME}.",
                           properties={"path": "/"})
        zc.register_service(info, allow_name_change=True)
        return _Announcement(zc, info)
    except Exception as exc:  # no multicast here: the address still works
        log.warning("homerack.local is not announced: %s", exc)
        return None
