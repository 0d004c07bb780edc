"""The SSRF guard: HTTP upstreams reach only public addresses unless an administrator marks them internal.
Checked when an upstream is saved and on every request the executor sends, redirects included."""

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import anyio
import httpx2
import pytest
from django.core.exceptions import ValidationError
from django.test import override_settings

from audit.services import canonical_sha256
from registry.models import Tool, Upstream
from registry.services import upstream_catalog_sync, upstream_save
from registry.upstreams.egress import EgressRefused, GuardedTransport
from tests.clients import call, tool_names
from tests.helpers import audit_mark, audit_since, eventually, run


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://169.254.169.254/latest/mcp", "169.254.169.254 is not a public address"),
        ("http://10.0.0.8:8080/mcp", "10.0.0.8 is not a public address"),
        ("http://[::1]/mcp", "::1 is not a public address"),
        ("http://[::ffff:10.0.0.1]/mcp", "::ffff:a00:1 is not a public address"),
        ("http://127.0.0.2:8080/mcp", "127.0.0.2 is not a public address"),
        ("http://localhost:3000/mcp", "localhost is a loopback name"),
    ],
)
def test_an_http_upstream_on_a_private_address_is_refused_unless_marked_internal(url, why):
    upstream = Upstream(slug="inside", transport="streamable_http", url=url)
    with pytest.raises(ValidationError) as refused:
        upstream.full_clean(exclude=["group"])
    assert refused.value.message_dict["url"] == [f"{why}. Mark the upstream as internal to allow it."]
    upstream.internal = True
    upstream.full_clean(exclude=["group"])


def test_a_call_to_an_upstream_on_the_metadata_address_never_leaves_the_gateway(gateway, world):
    # As if a host name had resolved there: the row skips the form's check, the executor's guard remains.
    upstream = Upstream.objects.create(slug="metadata", transport="streamable_http", url="http://169.254.169.254/mcp")
    definition = {"name": "fetch", "inputSchema": {"type": "object"}}
    sha256 = canonical_sha256(definition)
    Tool.objects.create(
        upstream=upstream, name="fetch", definition=definition, definition_sha256=sha256, approved_sha256=sha256,
        last_seen_at=upstream.created_at,
    )  # fmt: skip
    try:
        eventually(lambda: "metadata__fetch" in run(lambda: tool_names(gateway.url, world.key)))
        mark = audit_mark()
        result = run(lambda: call(gateway.url, world.key, "metadata__fetch", {}))
    finally:
        upstream.delete()
    assert result.content[0].text == (
        "metadata__fetch: The gateway does not connect to this service's network address. Do not retry."
    )
    [completed] = [r for r in audit_since(mark) if r.kind == "completed"]
    assert completed.error_code == "UPSTREAM_ADDRESS_REFUSED"
    assert completed.error_detail == "169.254.169.254 is not a public address"


@contextmanager
def http_server(handler: type[BaseHTTPRequestHandler], host: str) -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer((host, 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def test_a_redirect_to_a_refused_address_is_refused_before_it_is_followed(db):
    """The SDK's transports follow redirects only within the endpoint's origin, and the guard checks every
    request they send; either way the refused address never sees a request."""
    hits: list[str] = []

    class Target(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            hits.append(self.path)
            self.send_error(500)

        def log_message(self, *args) -> None: ...

    with http_server(Target, "127.0.0.2") as target:

        class Redirect(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.send_response(307)
                self.send_header("Location", f"http://127.0.0.2:{target.server_address[1]}/mcp")
                self.end_headers()

            def log_message(self, *args) -> None: ...

        with (
            http_server(Redirect, "127.0.0.1") as redirect,
            override_settings(GATEWAY_EGRESS_ALLOWED_NETWORKS=["127.0.0.1/32"]),
        ):
            url = f"http://127.0.0.1:{redirect.server_address[1]}/mcp"
            upstream = Upstream(slug="redirected", transport="streamable_http", url=url, timeout=3)
            upstream.full_clean(exclude=["group"])  # 127.0.0.1 is allowed here; 127.0.0.2 is not
            upstream_save(upstream=upstream, created=True)
            try:
                report = upstream_catalog_sync(upstream=upstream)
            finally:
                upstream.delete()
    assert not report.ok, report.summary()
    assert hits == [], "the redirect was followed to a refused address"


def test_a_connection_goes_to_the_address_that_was_checked_not_to_a_second_resolution(db):
    """DNS rebinding: a name that resolves to a public address, then to a private one. The guard resolves
    once per connection and connects to what it checked; here the test plays the resolver (this machine's
    DNS cannot be steered), and the server behind the name is a real one on loopback."""
    answers = iter([["127.0.0.1"], ["10.9.9.9"]])
    seen: list[str] = []

    class Echo(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.headers["Host"])
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args) -> None: ...

    async def resolver(host: str, port: int) -> list[str]:
        return next(answers)

    async def two_connections(port: int) -> list:
        outcomes = []
        for _ in range(2):
            async with httpx2.AsyncClient(transport=GuardedTransport(resolver)) as client:
                try:
                    outcomes.append((await client.get(f"http://api.example.test:{port}/")).status_code)
                except EgressRefused as refused:
                    outcomes.append(str(refused))
        return outcomes

    with http_server(Echo, "127.0.0.1") as server:
        outcomes = anyio.run(two_connections, server.server_address[1])
    assert outcomes == [204, "api.example.test resolves to 10.9.9.9, which is not a public address"]
    assert seen == [f"api.example.test:{server.server_address[1]}"], "the request keeps its host name"
