"""The specialist's side of a handoff: `require_gateway_clearance` guards a Python MCP server so that it
answers only requests carrying a valid delegation token from the gateway.

    app = require_gateway_clearance(mcp_server.streamable_http_app(), keys="k1:...", audience="finance",
                                    gateway_url="https://gateway.example")

Every request's token is verified (signature in constant time, algorithm, type, audience, expiry); the
carry-over state is hydrated once per delegation (from the token, or redeemed from the gateway's claim-check
store) and is available to tool code as `clearance_of(ctx.request)`, with the request's W3C `traceparent`.
Anything else gets HTTP 401 with a JSON-RPC error naming the reason. Django projects use
`ClearanceMiddleware` instead. No Django import here: the guard runs in any ASGI server.
"""

import asyncio
import json
import re
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any

import httpx2

from gateway_project.lib.signing import TOKEN_HEADER, DelegationError, KeyRing, expired, token_verify

TRACEPARENT = re.compile(r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")
REDEEM_PATH = "/handoff/redeem"


@dataclass(frozen=True)
class Clearance:
    """What the gateway vouched for: the delegation, its domain, why it happened and the state it carried."""

    token_id: str
    domain: str
    issuer: str
    reason: str
    state: Any
    traceparent: str


SCOPE_KEY = "switchboard.clearance"


def clearance_of(request: Any) -> Clearance | None:
    """The clearance of a guarded request: an ASGI scope, or a request object that has one (an SDK
    handler's `ctx.request`) or carries it (a Django request)."""
    if isinstance(request, dict):
        return request.get(SCOPE_KEY)
    return getattr(request, "clearance", None) or getattr(request, "scope", {}).get(SCOPE_KEY)


class ClearanceGuard:
    """Verification and one-time hydration, shared by the ASGI and the Django middleware."""

    def __init__(
        self, *, keys: str | KeyRing, audience: str, gateway_url: str = "", max_delegations: int = 1024
    ) -> None:
        self.ring = keys if isinstance(keys, KeyRing) else KeyRing.parse(keys)
        self.audience = audience
        self.gateway_url = gateway_url.rstrip("/")
        # Delegations whose state is held at once; past that the least recently used is forgotten, and its
        # tunnel, if still alive, is refused (its claim check cannot be redeemed twice).
        self.max_delegations = max_delegations
        self._hydrated: OrderedDict[str, Clearance] = OrderedDict()
        self._locks: dict[str, asyncio.Lock] = {}

    async def clear(self, token: str | None, traceparent: str | None) -> Clearance:
        if not token:
            raise DelegationError("MISSING_DELEGATION_TOKEN", "This server only answers requests from the gateway.")
        claims = token_verify(self.ring, token, audience=self.audience)
        clearance = await self._hydrate(token, claims)
        if traceparent and TRACEPARENT.fullmatch(traceparent):
            clearance = replace(clearance, traceparent=traceparent)
        return clearance

    async def _hydrate(self, token: str, claims: dict[str, Any]) -> Clearance:
        tid = claims["tid"]
        if tid in self._hydrated:
            self._hydrated.move_to_end(tid)
            return self._hydrated[tid]
        lock = self._locks.setdefault(tid, asyncio.Lock())
        try:
            async with lock:
                if tid not in self._hydrated:
                    state = await self._redeem(token) if "state_ref" in claims else claims.get("state")
                    self._hydrated[tid] = Clearance(
                        token_id=tid,
                        domain=str(claims.get("sub", "")),
                        issuer=str(claims.get("iss", "")),
                        reason=str(claims.get("reason", "")),
                        state=state,
                        traceparent=str(claims.get("traceparent", "")),
                    )
                    while len(self._hydrated) > self.max_delegations:
                        self._hydrated.popitem(last=False)
        finally:
            self._locks.pop(tid, None)
        return self._hydrated[tid]

    async def _redeem(self, token: str) -> Any:
        """The carry-over state from the gateway's claim-check store: given out once, then gone."""
        if not self.gateway_url:
            raise expired("The carried state is held by the gateway, and this server does not know its address.")
        async with httpx2.AsyncClient(timeout=10) as http:
            response = await http.post(f"{self.gateway_url}{REDEEM_PATH}", headers={TOKEN_HEADER: token})
        if response.status_code != 200:
            raise expired("The carried state was already redeemed or has expired; ask for a new handoff.")
        return response.json()["state"]


def refusal_body(error: DelegationError) -> bytes:
    return json.dumps(
        {
            "jsonrpc": "2.0",
            "id": None,
            "error": {"code": -32001, "message": error.message, "data": {"code": error.code}},
        }
    ).encode()


def refusal_headers(error: DelegationError) -> list[tuple[bytes, bytes]]:
    return [
        (b"content-type", b"application/json"),
        (b"www-authenticate", b'Bearer error="invalid_token"'),
        (b"x-switchboard-error", error.code.encode()),
    ]


def django_refusal(error: DelegationError) -> Any:
    from django.http import HttpResponse

    response = HttpResponse(refusal_body(error), status=401)
    for name, value in refusal_headers(error):
        response[name.decode()] = value.decode()
    return response


class require_gateway_clearance:  # noqa: N801 - used as a decorator-like wrapper, named for how it reads
    """ASGI middleware: the wrapped app sees only cleared requests (lifespan passes through)."""

    def __init__(self, app: Any, **guard: Any) -> None:
        """`guard`: keys, audience, gateway_url and max_delegations, as ClearanceGuard takes them."""
        self.app = app
        self.guard = ClearanceGuard(**guard)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope["headers"]}
        try:
            clearance = await self.guard.clear(headers.get(TOKEN_HEADER), headers.get("traceparent"))
        except DelegationError as error:
            if scope["type"] == "websocket":
                return await send({"type": "websocket.close", "code": 4401})
            await send({"type": "http.response.start", "status": 401, "headers": refusal_headers(error)})
            return await send({"type": "http.response.body", "body": refusal_body(error)})
        await self.app(scope | {SCOPE_KEY: clearance}, receive, send)


class ClearanceMiddleware:
    """The same guard as Django middleware. Settings: SWITCHBOARD_CLEARANCE = {"keys": ..., "audience": ...,
    "gateway_url": ...}. The clearance is `request.clearance`."""

    async_capable = True
    sync_capable = False

    def __init__(self, get_response: Any) -> None:
        from django.conf import settings

        self.get_response = get_response
        self.guard = ClearanceGuard(**settings.SWITCHBOARD_CLEARANCE)

    async def __call__(self, request: Any) -> Any:
        try:
            clearance = await self.guard.clear(request.headers.get(TOKEN_HEADER), request.headers.get("traceparent"))
        except DelegationError as error:
            return django_refusal(error)
        request.clearance = clearance
        return await self.get_response(request)
