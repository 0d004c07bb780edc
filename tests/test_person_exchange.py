"""Token exchange (RFC 8693): a person signed in at the IdP reaches the upstream with a token the executor got by
exchanging theirs, whose audience is the upstream; their own token never reaches the upstream, and a key or a
refused exchange gets a clear answer."""

import json

import anyio
import pytest
from mcp.shared.exceptions import MCPError

from policy.models import Agent
from tests import servers
from tests.clients import sdk_client, tool_names
from tests.factories import person_upstream
from tests.helpers import audit_mark, audit_since, eventually
from tests.idp import CLIENTS, REDIRECT, Idp, private_jwk

pytestmark = pytest.mark.e2e

EXCHANGE = "urn:ietf:params:oauth:grant-type:token-exchange"
GATEWAY_CLIENT = {"client_id": "switchboard", "client_secret": "switchboard-secret", "redirect_uris": [REDIRECT]}
GATEWAY_CLIENT |= {"grant_types": [EXCHANGE], "response_types": []}
CATALOG_TOKEN = "tok-catalog-4d8e2a1f"


@pytest.fixture(scope="module")
def exchanging(server_env, world, logs):
    """The IdP knowing the gateway's and the upstream's resources; the upstream, per person by exchange; and a
    gateway that trusts the IdP (and may reach it on loopback)."""
    gateway_port, upstream_port = servers.free_port(), servers.free_port()
    gateway_resource = f"http://127.0.0.1:{gateway_port}/mcp"
    upstream_url = f"http://127.0.0.1:{upstream_port}/mcp"
    key, jwk = private_jwk("idp-1")
    with pytest.MonkeyPatch.context() as patch:  # start_oidc_provider passes its own environment on
        patch.setenv("OIDC_UPSTREAM_RESOURCE", upstream_url)
        provider = servers.start_oidc_provider(
            gateway_resource, {"keys": [jwk]}, [*CLIENTS, GATEWAY_CLIENT], logs / "oidc-provider-exchange.log"
        )
    seen = logs / "exchange-seen.log"
    tokens = {"catalog": CATALOG_TOKEN}
    upstream_process = servers.start_protected_upstream(
        provider.url, logs / "exchange-upstream.log", tokens=tokens, seen=seen, port=upstream_port
    )
    agent = Agent.objects.get_or_create(name="exchange-people")[0]
    client = {"client_id": GATEWAY_CLIENT["client_id"], "client_secret": GATEWAY_CLIENT["client_secret"]}
    exchange = {"person_connect": "exchange", "exchange_url": f"{provider.url}/token", "person_scope": "upstream"}
    upstream = person_upstream(
        "vault",
        CATALOG_TOKEN,
        transport="streamable_http",
        url=upstream_url,
        internal=True,
        person_client=client,
        **exchange,
    )
    settings = {"GATEWAY_OIDC_ISSUER": provider.url, "GATEWAY_OIDC_AGENT": agent.name, "GATEWAY_OIDC_SCOPES": "mcp"}
    settings |= {"GATEWAY_INTERNAL_AUTH_SERVERS": provider.url}
    try:
        with servers.inline_gateway_with(
            server_env, logs / "gateway-exchange.log", gateway_port, **settings
        ) as gateway:
            idp = Idp(provider.url, gateway_resource, key)
            yield {
                "idp": idp,
                "gateway": gateway,
                "seen": seen,
                "world": world,
                "upstream": upstream,
                "log": logs / "gateway-exchange.log",
            }
    finally:
        upstream.delete()
        agent.delete()
        upstream_process.stop()
        provider.stop()


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
def test_a_person_reaches_the_upstream_with_an_exchanged_token(exchanging, mode):
    idp, gateway = exchanging["idp"], exchanging["gateway"]
    login = f"fay-{mode}"
    token = idp.person_token(login)
    eventually(lambda: "vault__whoami" in anyio.run(tool_names, gateway.url, token, mode))
    mark = audit_mark()

    async def whoami() -> list[dict]:
        async with sdk_client(gateway.url, token, mode) as client:
            return [json.loads((await client.call_tool("vault__whoami", {})).content[0].text) for _ in range(2)]

    first, second = anyio.run(whoami)
    assert (first["person"], first["audience"]) == (login, exchanging["upstream"].url)
    assert second == first  # one exchange, one connection, for the person's sign-in
    seen = exchanging["seen"].read_text()
    assert token not in seen  # the person's own token never reaches the upstream
    assert token not in exchanging["log"].read_text()  # nor the gateway's log
    row = eventually(lambda: [r for r in audit_since(mark) if r.kind == "completed"])[0]
    assert row.detail["credential"] == {"kind": "exchange"} and row.person_subject == login


def test_an_api_key_cannot_be_exchanged(exchanging):
    gateway, world = exchanging["gateway"], exchanging["world"]

    async def call() -> MCPError:
        async with sdk_client(gateway.url, world.key, "legacy") as client:
            with pytest.raises(MCPError) as refused:
                await client.call_tool("vault__whoami", {})
            return refused.value

    refused = anyio.run(call)
    assert refused.error.data["code"] == "PERSON_REQUIRED"


def test_an_exchange_the_idp_refuses_is_a_clear_error(exchanging):
    idp, gateway, good = exchanging["idp"], exchanging["gateway"], exchanging["upstream"]
    exchange = {"person_connect": "exchange", "exchange_url": good.exchange_url, "person_scope": "upstream"}
    client = {"client_id": GATEWAY_CLIENT["client_id"], "client_secret": "not-the-secret"}
    bad = person_upstream(
        "vault-bad",
        CATALOG_TOKEN,
        transport="streamable_http",
        url=good.url,
        internal=True,
        person_client=client,
        **exchange,
    )
    try:
        token = idp.person_token("gil")
        eventually(lambda: "vault-bad__whoami" in anyio.run(tool_names, gateway.url, token))

        async def call():
            async with sdk_client(gateway.url, token, "legacy") as client:
                return await client.call_tool("vault-bad__whoami", {})

        result = anyio.run(call)
        assert result.is_error
        assert result.content[0].text == (
            "vault-bad__whoami: vault-bad would not accept your sign-in: sign in again, or ask its admins."
        )
    finally:
        bad.delete()
