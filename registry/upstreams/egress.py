"""The SSRF guard: HTTP upstreams may not reach private, loopback, link-local or otherwise special addresses
(cloud metadata at 169.254.169.254 among them) unless an administrator marked the upstream as internal.

Checked twice: when an upstream is saved (addresses written in the URL), and on every connection the
executor opens, redirects included, against what the host name resolves to at that moment: the connection
goes to the address that was checked.
"""

import ipaddress
import socket
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

import anyio
import httpcore2
import httpx2
from django.conf import settings
from httpcore2 import AsyncNetworkBackend, AsyncNetworkStream

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


ADDRESS_REFUSED = "The gateway does not connect to this service's network address. Do not retry."


class EgressRefused(Exception):
    """A request to an address the gateway does not connect to."""


def address_refused(address: Address) -> bool:
    """True for every address that is not plainly on the public internet, unless the deployment allows its
    network (GATEWAY_EGRESS_ALLOWED_NETWORKS)."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        address = address.ipv4_mapped
    if any(address in ipaddress.ip_network(net) for net in settings.GATEWAY_EGRESS_ALLOWED_NETWORKS):
        return False
    return not address.is_global or address.is_multicast


def url_problem(url: str) -> str | None:
    """Why a URL is refused without resolving anything: its host is a refused address or `localhost`."""
    return host_problem(urlsplit(url).hostname or "")


def host_problem(host: str) -> str | None:
    if host == "localhost" or host.endswith(".localhost"):
        return f"{host} is a loopback name"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None
    return f"{address} is not a public address" if address_refused(address) else None


Resolver = Callable[[str, int], Awaitable[list[str]]]


async def resolve(host: str, port: int) -> list[str]:
    infos = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]).split("%")[0] for info in infos]


class GuardedBackend(AsyncNetworkBackend):
    """httpcore's network backend with the guard in front of every TCP connect: it resolves the host once,
    refuses if any address is refused, and connects to the address it checked. So a name that resolves to
    a public address for the check and a private one for the connect (DNS rebinding) gets nowhere, and
    every redirect's new connection is checked too. TLS still verifies the host name (httpcore takes SNI
    from the request's origin, not from the address connected to)."""

    def __init__(self, resolver: Resolver = resolve) -> None:
        self._inner = httpcore2.AnyIOBackend()
        self._resolve = resolver

    async def connect_tcp(self, host: str, port: int, **kwargs: Any) -> AsyncNetworkStream:
        if problem := host_problem(host):
            raise EgressRefused(problem)
        addresses = [ipaddress.ip_address(a) for a in await self._resolve(host, port)]
        if refused := next((a for a in addresses if address_refused(a)), None):
            raise EgressRefused(f"{host} resolves to {refused}, which is not a public address")
        failure = httpcore2.ConnectError(f"{host} resolves to no address")
        for address in addresses:  # every one was checked; take the first that answers
            try:
                return await self._inner.connect_tcp(str(address), port, **kwargs)
            except httpcore2.ConnectError as exc:
                failure = exc
        raise failure

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class GuardedTransport(httpx2.AsyncHTTPTransport):
    def __init__(self, resolver: Resolver = resolve) -> None:
        super().__init__()
        # httpx takes no network backend of its own, so the pool under the transport is replaced.
        self._pool = httpcore2.AsyncConnectionPool(
            ssl_context=httpx2.create_ssl_context(), network_backend=GuardedBackend(resolver)
        )


def guarded_client(*, internal: bool, **kwargs: Any) -> httpx2.AsyncClient:
    """An httpx client for an upstream; guarded unless the upstream is internal."""
    return httpx2.AsyncClient(**kwargs) if internal else httpx2.AsyncClient(transport=GuardedTransport(), **kwargs)
