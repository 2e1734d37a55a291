"""Connections to addresses a request names (a Responses `mcp` tool's `server_url`, an
image URL with `--allow-image-urls`): the engine would otherwise reach, for whoever sends
the request, its own loopback services and the home's private network.

Every connection resolves its name at the moment it connects, checks every address the
name has (loopback, link-local, private, shared, ULA, multicast, reserved and unspecified
addresses are refused), and connects to the address it checked: a name cannot point
elsewhere between the check and the use (DNS rebinding), and a redirect to a private
address meets the same check. The user's own hosts (`allowed`, the addresses the user
listed) pass. Environment proxies are not used for such connections.
"""

from __future__ import annotations

import ipaddress
import socket

import httpcore
import httpx

# Headers a request may not set on a connection it names: they are the connection's own
# (hop by hop) or say where it goes.
HOP_HEADERS = frozenset({"host", "connection", "keep-alive", "proxy-authenticate",
                         "proxy-authorization", "proxy-connection", "te", "trailer",
                         "transfer-encoding", "upgrade", "content-length"})


class AddressRefused(httpx.ConnectError):
    """A name that resolves to an address the engine does not reach for a request."""


def checked_address(host: str, port: int, allowed: frozenset[str] = frozenset()) -> str:
    """The address to connect to for `host`: every address it resolves to checked (one
    bad one refuses the name); a host in `allowed` is not checked."""
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise httpx.ConnectError(f"{host} cannot be resolved ({exc})") from None
    addresses = [info[4][0] for info in found]
    if host.lower().strip("[]") not in allowed:
        for address in addresses:
            why = _not_public(address)
            if why:
                raise AddressRefused(f"{host} is {address}, {why}: the engine does not "
                                     "connect there for a request")
    return addresses[0]


def _not_public(address: str) -> str | None:
    ip = ipaddress.ip_address(address.split("%")[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
        ip = ip.ipv4_mapped
    for test, words in ((ip.is_loopback, "a loopback address"),
                        (ip.is_link_local, "a link-local address"),
                        (ip.is_multicast, "a multicast address"),
                        (ip.is_unspecified, "an unspecified address"),
                        (ip.is_reserved, "a reserved address"),
                        (not ip.is_global, "a private address")):
        if test:
            return words
    return None


def bad_headers(headers: dict | None) -> list[str]:
    """The names in `headers` a request may not set (HOP_HEADERS)."""
    return [name for name in headers or {} if str(name).lower() in HOP_HEADERS]


class _Pinned(httpcore.NetworkBackend):
    def __init__(self, allowed: frozenset[str]):
        self._inner, self._allowed = httpcore.SyncBackend(), allowed

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        address = checked_address(host, port, self._allowed)
        return self._inner.connect_tcp(address, port, timeout, local_address, socket_options)

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


class _AsyncPinned(httpcore.AsyncNetworkBackend):
    def __init__(self, allowed: frozenset[str]):
        self._inner, self._allowed = httpcore.AnyIOBackend(), allowed

    async def connect_tcp(self, host, port, timeout=None, local_address=None,
                          socket_options=None):
        import anyio

        address = await anyio.to_thread.run_sync(checked_address, host, port, self._allowed)
        return await self._inner.connect_tcp(address, port, timeout, local_address,
                                             socket_options)

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


def client(allowed: frozenset[str] = frozenset(), **options) -> httpx.Client:
    """An httpx client whose every connection is checked and pinned (see above)."""
    transport = httpx.HTTPTransport()
    transport._pool._network_backend = _Pinned(allowed)  # httpx exposes no other way
    return httpx.Client(transport=transport, trust_env=False, **options)


def async_client(allowed: frozenset[str] = frozenset(), **options) -> httpx.AsyncClient:
    transport = httpx.AsyncHTTPTransport()
    transport._pool._network_backend = _AsyncPinned(allowed)
    return httpx.AsyncClient(transport=transport, trust_env=False, **options)
