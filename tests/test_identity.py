"""The gateway as an OAuth 2.1 resource server: an external OIDC provider (npm's oidc-provider, started here)
issues JWT access tokens; people sign in through its pages, the gateway checks their tokens and every audit
row names the person. Bad tokens are forged with the provider's own key (or another) to hit each check."""

import base64
import hashlib
import hmac
import json
import re
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import parse_qs, urlencode, urljoin, urlsplit

import anyio
import httpx2
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from django.contrib.auth import get_user_model
from jwt.algorithms import RSAAlgorithm
from mcp import Client
from mcp.client.auth import OAuthClientProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import AuthorizationCodeResult, OAuthClientMetadata
from playwright.async_api import async_playwright

from policy.models import AgentGroup, IdentityProvider, Person, Rule
from registry.credentials import public_key_of
from registry.models import Upstream
from registry.services import upstream_catalog_sync, upstream_save
from tests import servers
from tests.clients import INITIALIZE, TokenMemory, call, sdk_client, tool_names, ws_session
from tests.conftest import needs
from tests.factories import agent
from tests.helpers import audit_mark, audit_since, eventually, orm, until

pytestmark = pytest.mark.e2e
REDIRECT = "http://127.0.0.1:9/callback"  # never opened: the code is read off the redirect
CLIENTS = [
    {"client_id": "robot", "client_secret": "robot-secret", "grant_types": ["client_credentials"]}
    | {"redirect_uris": [], "response_types": []},
    {"client_id": "desk", "token_endpoint_auth_method": "none", "grant_types": ["authorization_code"]}
    | {"redirect_uris": [REDIRECT], "response_types": ["code"]},
]
ACCEPT = {"Accept": "application/json, text/event-stream"}


def _private_jwk(kid: str) -> tuple[rsa.RSAPrivateKey, dict]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key, json.loads(RSAAlgorithm.to_jwk(key)) | {"kid": kid, "use": "sig", "alg": "RS256"}


@dataclass
class Idp:
    issuer: str
    resource: str
    key: rsa.RSAPrivateKey  # the provider's signing key, kid idp-1

    def forge(self, key=None, kid: str | None = "idp-1", algorithm: str = "RS256", **claims) -> str:
        """A token as the provider would sign it, with any claim changed (None removes it)."""
        now = int(time.time())
        body = {"iss": self.issuer, "aud": self.resource, "sub": "forged", "iat": now, "exp": now + 300}
        body |= {"scope": "mcp", "client_id": "desk"}
        body = {name: value for name, value in (body | claims).items() if value is not None}
        headers = {"kid": kid} if kid else {}
        signer = None if algorithm == "none" else key or self.key
        return jwt.encode(body, signer, algorithm=algorithm, headers=headers)

    def robot_token(self) -> str:
        grant = {"grant_type": "client_credentials", "scope": "mcp", "resource": self.resource}
        reply = httpx2.post(f"{self.issuer}/token", data=grant, auth=("robot", "robot-secret"), timeout=10)
        return reply.json()["access_token"]

    def person_token(self, login: str) -> str:
        """A person signs in through the provider's pages (login, then consent) with PKCE, as a browser would."""
        verifier = secrets.token_urlsafe(48)
        challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
        query = {"client_id": "desk", "response_type": "code", "redirect_uri": REDIRECT, "state": "s"}
        query |= {"scope": "openid mcp", "resource": self.resource}
        query |= {"code_challenge": challenge, "code_challenge_method": "S256"}
        with httpx2.Client(base_url=self.issuer, timeout=10) as http:
            page = http.get(f"/auth?{urlencode(query)}")
            for _step in range(10):
                if page.status_code in (302, 303):
                    location = page.headers["location"]
                    if location.startswith(REDIRECT):
                        break
                    page = http.get(urljoin(self.issuer, location))
                    continue
                form = dict(re.findall(r'name="([^"]+)"(?: [^>]*)? value="([^"]*)"', page.text))
                if 'name="login"' in page.text:
                    form |= {"login": login, "password": "any"}
                action = re.search(r'action="([^"]+)"', page.text).group(1)
                page = http.post(urljoin(self.issuer, action), data=form)
            code = parse_qs(urlsplit(page.headers["location"]).query)["code"][0]
            exchange = {"grant_type": "authorization_code", "code": code, "redirect_uri": REDIRECT}
            exchange |= {"client_id": "desk", "code_verifier": verifier, "resource": self.resource}
            return http.post("/token", data=exchange).json()["access_token"]


@pytest.fixture(scope="module")
def people(db) -> Iterator[str]:
    with agent("oidc-people", calls_per_minute=2) as (someone, _key):  # for each person (see the rate test)
        yield someone.name


CONSOLE_SECRET = "console-secret-for-tests-only"


@pytest.fixture(scope="module")
def idp_gateway(server_env, world, people, logs) -> Iterator[tuple[Idp, servers.Running]]:
    port = servers.free_port()
    resource = f"http://127.0.0.1:{port}/mcp"
    key, jwk = _private_jwk("idp-1")
    console = {"client_id": "console", "client_secret": CONSOLE_SECRET, "grant_types": ["authorization_code"]}
    console |= {"redirect_uris": [f"http://127.0.0.1:{port}/oidc/callback/"], "response_types": ["code"]}
    clients = [*CLIENTS, console]
    provider = servers.start_oidc_provider(resource, {"keys": [jwk]}, clients, logs / "oidc-provider.log")
    settings = {"GATEWAY_OIDC_ISSUER": provider.url, "GATEWAY_OIDC_AGENT": people, "GATEWAY_OIDC_SCOPES": "mcp"}
    settings |= {"GATEWAY_CONSOLE_OIDC_CLIENT_ID": "console", "GATEWAY_CONSOLE_OIDC_CLIENT_SECRET": CONSOLE_SECRET}
    try:
        with servers.inline_gateway_with(server_env, logs / "gateway-oidc.log", port, **settings) as gateway:
            yield Idp(provider.url, resource, key), gateway
    finally:
        provider.stop()


def _post(gateway: servers.Running, token: str, url_suffix: str = "") -> httpx2.Response:
    headers = ACCEPT | {"Authorization": f"Bearer {token}"}
    return httpx2.post(f"{gateway.url}/mcp{url_suffix}", json=INITIALIZE, headers=headers, timeout=10)


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
        lambda idp: idp.forge(key=_private_jwk("idp-9")[0], kid="idp-9"),
        "The token is signed with a key ('idp-9') that its issuer does not publish",
    ),
    "bad signature": (
        lambda idp: idp.forge(key=_private_jwk("idp-1")[0]),
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
    reply = _post(gateway, make(idp))
    assert reply.status_code == 401
    metadata = f"{gateway.url}/.well-known/oauth-protected-resource/mcp"
    assert reply.headers["www-authenticate"] == (
        f'Bearer resource_metadata="{metadata}", scope="mcp", error="invalid_token", '
        f'error_description="{message.replace(chr(34), chr(39))}"'
    )
    assert reply.json()["error"] == {"code": -32600, "message": message}
    [row] = eventually(lambda: audit_since(mark))
    assert (row.kind, row.outcome, row.error_code, row.error_detail) == ("denied", "denied", "INVALID_TOKEN", message)
    assert _post(gateway, idp.robot_token()).status_code == 200  # and the next good token is served


def test_a_token_without_the_required_scope_is_forbidden_with_insufficient_scope(idp_gateway):
    idp, gateway = idp_gateway
    mark = audit_mark()
    reply = _post(gateway, idp.forge(scope="openid"))
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
    reply = _post(gateway, idp.forge(padding="x" * 9000))
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
    key, jwk = _private_jwk("idp-1")
    provider = servers.start_oidc_provider(resource, {"keys": [jwk]}, CLIENTS, logs / "oidc-provider-down.log")
    idp = Idp(provider.url, resource, key)
    settings = {"GATEWAY_OIDC_ISSUER": provider.url, "GATEWAY_OIDC_AGENT": people}
    with servers.inline_gateway_with(server_env, logs / "gateway-oidc-down.log", port, **settings) as gateway:
        try:
            assert _post(gateway, idp.forge(sub="before")).status_code == 200  # the keys are fetched now
        finally:
            provider.stop()
        assert _post(gateway, idp.forge(sub="after")).status_code == 200  # a new token, the cached key
        mark = audit_mark()
        reply = _post(gateway, idp.forge(key=_private_jwk("idp-2")[0], kid="idp-2"))
        assert reply.status_code == 401  # an unknown key, and the issuer cannot be asked about it
    dead = {"GATEWAY_OIDC_ISSUER": idp.issuer, "GATEWAY_OIDC_AGENT": people}
    with servers.inline_gateway_with(server_env, logs / "gateway-oidc-dead.log", port, **dead) as gateway:
        reply = _post(gateway, idp.forge())
        message = f"The gateway cannot reach the signing keys of {idp.issuer} to check the token; try again shortly"
        assert reply.status_code == 503
        assert reply.json()["error"]["message"] == message
        assert httpx2.get(f"{gateway.url}/healthz", timeout=5).status_code == 200
    rows = [row.error_code for row in audit_since(mark)]
    assert rows == ["INVALID_TOKEN", "ISSUER_UNREACHABLE"]


def test_each_person_has_the_agents_rate_of_their_own(idp_gateway):
    idp, gateway = idp_gateway

    async def calls(token: str, count: int) -> list:
        return [await call(gateway.url, token, "demo__echo", {"text": str(n)}, "2026-07-28") for n in range(count)]

    ada, lin = idp.forge(sub="ada"), idp.forge(sub="lin")
    *served, refused = anyio.run(calls, ada, 3)
    assert [result.content[0].text for result in served] == ["0", "1"]
    assert refused.error.data["code"] == "AGENT_RATE_LIMITED"
    assert refused.error.message.startswith("You may make 2 tool calls a minute. Retry after")
    assert [result.content[0].text for result in anyio.run(calls, lin, 1)] == ["0"]  # another person is not held


def test_a_person_cannot_drive_another_persons_session(idp_gateway):
    idp, gateway = idp_gateway
    opened = _post(gateway, idp.forge(sub="owner"))
    session_id = opened.headers["mcp-session-id"]
    listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
    for person, status in (("intruder", 404), ("owner", 200)):
        headers = ACCEPT | {"Authorization": f"Bearer {idp.forge(sub=person)}", "mcp-session-id": session_id}
        headers |= {"mcp-protocol-version": "2025-11-25"}
        reply = httpx2.post(f"{gateway.url}/mcp", json=listing, headers=headers, timeout=10)
        assert reply.status_code == status, person
    assert (
        "Session not found"
        in httpx2.post(
            f"{gateway.url}/mcp",
            json=listing,
            headers=ACCEPT | {"Authorization": f"Bearer {idp.forge(sub='intruder')}", "mcp-session-id": session_id},
            timeout=10,
        ).text
    )


def test_a_socket_serves_nothing_once_its_token_expires(idp_gateway):
    idp, gateway = idp_gateway
    expires = int(time.time()) + 3
    mark = audit_mark()

    async def scenario() -> tuple[dict, dict]:
        async with ws_session(gateway.url, idp.forge(sub="brief", exp=expires)) as session:
            before = await session.request("tools/call", {"name": "demo__echo", "arguments": {"text": "in time"}})
            await until(lambda: time.time() > expires, timeout=10)
            return before, await session.request("tools/list")

    def session_closed() -> list:
        return [row for row in audit_since(mark, sessions=True) if row.detail.get("action") == "session_closed"]

    before, after = anyio.run(scenario)
    assert before["result"]["content"] == [{"type": "text", "text": "in time"}]
    assert after["error"] == {
        "code": -32600,
        "message": "The token this socket was opened with has expired: sign in again and reconnect",
    }
    closed = eventually(
        lambda: [r for r in audit_since(mark, sessions=True) if r.detail.get("action") == "session_closed"]
    )
    assert closed[0].detail["reason"] == after["error"]["message"] and closed[0].person_subject == "brief"


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


def test_a_person_met_is_recorded_and_once_disabled_is_refused_on_the_next_call(idp_gateway):
    idp, gateway = idp_gateway
    token = idp.forge(sub="dora", name="Dora M")
    assert _post(gateway, token).status_code == 200
    person = eventually(lambda: Person.objects.filter(issuer=idp.issuer, subject="dora").first())
    assert (person.name, person.enabled, person.first_seen is not None) == ("Dora M", True, True)
    person.enabled = False
    person.save()  # as the console does: the snapshot follows
    mark = audit_mark()
    try:
        refused = eventually(lambda: (reply := _post(gateway, token)).status_code == 403 and reply)
    finally:
        Person.objects.filter(pk=person.pk).update(enabled=True)
        person.refresh_from_db()
        person.save()
    message = "This person is disabled in this gateway: ask its administrators"
    assert refused.json()["error"] == {"code": -32600, "message": message}
    assert "PERSON_DISABLED" in {row.error_code for row in audit_since(mark)}
    assert eventually(lambda: _post(gateway, token).status_code == 200)  # enabled again


def test_an_identity_provider_registered_in_the_console_signs_people_in_until_it_is_removed(
    idp_gateway, server_env, logs
):
    _idp, gateway = idp_gateway
    key, jwk = _private_jwk("second-1")
    provider = servers.start_oidc_provider(_idp.resource, {"keys": [jwk]}, CLIENTS, logs / "oidc-provider-2.log")
    second = Idp(provider.url, _idp.resource, key)
    with agent("contractors") as (contractors, _key):
        row = IdentityProvider.objects.create(name="second", issuer=second.issuer, agent=contractors)
        try:

            def listed() -> dict | None:
                metadata = httpx2.get(f"{gateway.url}/.well-known/oauth-protected-resource", timeout=5).json()
                return metadata if second.issuer in metadata["authorization_servers"] else None

            metadata = eventually(listed)
            assert sorted(metadata["authorization_servers"]) == sorted([_idp.issuer, second.issuer])
            mark = audit_mark()

            async def scenario():
                async with sdk_client(gateway.url, second.forge(sub="kim", kid="second-1"), "2026-07-28") as client:
                    return await client.call_tool("demo__echo", {"text": "second idp"})

            assert anyio.run(scenario).content[0].text == "second idp"
            [approved, *_] = [row for row in audit_since(mark) if row.tool == "echo"]
            assert (approved.agent_name, approved.person_issuer, approved.person_subject) == (
                "contractors",
                second.issuer,
                "kim",
            )
        finally:
            row.delete()
            provider.stop()
        refused = eventually(
            lambda: (reply := _post(gateway, second.forge(kid="second-1"))).status_code == 401 and reply
        )
        assert refused.json()["error"]["message"] == "The token comes from an issuer this gateway does not trust"


def test_a_socket_serves_nothing_once_its_person_is_disabled(idp_gateway):
    idp, gateway = idp_gateway
    call = {"name": "demo__echo", "arguments": {"text": "still me"}}

    async def scenario() -> tuple[dict, dict]:
        async with ws_session(gateway.url, idp.forge(sub="wes")) as session:
            before = await session.request("tools/call", call)
            person = await orm(lambda: Person.objects.get(issuer=idp.issuer, subject="wes"))
            person.enabled = False
            await orm(person.save)

            async def refused() -> dict | None:
                reply = await session.request("tools/list")
                return reply if "error" in reply else None

            return before, await until(refused, timeout=10)

    try:
        before, after = anyio.run(scenario)
    finally:
        for person in Person.objects.filter(issuer=idp.issuer, subject="wes"):
            person.enabled = True
            person.save()
    assert before["result"]["content"] == [{"type": "text", "text": "still me"}]
    assert after["error"] == {
        "code": -32600,
        "message": "This person is disabled in this gateway: ask its administrators",
    }


async def _console_sign_in(gateway_url: str, login: str) -> str:
    """An operator signs in to the console through the IdP's pages in Chromium: the page they end on."""
    needs(servers.CHROMIUM.exists(), "Chromium is not installed (apt-get install chromium)")
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=str(servers.CHROMIUM), args=servers.CHROMIUM_ARGS)
        try:
            page = await browser.new_page()
            page.set_default_timeout(10_000)
            await page.goto(f"{gateway_url}/admin/login/?next=/admin/")
            await page.click("#sign-in-with-idp")
            await page.fill("input[name=login]", login)
            await page.fill("input[name=password]", "any")
            await page.click("button[type=submit]")
            await page.click("button[type=submit]")  # the IdP's consent
            await page.wait_for_url(f"{gateway_url}/admin/**")
            return page.url + "\n" + await page.content()
        finally:
            await browser.close()


@pytest.mark.parametrize(
    ("login", "superuser", "groups"),
    [("admin-olga", True, set()), ("auditor-ravi", False, {"Auditor", "Reader"}), ("reader-sam", False, {"Reader"})],
)
def test_operators_sign_in_to_the_console_with_the_idp_and_their_groups_set_their_role(
    idp_gateway, login, superuser, groups
):
    idp, gateway = idp_gateway
    ended = anyio.run(_console_sign_in, gateway.url, login)
    assert "Gateway health" in ended  # the console's front page, signed in
    user = get_user_model().objects.get(username=f"{login}@127.0.0.1")
    try:
        assert (user.is_staff, user.is_superuser, user.has_usable_password()) == (True, superuser, False)
        assert {group.name for group in user.groups.all()} == groups
        assert (user.first_name, user.last_name, user.email) == ("Person", login, f"{login}@example.test")
    finally:
        user.delete()


def test_someone_in_none_of_the_consoles_groups_is_not_let_in(idp_gateway):
    idp, gateway = idp_gateway
    ended = anyio.run(_console_sign_in, gateway.url, "engineer-eve")
    assert "/admin/login/?sso=refused" in ended.splitlines()[0]
    assert "you are in none of the console" in ended
    assert not get_user_model().objects.filter(username="engineer-eve@127.0.0.1").exists()


def test_code_a_person_runs_calls_tools_as_them(idp_gateway, people):
    idp, gateway = idp_gateway
    mark = audit_mark()
    code = 'return await tools.demo.echo({ text: "from code" });'
    result = anyio.run(call, gateway.url, idp.forge(sub="coder"), "switchboard__execute", {"code": code}, "legacy")
    assert not result.is_error, result.content[0].text
    assert result.content[0].text == "from code"
    rows = [row for row in audit_since(mark) if row.kind in ("approved", "completed")]
    assert {row.exposed_name for row in rows} == {"switchboard__execute", "demo__echo"}
    assert {(row.agent_name, row.person_subject) for row in rows} == {(people, "coder")}


def test_rules_may_name_a_person_or_an_agent_group_their_idp_groups_count_them_in(idp_gateway):
    idp, gateway = idp_gateway
    demo = Upstream.objects.get(slug="demo")
    bob = Person.objects.create(issuer=idp.issuer, subject="bob", name="Bob")
    readers = AgentGroup.objects.create(name="idp-readers", idp_groups="switchboard-readers")
    rules = [
        Rule.objects.create(effect="deny", person=bob, upstream=demo, tool_pattern="echo"),
        Rule.objects.create(effect="deny", agent_group=readers, upstream=demo, tool_pattern="add"),
    ]
    tokens = {
        "bob": idp.forge(sub="bob"),
        "carol": idp.forge(sub="carol"),
        "dave": idp.forge(sub="dave", groups=["switchboard-readers"]),
    }

    async def listed(person: str) -> set[str]:
        return await tool_names(gateway.url, tokens[person])

    try:
        bob_sees = eventually(lambda: (names := anyio.run(listed, "bob")) and "demo__echo" not in names and names)
        dave_sees = eventually(lambda: (names := anyio.run(listed, "dave")) and "demo__add" not in names and names)
        carol_sees = anyio.run(listed, "carol")
        refused = anyio.run(call, gateway.url, tokens["bob"], "demo__echo", {"text": "x"}, "2026-07-28")
    finally:
        for made in (*rules, readers, bob):
            made.delete()
    assert "demo__add" in bob_sees and "demo__echo" in dave_sees
    assert {"demo__echo", "demo__add"} <= carol_sees
    assert refused.error.data["code"] == "POLICY_DENIED"


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


def test_a_person_hands_off_to_a_specialist_and_every_handoff_row_names_them(idp_gateway, specialists, people):
    idp, gateway = idp_gateway
    token = idp.forge(sub="hanna")
    triage, back = "switchboard__handoff_to_finance", "switchboard__return_to_triage"
    eventually(lambda: triage in anyio.run(tool_names, gateway.url, token), timeout=10)
    mark = audit_mark()

    async def scenario() -> tuple[str, set[str], str]:
        async with sdk_client(gateway.url, token, "legacy") as client:
            handed = await client.call_tool(triage, {"reason": "a budget question"})
            during = {tool.name for tool in (await client.list_tools()).tools}
            returned = await client.call_tool(back, {"note": "done"})
            return handed.content[0].text, during, returned.content[0].text

    handed, during, _returned = anyio.run(scenario)
    assert handed.startswith("Handed off to the finance specialist.")
    assert "finance__ask" in during
    moves = [row for row in audit_since(mark) if row.kind == "handoff"]
    assert {row.detail["event"] for row in moves} >= {"activated", "returned"}
    assert {(row.agent_name, row.person_subject) for row in moves} == {(people, "hanna")}


def test_a_persons_call_through_the_celery_executor_is_audited_as_them(
    idp_gateway, people, server_env, celery_worker, logs
):
    """The worker runs the upstream call; who asked stays on the web side, in both rows."""
    idp, _inline = idp_gateway
    public = public_key_of(server_env["GATEWAY_CREDENTIAL_KEYS"].split(",")[0])
    env = server_env | {
        "GATEWAY_EXECUTOR": "celery",
        "GATEWAY_CREDENTIAL_KEYS": "",
        "GATEWAY_CREDENTIAL_PUBLIC_KEY": public,
    }
    env |= {"GATEWAY_OIDC_ISSUER": idp.issuer, "GATEWAY_OIDC_AGENT": people}
    gateway = servers.start_gateway(env, logs / "gateway-oidc-celery.log")
    try:
        token = idp.forge(sub="celia", aud=f"{gateway.url}/mcp")
        mark = audit_mark()
        result = anyio.run(call, gateway.url, token, "demo__echo", {"text": "via a worker"}, "2026-07-28")
    finally:
        gateway.stop()
    assert result.content[0].text == "via a worker"
    rows = [row for row in audit_since(mark) if row.tool == "echo"]
    assert [(row.kind, row.person_subject, row.agent_name) for row in rows] == [
        ("approved", "celia", people),
        ("completed", "celia", people),
    ]
