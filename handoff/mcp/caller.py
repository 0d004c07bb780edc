"""Who is calling, and whether their request may enter at all: host, origin and API key checks shared by
every transport."""

from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from urllib.parse import urlsplit

from django.conf import settings
from django.http.request import split_domain_port, validate_host
from mcp.server.context import ServerRequestContext
from opentelemetry.trace import Span

from audit.telemetry import mcp_span
from handoff.snapshot import snapshot


@dataclass(frozen=True)
class Caller:
    agent_id: int
    agent_name: str
    transport: str  # "http" or "ws"
    key_prefix: str  # the public part of the API key the request carried
    session_id: str = ""

    @property
    def session_key(self) -> str:
        """What session state (group lock, call count) is bound to: the MCP session, or for stateless
        2026-07-28 requests, which have none, the API key."""
        return self.session_id or f"key-{self.key_prefix}"


def header(scope: dict, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return value.decode("latin-1")
    return None


def host_allowed(scope: dict) -> bool:
    host = header(scope, b"host") or ""
    domain, _port = split_domain_port(host)
    return bool(domain) and validate_host(domain, settings.ALLOWED_HOSTS)


def origin_allowed(scope: dict) -> bool:
    """Requests without Origin come from non-browser clients; a browser's Origin must be listed.
    Ports are ignored: local tools such as the Inspector pick them at random."""
    origin = header(scope, b"origin")
    if origin is None:
        return True
    parts = urlsplit(origin)
    return f"{parts.scheme}://{parts.hostname}" in settings.GATEWAY_ALLOWED_ORIGINS


async def caller_from_scope(scope: dict, transport: str) -> Caller | None:
    """The agent the request's API key belongs to; without credentials, GATEWAY_ANONYMOUS_AGENT if set.
    Wrong credentials are refused even then: a client that sends a key means that key."""
    credentials = header(scope, b"authorization")
    scheme, _, key = (credentials or "").partition(" ")
    snap = await snapshot.get()
    if credentials is None:
        entry = snap.anonymous
    elif scheme.lower() != "bearer":
        return None
    else:
        entry = snap.key_holder(key.strip())
    if entry is None:
        return None
    return Caller(agent_id=entry.agent_id, agent_name=entry.agent_name, transport=transport, key_prefix=entry.prefix)


def caller_of(ctx: ServerRequestContext) -> Caller:
    """The caller the transport attached: a Caller itself (WebSocket) or on the HTTP request's scope."""
    request = ctx.request
    if isinstance(request, Caller):
        return request
    caller: Caller = request.scope["switchboard.caller"]
    session_id = request.headers.get("mcp-session-id")
    return replace(caller, session_id=session_id) if session_id else caller


def request_span(ctx: ServerRequestContext, method: str, **names: str) -> AbstractContextManager[Span]:
    """The request's span (audit/telemetry.py), naming the session and transport it came by."""
    caller = caller_of(ctx)
    return mcp_span(
        method,
        meta=ctx.meta,
        protocol_version=ctx.protocol_version,
        request_id=ctx.request_id,
        session_id=caller.session_id,
        transport=caller.transport,
        **names,
    )
