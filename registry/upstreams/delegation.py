"""The gateway's side of delegation tokens: its key ring, and the httpx auth that signs every request of a
tunnel afresh (so no token the specialist sees is older than its TTL, however long the tunnel lives) and
gives it a W3C trace context in the handoff's trace."""

import secrets
from collections.abc import Generator
from functools import cache
from typing import Any

import httpx2
from django.conf import settings

from gateway_project.lib.signing import TOKEN_HEADER, KeyRing, token_mint


@cache
def key_ring() -> KeyRing:
    return KeyRing.parse(settings.GATEWAY_DELEGATION_KEYS)


class DelegationAuth(httpx2.Auth):
    """Signs each request of a tunnel with a fresh token over the grant's claims."""

    def __init__(self, grant: dict[str, Any]) -> None:
        self.grant = grant

    def auth_flow(self, request: httpx2.Request) -> Generator[httpx2.Request, httpx2.Response, None]:
        request.headers[TOKEN_HEADER] = token_mint(key_ring(), self.grant["claims"], ttl=self.grant["ttl"])
        # The handoff's trace, a span of its own per request (W3C: version-trace id-parent id-flags).
        version, trace_id, _span, flags = self.grant["traceparent"].split("-")
        request.headers["traceparent"] = f"{version}-{trace_id}-{secrets.token_hex(8)}-{flags}"
        yield request
