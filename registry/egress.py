"""The SSRF guard: HTTP upstreams may not reach private, loopback, link-local or otherwise special addresses
(cloud metadata at 169.254.169.254 among them) unless an administrator marked the upstream as internal.

Checked twice: when an upstream is saved (addresses written in the URL) and on every request the executor
sends, redirects included, against what the host name resolves to at that moment.
"""

import ipaddress
import socket
from urllib.parse import urlsplit

import anyio
import httpx2
from django.conf import settings

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


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
    host = urlsplit(url).hostname or ""
    if host == "localhost" or host.endswith(".localhost"):
        return f"{host} is a loopback name"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None
    return f"{address} is not a public address" if address_refused(address) else None


async def _resolved(host: str, port: int) -> list[Address]:
    infos = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [ipaddress.ip_address(info[4][0].split("%")[0]) for info in infos]


async def check_request(request: httpx2.Request) -> None:
    """httpx request hook: runs before every request, so every redirect is checked as well."""
    host = request.url.host
    if problem := url_problem(str(request.url)):
        raise EgressRefused(problem)
    port = request.url.port or (443 if request.url.scheme == "https" else 80)
    for address in await _resolved(host, port):
        if address_refused(address):
            raise EgressRefused(f"{host} resolves to {address}, which is not a public address")


def guarded_client(*, internal: bool, **kwargs) -> httpx2.AsyncClient:
    """An httpx client for an upstream; guarded unless the upstream is internal."""
    hooks = {} if internal else {"event_hooks": {"request": [check_request]}}
    return httpx2.AsyncClient(**kwargs, **hooks)
