"""Who is calling, and whether their request may enter at all: host, origin, API key and bearer token checks
shared by every transport."""

import asyncio
import logging
import time
from collections import OrderedDict
from contextlib import AbstractContextManager
from contextvars import ContextVar
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any
from urllib.parse import parse_qs, urlsplit

from django.conf import settings
from django.http.request import split_domain_port, validate_host
from mcp.server.context import ServerRequestContext
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from opentelemetry.trace import Span

from audit.telemetry import mcp_span
from gateway_project.lib.database import database_async
from handoff.snapshot import ANONYMOUS_KEY, KeyEntry, Snapshot, snapshot
from policy.authorization import local_tokens
from policy.decisions import Who
from policy.identity import Identity, Provider, TokenRefused, looks_like_jwt, person_digest, person_seen, verifier
from policy.keys import KEY_PREFIX
from policy.patterns import name_matches
from policy.services import key_used
from registry.credentials import credential_open, credential_seal
from registry.personal import INBOUND

logger = logging.getLogger(__name__)
METADATA_PATH = "/.well-known/oauth-protected-resource"


def allows(key_tools: tuple[str, ...], offered: tuple[str, ...] | None, name: str) -> bool:
    """Whether an API key limited to these tool patterns (none: no limit), through a virtual server offering those
    (None: /mcp, which offers all), allows `name` at all."""
    if key_tools and not name_matches(name, key_tools):
        return False
    return offered is None or name_matches(name, offered)


@dataclass(frozen=True)
class Caller:
    agent_id: int
    agent_name: str
    transport: str  # "http" or "ws"
    key_prefix: str  # the public part of the API key the request carried; empty for a token
    session_id: str = ""
    team: str = ""  # the slug of the agent's team (policy.models.Team)
    # The person a bearer token named, and the OAuth client acting for them (empty for an API key).
    person_issuer: str = ""
    person_subject: str = ""
    person_name: str = ""
    client_id: str = ""
    expires_at: float = 0.0  # when the token runs out (epoch seconds); 0 for an API key
    key_tools: tuple[str, ...] = ()  # the exposed names an API key is limited to (patterns); empty: no limit
    groups: tuple[int, ...] = ()  # the agent groups the person's own groups count them in
    teams: tuple[str, ...] = ()  # the teams the person's own groups make them an admin or member of
    public_url: str = ""  # the gateway's, as this request reached it (where its connect links point)
    # The virtual server the request came through (/mcp/s/<name>), and the exposed-name patterns it offers; "" for /mcp.
    server: str = ""
    server_tools: tuple[str, ...] = ()
    # The person's own token, for an upstream that exchanges it (RFC 8693); kept out of every repr.
    token: str = field(default="", repr=False)

    @property
    def who(self) -> Who:
        """Whom policy decides for: the agent, and the person with their groups (through the virtual server, whose
        overrides name the tools they see)."""
        person = (self.person_issuer, self.person_subject) if self.person_subject else None
        return Who(self.agent_id, person, frozenset(self.groups), frozenset(self.teams), self.server)

    def wire(self) -> dict:
        """The caller as a task carries it (code mode's executions): the person's token sealed, so that it
        crosses Redis as nothing anyone there can use; `from_wire` opens it again in the executor."""
        fields = asdict(self)
        return fields | {"token": credential_seal(self.token, name=INBOUND) if self.token else ""}

    @classmethod
    def from_wire(cls, fields: dict) -> "Caller":
        token = credential_open(fields["token"], name=INBOUND) if fields.get("token") else ""
        return cls(
            **fields
            | {"token": token, "key_tools": tuple(fields["key_tools"]), "groups": tuple(fields["groups"])}
            | {"teams": tuple(fields.get("teams", ())), "server_tools": tuple(fields.get("server_tools", ()))}
        )

    @property
    def offered(self) -> tuple[str, ...] | None:
        """The tool patterns of the virtual server the request came through; None for /mcp."""
        return self.server_tools if self.server else None

    @property
    def principal(self) -> tuple[int, str, str, str]:
        """Who may drive a session: the agent, the person when a token named one, through the endpoint that opened
        it (a session of one virtual server is no session at another, nor at /mcp)."""
        return (self.agent_id, self.person_issuer, self.person_subject, self.server)

    @property
    def audited(self) -> dict[str, Any]:
        """Who is calling, as every audit row of theirs holds it: the agent and its team, the person and client, the
        virtual server."""
        return {
            "agent_id": self.agent_id,
            "agent_name": self.agent_name,
            "team": self.team,
            "server": self.server,
            **self.person,
        }

    @property
    def person(self) -> dict[str, str]:
        """The person and the client."""
        return {
            "person_issuer": self.person_issuer,
            "person_subject": self.person_subject,
            "person_name": self.person_name,
            "client_id": self.client_id,
        }

    @property
    def session_key(self) -> str:
        """What session state (group lock, call count) is bound to: the MCP session, or for stateless
        2026-07-28 requests, which have none, the API key or the person."""
        if self.session_id:
            return self.session_id
        if self.person_subject:
            return f"person-{person_digest(self.person_issuer, self.person_subject)}"
        return f"key-{self.key_prefix}"


class Refused(Exception):
    """A request that may not enter: the HTTP status, a message the client can act on, and the
    `WWW-Authenticate` challenge that tells an OAuth client where to sign in."""

    def __init__(self, status: int, message: str, challenge: str, code: str = "", caller: "Caller | None" = None):
        super().__init__(message)
        self.status, self.message, self.challenge = status, message, challenge
        self.code = code  # for the audit row; empty for a missing or wrong API key, which gets none
        self.caller = caller  # who was refused, when their credentials were good (a virtual server refused them)


# A request's headers by name, kept in its scope: a request reads about ten of them, each a scan of the list.
_HEADERS = "switchboard.headers"


def header(scope: dict, name: bytes) -> str | None:
    raw = scope.get("headers", [])
    kept = scope.get(_HEADERS)
    if kept is None or kept[0] is not raw:  # none yet, or the list was replaced since
        by_name: dict[bytes, bytes] = {}
        for key, value in raw:
            by_name.setdefault(key.lower(), value)  # the first of a repeated header, as before
        kept = scope[_HEADERS] = (raw, by_name)
    value = kept[1].get(name)
    return None if value is None else value.decode("latin-1")


def host_allowed(scope: dict) -> bool:
    return _host_allowed(header(scope, b"host") or "", tuple(settings.ALLOWED_HOSTS))


@lru_cache(maxsize=64)
def _host_allowed(host: str, allowed: tuple[str, ...]) -> bool:
    """Django's check, once per Host value and ALLOWED_HOSTS: a request makes it with the same few values."""
    domain, _port = split_domain_port(host)
    return bool(domain) and validate_host(domain, allowed)


def origin_allowed(scope: dict) -> bool:
    """Requests without Origin come from non-browser clients; a browser's Origin must be listed.
    Ports are ignored: local tools such as the Inspector pick them at random."""
    origin = header(scope, b"origin")
    if origin is None:
        return True
    parts = urlsplit(origin)
    return f"{parts.scheme}://{parts.hostname}" in settings.GATEWAY_ALLOWED_ORIGINS


def public_base(scope: dict) -> str:
    """The gateway's public URL: GATEWAY_PUBLIC_URL, else the scheme and Host the request came by."""
    if settings.GATEWAY_PUBLIC_URL:
        return settings.GATEWAY_PUBLIC_URL.rstrip("/")
    secure = scope.get("scheme") in ("https", "wss")
    return f"{'https' if secure else 'http'}://{header(scope, b'host') or 'localhost'}"


def server_named(scope: dict) -> str | None:
    """The virtual server the request's path names (/mcp/s/<name>), or None for /mcp."""
    return (scope.get("url_route") or {}).get("kwargs", {}).get("server")


def resource_path(scope: dict) -> str:
    """The MCP endpoint's path: /mcp, or a virtual server's, each a resource of its own."""
    name = server_named(scope)
    return "/mcp" if name is None else f"/mcp/s/{name}"


def resource_uri(scope: dict) -> str:
    """The canonical URI of the MCP resource (RFC 8707): what a token for this endpoint names as its audience."""
    return f"{public_base(scope)}{resource_path(scope)}"


def authorization_servers(scope: dict, snap: Snapshot) -> list[str]:
    """Where a person may get a token for this gateway: its identity providers, and itself."""
    return sorted(snap.providers) + ([public_base(scope)] if snap.builtin else [])


def required_scopes(snap: Snapshot) -> list[str]:
    providers = [*snap.providers.values(), *([snap.builtin] if snap.builtin else [])]
    return sorted(set().union(*(provider.scopes for provider in providers)))


def challenge(scope: dict, snap: Snapshot, error: str = "", description: str = "") -> str:
    if not snap.signs_in:
        return 'Bearer realm="switchboard"'
    parts = [f'resource_metadata="{public_base(scope)}{METADATA_PATH}{resource_path(scope)}"']
    if scopes := required_scopes(snap):
        parts.append(f'scope="{" ".join(scopes)}"')
    if error:
        parts += [f'error="{error}"', f'error_description="{description.replace(chr(34), chr(39))}"']
    return "Bearer " + ", ".join(parts)


async def caller_from_scope(scope: dict, transport: str) -> Caller:
    """The agent the request's API key belongs to, or the person its bearer token names; without credentials,
    GATEWAY_ANONYMOUS_AGENT if set. Wrong credentials are refused even then: a client that sends a key means
    that key. Through a virtual server, only its team's may enter. Raises Refused."""
    snap = await snapshot.get()
    caller = await _credited(scope, transport, snap)
    name = server_named(scope)
    if name is None:
        return caller
    server = snap.servers.get(name)
    through = replace(caller, server=name[:64])  # as its audit row names it, if refused
    if server is None:
        message = f"No virtual server is named {name!r} here (or it is disabled): /mcp serves every tool you may use"
        raise Refused(404, message, challenge(scope, snap), "UNKNOWN_SERVER", through)
    if server.team != caller.team and server.team not in caller.teams:
        message = f"The virtual server {name!r} serves team {server.team!r}; you act for team {caller.team!r}"
        raise Refused(403, message, challenge(scope, snap), "NOT_THE_SERVERS_TEAM", through)
    return replace(through, server_tools=server.tools)


async def _credited(scope: dict, transport: str, snap: Snapshot) -> Caller:
    query = scope.get("query_string", b"")
    if query and "access_token" in parse_qs(query.decode("latin-1")):
        message = "Send the token in the Authorization header: a token in the URL is refused (it ends up in logs)"
        raise Refused(400, message, challenge(scope, snap, "invalid_request", message), "TOKEN_IN_URL")
    credentials = header(scope, b"authorization")
    scheme, _, key = (credentials or "").partition(" ")
    if credentials is None:
        entry = snap.anonymous
    elif scheme.lower() == "bearer" and snap.providers and looks_like_jwt(key.strip()):
        return await _person(scope, transport, key.strip(), snap)
    elif scheme.lower() == "bearer" and snap.builtin and not key.strip().startswith(KEY_PREFIX):
        return await _signed_in_here(scope, transport, key.strip(), snap)
    else:
        entry = snap.key_entry(key.strip()) if scheme.lower() == "bearer" else None
    if entry is None:
        message = "Missing or invalid API key: send 'Authorization: Bearer <agent key>'"
        if snap.signs_in:
            message = "Missing or invalid credentials: sign in with OAuth, or send 'Authorization: Bearer <agent key>'"
        raise Refused(401, message, challenge(scope, snap))
    return _key_holder(scope, transport, entry, snap)


def _key_holder(scope: dict, transport: str, entry: KeyEntry, snap: Snapshot) -> Caller:
    if entry.revoked:
        message = "This API key was revoked (or its owner's account closed): ask for a new one"
        raise Refused(401, message, challenge(scope, snap, "invalid_token", message), "KEY_REVOKED")
    if entry.expires_at and time.time() >= entry.expires_at:
        when = datetime.fromtimestamp(entry.expires_at, UTC).isoformat(timespec="minutes")
        message = f"This API key expired at {when}: make a new one"
        raise Refused(401, message, challenge(scope, snap, "invalid_token", message), "KEY_EXPIRED")
    if entry.prefix != ANONYMOUS_KEY:
        _note_use(entry.prefix, (scope.get("client") or ("",))[0])
    owned = {"person_issuer": public_base(scope), "person_subject": str(entry.owner_id)} if entry.owner_id else {}
    return Caller(
        agent_id=entry.agent_id,
        agent_name=entry.agent_name,
        transport=transport,
        team=snap.agent_teams.get(entry.agent_id, ""),
        key_prefix=entry.prefix,
        key_tools=entry.tools,
        public_url=public_base(scope),
        person_name=entry.owner_name if entry.owner_id else "",
        **owned,
    )


# When this process last recorded each key's use: a key's last use is written at most once a minute.
_used: OrderedDict[str, float] = OrderedDict()
_writes: set[asyncio.Task] = set()
USE_RECORD_SECONDS = 60.0


def _note_use(prefix: str, address: str) -> None:
    now = time.monotonic()
    if now - _used.get(prefix, float("-inf")) < USE_RECORD_SECONDS:
        return
    _used[prefix] = now
    _used.move_to_end(prefix)
    while len(_used) > SEEN_PEOPLE:
        _used.popitem(last=False)
    write = asyncio.get_running_loop().create_task(database_async(key_used)(prefix, address))
    _writes.add(write)  # held until done: the loop keeps only a weak reference
    write.add_done_callback(_used_recorded)


def _used_recorded(write: asyncio.Task) -> None:
    _writes.discard(write)
    if not write.cancelled() and write.exception() is not None:
        logger.warning("could not record a key's last use: %s", write.exception())


TOKEN_EXPIRED = "The token this socket was opened with has expired: sign in again and reconnect"
PERSON_DISABLED = "This person is disabled in this gateway: ask its administrators"


def signed_out(caller: Caller, snap: Snapshot | None) -> str:
    """Why a person's long-lived connection may serve no more (its token expired, or they were disabled), or
    "" while it may. A request over HTTP is checked afresh instead."""
    if not caller.person_subject:
        return ""
    if caller.expires_at and time.time() >= caller.expires_at:  # 0: a personal key, which does not expire so
        return TOKEN_EXPIRED
    if snap is not None and (caller.person_issuer, caller.person_subject) in snap.people_disabled:
        return PERSON_DISABLED
    return ""


# People recorded by this process (issuer, subject): each is written once per process, not once per call.
_seen: OrderedDict[tuple[str, str], None] = OrderedDict()
SEEN_PEOPLE = 10_000


async def _person(scope: dict, transport: str, token: str, snap: Snapshot) -> Caller:
    try:
        identity: Identity = await verifier.identity(token, resource_uri(scope), snap.providers, snap.version)
    except TokenRefused as refused:
        code = {403: "INSUFFICIENT_SCOPE", 503: "ISSUER_UNREACHABLE"}.get(refused.status, "INVALID_TOKEN")
        raise Refused(
            refused.status, refused.message, challenge(scope, snap, refused.error, refused.message), code
        ) from None
    caller = await _admitted(scope, transport, identity, snap.providers[identity.issuer], snap)
    return replace(caller, token=token)


async def _signed_in_here(scope: dict, transport: str, token: str, snap: Snapshot) -> Caller:
    """A token of the built-in authorization server: looked up, not verified (it is opaque)."""
    identity = await local_tokens.identity(token, resource_uri(scope), snap.version)
    if identity is None:
        message = "The token is unknown, expired or revoked, or not for this gateway: sign in again"
        raise Refused(401, message, challenge(scope, snap, "invalid_token", message))
    return await _admitted(scope, transport, replace(identity, issuer=public_base(scope)), snap.builtin, snap)


async def _admitted(scope: dict, transport: str, identity: Identity, provider: Provider, snap: Snapshot) -> Caller:
    if provider.agent_id is None:
        message = "People of this identity provider have no agent to act as here: its agent is missing or disabled"
        raise Refused(403, message, challenge(scope, snap), "NO_AGENT_FOR_PEOPLE")
    if (identity.issuer, identity.subject) in snap.people_disabled:
        raise Refused(403, PERSON_DISABLED, challenge(scope, snap), "PERSON_DISABLED")
    await _record_once(identity)
    return Caller(
        agent_id=provider.agent_id,
        agent_name=provider.agent_name,
        transport=transport,
        team=snap.agent_teams.get(provider.agent_id, ""),
        key_prefix="",
        person_issuer=identity.issuer,
        person_subject=identity.subject,
        person_name=identity.name,
        client_id=identity.client_id,
        expires_at=identity.expires_at,
        public_url=public_base(scope),
        groups=tuple(sorted(set().union(*(snap.idp_groups.get(name, ()) for name in identity.groups)))),
        teams=tuple(sorted(set().union(*(snap.team_groups.get(name, ()) for name in identity.groups)))),
    )


async def _record_once(identity: Identity) -> None:
    who = (identity.issuer, identity.subject)
    if who in _seen:
        return
    await database_async(person_seen)(identity.issuer, identity.subject, identity.name)
    _seen[who] = None
    while len(_seen) > SEEN_PEOPLE:
        _seen.popitem(last=False)


# The caller of the request the current task answers (handoff/mcp/handle.py sets it in each request's own task), for
# what the SDK builds without a request at hand: the server's instructions.
answering: ContextVar[Caller | None] = ContextVar("switchboard_answering", default=None)


def caller_of(ctx: ServerRequestContext) -> Caller:
    """The caller the transport attached (handoff/mcp/handle.py puts it where the SDK puts a request), or,
    for the SDK's own look at the tools a 2026-07-28 caller sees (its `Mcp-Param-*` check), the HTTP
    request's scope."""
    request = ctx.request
    return request if isinstance(request, Caller) else request.scope["switchboard.caller"]


def legacy_agent(ctx: ServerRequestContext) -> bool:
    """Whether the request comes from a 2025-11-25 agent (else 2026-07-28)."""
    return ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS


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
