"""How to reach an upstream: plain data built from the model, credentials opened, read only by the executor."""

import logging
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from functools import cached_property, partial
from typing import Any

import anyio
import httpx2
from mcp import Client
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

from registry.credentials import credentials_open
from registry.upstreams.delegation import DelegationAuth
from registry.upstreams.direct import DirectLine
from registry.upstreams.egress import guarded_client
from registry.upstreams.health import Witness
from registry.upstreams.launch import server_start
from registry.upstreams.packages import PackageProblem, asked
from registry.upstreams.packages import command as package_command
from registry.upstreams.prestart import prestarted_take
from registry.upstreams.reply_depth import DepthCheckedTransport
from registry.upstreams.rest import RestClient
from registry.upstreams.sandbox import SandboxSettings
from registry.upstreams.stdio import stdio_transport

logger = logging.getLogger(__name__)
MIN_SECRET_CHARS = 8  # shorter values ("true", "eu", "prod") would blank out ordinary words; keys are longer


def _pin(upstream: Any) -> dict[str, Any]:
    """Its pinned npx or uvx package, if pinned for the command line it has now."""
    pinned = upstream.package.get("pinned") or {}
    return pinned if pinned.get("asked") == [upstream.command, *upstream.args] else {}


@dataclass(frozen=True)
class UpstreamSpec:
    id: int
    revision: int
    slug: str
    transport: str
    timeout: float
    command: str = ""
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    cwd: str = ""
    url: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    query: dict[str, str] = field(default_factory=dict)  # added to every request's URL
    internal: bool = False
    legacy: bool = False  # the last sync found it speaking 2025-11-25 only
    grant: dict[str, Any] | None = None  # a handoff tunnel's delegation (registry/upstreams/delegation.py)
    per_person: bool = False  # each person connects with their own credential (registry/upstreams/person.py)
    person_credential: int = 0  # the person's stored credential it holds (0: none, or an exchanged token)
    person_version: str = ""  # that credential's version
    expires_at: float = 0.0  # when that credential runs out (epoch seconds; 0: not said)
    # Kind rest (registry/upstreams/rest.py): where its operations come from, and which become tools.
    openapi_url: str = ""
    openapi_document: str = ""
    rest_operations: list[dict[str, Any]] = field(default_factory=list)
    rest_select: dict[str, list[str]] = field(default_factory=dict)
    read_only: bool = False
    # A stdio server's confinement (registry/upstreams/sandbox.py), and an npx or uvx server's pinned package
    # (registry/upstreams/packages/; empty: none pinned for this command line).
    sandbox: SandboxSettings = field(default_factory=SandboxSettings)
    package: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_model(cls, upstream: Any) -> "UpstreamSpec":
        return cls(
            id=upstream.id,
            revision=upstream.revision,
            slug=upstream.slug,
            transport=upstream.transport,
            timeout=upstream.call_timeout,
            command=upstream.command,
            args=list(upstream.args),
            env=credentials_open(upstream.env),
            cwd=upstream.cwd,
            url=upstream.url,
            headers=credentials_open(upstream.headers),
            query=credentials_open(upstream.query),
            internal=upstream.internal,
            per_person=upstream.per_person,
            legacy=upstream.protocol_version in HANDSHAKE_PROTOCOL_VERSIONS,
            openapi_url=upstream.openapi_url,
            openapi_document=upstream.openapi_document,
            rest_operations=list(upstream.rest_operations),
            rest_select=dict(upstream.rest_select),
            read_only=upstream.read_only,
            sandbox=SandboxSettings.from_json(upstream.sandbox, upstream.internal),
            package=_pin(upstream),
        )

    @cached_property
    def secrets(self) -> tuple[str, ...]:
        """Its credential values that are long enough to find in text (and a header's token without its
        scheme, as in "Bearer <token>"), longest first: what the upstream's errors must not repeat."""
        values = {*self.env.values(), *self.headers.values(), *self.query.values()}
        values |= {value.split(" ", 1)[1] for value in self.headers.values() if " " in value}
        return tuple(sorted((v for v in values if len(v) >= MIN_SECRET_CHARS), key=len, reverse=True))

    def _stdio_command(self) -> tuple[str, list[str]]:
        """The command line that starts its server: an npx or uvx package's, pinned (installed from its lock
        where this host lacks it), else its own."""
        wanted = asked(self.command, self.args)
        if wanted is None:
            return self.command, self.args
        if not self.package:
            raise PackageProblem("its package is not pinned yet: sync the upstream to install and pin it")
        return package_command(self.slug, self.package, wanted)

    def _http_client(self, **kwargs: Any) -> httpx2.AsyncClient:
        if self.grant:
            kwargs["auth"] = DelegationAuth(self.grant)
        return guarded_client(internal=self.internal, params=self.query, **kwargs)

    async def connect(
        self, stack: AsyncExitStack, witness: Witness, direct: DirectLine | None = None, **options: Any
    ) -> Client | RestClient:
        """An open `mcp.Client` (or, for a REST service, a `RestClient`) whose resources `stack` owns; the
        caller's task must exit the stack. `witness` keeps what the exceptions will not say (stderr, HTTP
        statuses); a stdio server's transport binds `direct` (registry/upstreams/direct.py). The options are
        the client's: its mode, and callbacks (elicitation, sampling, roots: what it declares it can answer)."""
        if self.transport == "rest":
            # Redirects are followed by the client itself, which keeps credentials to the service's own origins.
            http = await stack.enter_async_context(
                guarded_client(internal=self.internal, timeout=self.timeout, event_hooks={"response": [witness.heard]})
            )
            rest = RestClient(self, http, options.get("message_handler"))
            await rest.load()
            return rest
        if self.transport == "stdio":
            witness.ending = ""  # of this process, not one an earlier attempt started
            command, args = await anyio.to_thread.run_sync(self._stdio_command)
            start = server_start(self.slug, command, args, self.env, self.cwd, self.sandbox)
            if start.sandbox is not None and start.sandbox.network == "host":
                logger.warning("upstream %s: its stdio server shares the host's network, unconfined", self.slug)
            prestarted = prestarted_take(start)  # the server serve_demo's launcher started for this, if any
            errlog = witness.errlog(prestarted.errlog if prestarted else None)
            target: Any = stdio_transport(start, errlog, witness.ended, prestarted, direct)
        elif self.transport == "sse":
            factory = partial(self._http_client, event_hooks={"response": [witness.heard]})
            target = sse_client(self.url, headers=self.headers, timeout=self.timeout, httpx_client_factory=factory)
        else:
            http = await stack.enter_async_context(
                self._http_client(
                    headers=self.headers,
                    timeout=httpx2.Timeout(self.timeout, read=None),
                    event_hooks={"response": [witness.heard]},
                )
            )
            # A person's session is left to idle out upstream: ending it would send their credential once more,
            # after it was replaced or deleted (the reason such a connection is stopped).
            target = streamable_http_client(self.url, http_client=http, terminate_on_close=not self.per_person)
        # No response cache: the catalog must see what the upstream says now.
        checked = DepthCheckedTransport(target, self.slug)
        return await stack.enter_async_context(Client(checked, cache=None, **options))
