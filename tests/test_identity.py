"""The gateway as an OAuth 2.1 resource server: an external OIDC provider (npm's oidc-provider, started here)
issues JWT access tokens; people sign in through its pages, the gateway checks their tokens and every audit
row names the person. Bad tokens are forged with the provider's own key (or another) to hit each check."""

import base64
import hashlib
import hmac
import json
import time
from collections.abc import Iterator
from urllib.parse import parse_qs, urlsplit

import anyio
import httpx2
import jwt
import pytest
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from mcp import Client
from mcp.client.auth import OAuthClientProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import AuthorizationCodeResult, OAuthClientMetadata
from playwright.async_api import async_playwright

from registry.models import Upstream
from registry.services import upstream_catalog_sync, upstream_save
from tests import servers
from tests.clients import INITIALIZE, TokenMemory, sdk_client, ws_session
from tests.conftest import needs
from tests.helpers import audit_mark, audit_since, eventually
from tests.idp import ACCEPT, CLIENTS, REDIRECT, Idp, post_initialize, private_jwk

pytestmark = pytest.mark.e2e


def test_the_protected_resource_metadata_names_the_issuer_at_both_paths(idp_gateway):
    idp, gateway = idp_gateway
    for path in ("/.well-known/oauth-protected-resource", "/.well-known/oauth-protected-resource/mcp"):
        reply = httpx2.get(f"{gateway.url}{path}", timeout=5)
        assert reply.status_code == 200, path
        assert reply.json() == {
            "resource": idp.resource,
            "authorization_servers": [idp.issuer],
            "bearer_methods_supported": ["header"],
            "resource_name": "switchboard",
            "scopes_supported": ["mcp"],
        }
        assert reply.headers["access-control-allow-origin"] == "*"


def test_without_credentials_the_challenge_says_where_to_sign_in(idp_gateway):
    _idp, gateway = idp_gateway
    reply = httpx2.post(f"{gateway.url}/mcp", json=INITIALIZE, headers=ACCEPT, timeout=5)
    assert reply.status_code == 401
    metadata = f"{gateway.url}/.well-known/oauth-protected-resource/mcp"
    assert reply.headers["www-authenticate"] == f'Bearer resource_metadata="{metadata}", scope="mcp"'
    assert reply.json()["error"] == {
        "code": -32600,
        "message": "Missing or invalid credentials: sign in with OAuth, or send 'Authorization: Bearer <agent key>'",
    }


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
def test_a_person_signed_in_at_the_idp_calls_a_tool_and_every_row_names_them(idp_gateway, people, mode):
    idp, gateway = idp_gateway
    person = f"grace-{mode}"
    token = idp.person_token(person)
    mark = audit_mark()

    async def scenario():
        async with sdk_client(gateway.url, token, mode) as client:
            return await client.call_tool("demo__echo", {"text": "signed in"})

    result = anyio.run(scenario)
    assert result.content[0].text == "signed in"
    rows = eventually(lambda: [r for r in audit_since(mark) if r.kind == "completed"] and audit_since(mark))
    calls = [row for row in rows if row.tool == "echo"]
    assert [row.kind for row in calls] == ["approved", "completed"]
    for row in calls:
        assert (row.agent_name, row.person_issuer, row.person_subject) == (people, idp.issuer, person)
        assert (row.person_name, row.client_id) == (f"Person {person}", "desk")


def test_a_person_on_the_websocket_is_audited_as_themselves(idp_gateway, people):
    idp, gateway = idp_gateway
    token = idp.person_token("hopper")
    mark = audit_mark()

    async def scenario() -> dict:
        async with ws_session(gateway.url, token) as session:
            return await session.request("tools/call", {"name": "demo__echo", "arguments": {"text": "over ws"}})

    assert anyio.run(scenario)["result"]["content"] == [{"type": "text", "text": "over ws"}]
    rows = eventually(lambda: (r := audit_since(mark, sessions=True)) and len(r) >= 4 and r)
    assert {(row.kind, row.person_subject, row.transport) for row in rows} >= {
        ("session", "hopper", "ws"),
        ("approved", "hopper", "ws"),
        ("completed", "hopper", "ws"),
    }


def test_a_client_credentials_token_is_its_client_acting_for_itself(idp_gateway, people):
    idp, gateway = idp_gateway
    mark = audit_mark()

    async def scenario():
        async with sdk_client(gateway.url, idp.robot_token(), "2026-07-28") as client:
            return await client.call_tool("demo__echo", {"text": "robot"})

    assert anyio.run(scenario).content[0].text == "robot"
    [approved, *_] = [row for row in audit_since(mark) if row.tool == "echo"]
    assert (approved.person_subject, approved.client_id, approved.person_name) == ("robot", "robot", "robot")


BAD_TOKENS = {
    "expired": (
        lambda idp: idp.forge(exp=int(time.time()) - 120, iat=int(time.time()) - 600),
        "The token has expired: sign in again",
    ),
    "not yet valid": (
        lambda idp: idp.forge(nbf=int(time.time()) + 600),
        "The token is not valid yet (its nbf or iat is in the future)",
    ),
    "wrong issuer": (
        lambda idp: idp.forge(iss="https://idp.elsewhere.test"),
        "The token comes from an issuer this gateway does not trust",
    ),
    "wrong audience": (
        lambda idp: idp.forge(aud="https://another-resource.test/mcp"),
        "The token is not meant for this gateway: its audience is not {resource}",
    ),
    "alg none": (
        lambda idp: idp.forge(key=None, algorithm="none"),
        "The token's algorithm 'none' is not accepted (asymmetric signatures only)",
    ),
    "HS256 with the public key": (
        lambda idp: _hs256_with_public_key(idp),
        "The token's algorithm 'HS256' is not accepted (asymmetric signatures only)",
    ),
    "unknown kid": (
        lambda idp: idp.forge(key=private_jwk("idp-9")[0], kid="idp-9"),
        "The token is signed with a key ('idp-9') that its issuer does not publish",
    ),
    "bad signature": (
        lambda idp: idp.forge(key=private_jwk("idp-1")[0]),
        "The token's signature does not verify",
    ),
    "no expiry": (lambda idp: idp.forge(exp=None), "The token has no 'exp' claim"),
    "not a JWT": (lambda idp: "abc.def.ghi", "The token is not a well-formed JWT"),
}


def _hs256_with_public_key(idp: Idp) -> str:
    """The classic confusion attack: the public key, which anyone can fetch, used as an HMAC secret."""
    public = idp.key.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
    header = base64.urlsafe_b64encode(json.dumps({"alg": "HS256", "kid": "idp-1"}).encode()).rstrip(b"=")
    claims = jwt.decode(idp.forge(), options={"verify_signature": False})
    body = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=")
    signature = base64.urlsafe_b64encode(hmac.new(public, header + b"." + body, hashlib.sha256).digest()).rstrip(b"=")
    return b".".join([header, body, signature]).decode()


@pytest.mark.parametrize("case", sorted(BAD_TOKENS))
def test_a_bad_token_is_refused_with_its_reason_audited_and_the_gateway_goes_on(idp_gateway, case):
    idp, gateway = idp_gateway
    make, message = BAD_TOKENS[case]
    message = message.format(resource=idp.resource)
    mark = audit_mark()
    reply = post_initialize(gateway, make(idp))
    assert reply.status_code == 401
    metadata = f"{gateway.url}/.well-known/oauth-protected-resource/mcp"
    assert reply.headers["www-authenticate"] == (
        f'Bearer resource_metadata="{metadata}", scope="mcp", error="invalid_token", '
        f'error_description="{message.replace(chr(34), chr(39))}"'
    )
    assert reply.json()["error"] == {"code": -32600, "message": message}
    [row] = eventually(lambda: audit_since(mark))
    assert (row.kind, row.outcome, row.error_code, row.error_detail) == ("denied", "denied", "INVALID_TOKEN", message)
    assert post_initialize(gateway, idp.robot_token()).status_code == 200  # and the next good token is served


def test_a_token_without_the_required_scope_is_forbidden_with_insufficient_scope(idp_gateway):
    idp, gateway = idp_gateway
    mark = audit_mark()
    reply = post_initialize(gateway, idp.forge(scope="openid"))
    message = "The token lacks the scope mcp that this gateway requires"
    assert reply.status_code == 403
    assert 'error="insufficient_scope"' in reply.headers["www-authenticate"]
    assert reply.json()["error"] == {"code": -32600, "message": message}
    [row] = eventually(lambda: audit_since(mark))
    assert (row.error_code, row.error_detail) == ("INSUFFICIENT_SCOPE", message)


def test_a_token_in_the_query_string_is_refused_even_when_valid(idp_gateway):
    idp, gateway = idp_gateway
    mark = audit_mark()
    reply = httpx2.post(
        f"{gateway.url}/mcp?access_token={idp.robot_token()}", json=INITIALIZE, headers=ACCEPT, timeout=5
    )
    message = "Send the token in the Authorization header: a token in the URL is refused (it ends up in logs)"
    assert reply.status_code == 400
    assert 'error="invalid_request"' in reply.headers["www-authenticate"]
    assert reply.json()["error"] == {"code": -32600, "message": message}
    [row] = eventually(lambda: audit_since(mark))
    assert row.error_code == "TOKEN_IN_URL" and idp.issuer not in row.error_detail


def test_an_oversized_token_is_refused_before_it_is_parsed(idp_gateway):
    idp, gateway = idp_gateway
    reply = post_initialize(gateway, idp.forge(padding="x" * 9000))
    assert reply.status_code == 401
    assert reply.json()["error"]["message"] == "The token is over 8192 bytes"


def test_a_token_on_the_websocket_handshake_is_checked_too(idp_gateway):
    idp, gateway = idp_gateway
    mark = audit_mark()

    async def scenario() -> None:
        async with ws_session(gateway.url, idp.forge(exp=int(time.time()) - 120, iat=int(time.time()) - 600)):
            pass

    with pytest.raises(Exception, match="403"):
        anyio.run(scenario)
    [row] = eventually(lambda: audit_since(mark))
    assert (row.transport, row.error_code) == ("ws", "INVALID_TOKEN")


def test_keys_already_fetched_keep_working_while_the_idp_is_down_and_none_is_a_clear_503(
    server_env, world, people, logs
):
    port = servers.free_port()
    resource = f"http://127.0.0.1:{port}/mcp"
    key, jwk = private_jwk("idp-1")
    provider = servers.start_oidc_provider(resource, {"keys": [jwk]}, CLIENTS, logs / "oidc-provider-down.log")
    idp = Idp(provider.url, resource, key)
    settings = {"GATEWAY_OIDC_ISSUER": provider.url, "GATEWAY_OIDC_AGENT": people}
    with servers.inline_gateway_with(server_env, logs / "gateway-oidc-down.log", port, **settings) as gateway:
        try:
            assert post_initialize(gateway, idp.forge(sub="before")).status_code == 200  # the keys are fetched now
        finally:
            provider.stop()
        assert post_initialize(gateway, idp.forge(sub="after")).status_code == 200  # a new token, the cached key
        mark = audit_mark()
        reply = post_initialize(gateway, idp.forge(key=private_jwk("idp-2")[0], kid="idp-2"))
        assert reply.status_code == 401  # an unknown key, and the issuer cannot be asked about it
    dead = {"GATEWAY_OIDC_ISSUER": idp.issuer, "GATEWAY_OIDC_AGENT": people}
    with servers.inline_gateway_with(server_env, logs / "gateway-oidc-dead.log", port, **dead) as gateway:
        reply = post_initialize(gateway, idp.forge())
        message = f"The gateway cannot reach the signing keys of {idp.issuer} to check the token; try again shortly"
        assert reply.status_code == 503
        assert reply.json()["error"]["message"] == message
        assert httpx2.get(f"{gateway.url}/healthz", timeout=5).status_code == 200
    rows = [row.error_code for row in audit_since(mark)]
    assert rows == ["INVALID_TOKEN", "ISSUER_UNREACHABLE"]


@pytest.fixture(scope="module")
def header_upstream(world, logs) -> Iterator[str]:
    """The demo server over Streamable HTTP: its `header` tool answers with a header of the request it got."""
    demo = servers.start_demo_http(logs / "demo-http-identity.log")
    upstream = Upstream(slug="hdrs", transport="streamable_http", url=demo.url)
    upstream_save(upstream=upstream, created=True)
    assert upstream_catalog_sync(upstream=upstream).ok
    yield upstream.slug
    upstream.delete()
    demo.stop()


def test_the_inbound_token_never_reaches_an_upstream(idp_gateway, header_upstream):
    idp, gateway = idp_gateway
    token = idp.person_token("passthrough")

    async def scenario() -> list[str]:
        async with sdk_client(gateway.url, token, "legacy") as client:
            return [
                (await client.call_tool(f"{header_upstream}__header", {"name": name})).content[0].text
                for name in ("authorization", "host")
            ]

    authorization, host = anyio.run(scenario)
    assert authorization == ""
    assert host.startswith("127.0.0.1:")  # the tool reads headers: an empty answer is an absent header


async def _oauth_through_the_idp(gateway_url: str, login: str) -> tuple[str, str]:
    """The official SDK client with only OAuth: it finds the IdP from the gateway's metadata, registers there,
    and the person signs in and consents at the IdP in Chromium. The echo, and the client id it registered."""
    needs(servers.CHROMIUM.exists(), "Chromium is not installed (apt-get install chromium)")
    redirected: dict[str, str] = {}
    storage = TokenMemory()
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=str(servers.CHROMIUM), args=servers.CHROMIUM_ARGS)

        async def sign_in(url: str) -> None:
            page = await browser.new_page()
            page.set_default_timeout(10_000)
            arrived = anyio.Event()

            async def intercept(route) -> None:
                query = parse_qs(urlsplit(route.request.url).query)
                redirected.update({name: values[0] for name, values in query.items()})
                await route.fulfill(status=200, body="signed in")
                arrived.set()

            await page.route(f"{REDIRECT}**", intercept)
            await page.goto(url)
            await page.fill("input[name=login]", login)
            await page.fill("input[name=password]", "any")
            await page.click("button[type=submit]")
            await page.click("button[type=submit]")  # consent
            with anyio.fail_after(10):
                await arrived.wait()
            await page.close()

        async def callback() -> AuthorizationCodeResult:
            return AuthorizationCodeResult(
                code=redirected["code"], state=redirected.get("state"), iss=redirected.get("iss")
            )

        metadata = OAuthClientMetadata(
            client_name="IdP Desktop", redirect_uris=[REDIRECT], token_endpoint_auth_method="none", scope="mcp"
        )
        auth = OAuthClientProvider(f"{gateway_url}/mcp", metadata, storage, sign_in, callback)
        try:
            async with httpx2.AsyncClient(auth=auth, timeout=30) as http:
                async with Client(streamable_http_client(f"{gateway_url}/mcp", http_client=http), mode="legacy") as c:
                    result = await c.call_tool("demo__echo", {"text": "through my IdP"})
        finally:
            await browser.close()
    return result.content[0].text, storage.client.client_id


def test_an_oauth_only_client_signs_its_person_in_at_the_external_idp(idp_gateway, people):
    idp, gateway = idp_gateway
    mark = audit_mark()
    text, client_id = anyio.run(_oauth_through_the_idp, gateway.url, "ursula")
    assert text == "through my IdP"
    rows = [row for row in audit_since(mark) if row.tool == "echo"]
    assert [row.kind for row in rows] == ["approved", "completed"]
    assert {(r.agent_name, r.person_issuer, r.person_subject, r.client_id) for r in rows} == {
        (people, idp.issuer, "ursula", client_id)
    }
