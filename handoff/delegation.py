"""The gateway's side of delegation tokens: its key ring, and the httpx auth that signs every request of a
tunnel afresh (so no token the specialist sees is older than its TTL, however long the tunnel lives)."""

from collections.abc import Generator
from functools import cache
from typing import Any

import httpx2
from django.conf import settings

from handoff.clearance import TOKEN_HEADER
from handoff.tokens import KeyRing, token_mint


@cache
def key_ring() -> KeyRing:
    return KeyRing.parse(settings.GATEWAY_DELEGATION_KEYS)


class DelegationAuth(httpx2.Auth):
    """Signs each request of a tunnel with a fresh token over the grant's claims."""

    def __init__(self, grant: dict[str, Any]) -> None:
        self.grant = grant

    def auth_flow(self, request: httpx2.Request) -> Generator[httpx2.Request, httpx2.Response, None]:
        request.headers[TOKEN_HEADER] = token_mint(key_ring(), self.grant["claims"], ttl=self.grant["ttl"])
        request.headers["traceparent"] = self.grant["traceparent"]
        yield request
