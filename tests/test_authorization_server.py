"""The built-in authorization server (django-oauth-toolkit): an OAuth-only MCP client (the official SDK's
OAuth support) finds it from the gateway's 401, registers itself, and a person signs in and consents in real
Chromium; every call is then audited as that person. The server's refusals are driven over plain HTTP."""

import base64
import hashlib
import json
import os
import re
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, timedelta
from urllib.parse import parse_qs, urlencode, urlsplit

import anyio
import httpx2
import jwt
import pytest
import redis
from django.contrib.auth import get_user_model
from django.utils import timezone
from mcp import Client
from mcp.client.auth import OAuthClientProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import AuthorizationCodeResult, OAuthClientMetadata
from playwright.async_api import async_playwright

from policy.models import Agent, AgentKey
from policy.services import agent_key_issue
from registry.models import VirtualServer
from tests import servers
from tests.clients import INITIALIZE, TokenMemory, call, tool_names, ws_session
from tests.conftest import needs
from tests.factories import agent
from tests.helpers import audit_mark, audit_since, eventually

pytestmark = pytest.mark.e2e
CALLBACK = "http://127.0.0.1:9/callback"  # never served: the browser's way there is intercepted
PASSWORD = "ada-password-for-tests-only"


@pytest.fixture(scope="module")
def ada(db) -> Iterator:
    """A console account that is not staff: signing in to the gateway is not administering it."""
    user = get_user_model().objects.create_user("ada", password=PASSWORD, first_name="Ada", last_name="Lovelace")
    yield user
    user.delete()


@pytest.fixture(scope="module")
def gateway(server_env, world, ada, logs) -> Iterator[servers.Running]:
    log = logs / "gateway-as.log"
    with agent("people"), servers.inline_gateway_with(server_env, log, GATEWAY_AUTH_LOOKUP_SECONDS="1") as running:
        yield running


class Person:
    """A person at a browser: signs in with their console account and allows the client that asked."""

    def __init__(self, browser, seen: dict) -> None:
        self.browser, self.seen = browser, seen
        self.redirected: dict[str, str] = {}

    async def sign_in_and_allow(self, url: str) -> None:
        context = await self.browser.new_context()
        page = await context.new_page()
        page.set_default_timeout(10_000)
        arrived = anyio.Event()

        async def intercept(route) -> None:
            query = parse_qs(urlsplit(route.request.url).query)
            self.redirected = {name: values[0] for name, values in query.items()}
            await route.fulfill(status=200, body="signed in")
            arrived.set()

        await page.route(f"{CALLBACK}**", intercept)
        await page.goto(url)
        await page.fill("#id_username", "ada")
        await page.fill("#id_password", PASSWORD)
        await page.click("#sign-in")
        await page.wait_for_selector("#allow")
        self.seen |= {
            "client": await page.inner_text("#client-name"),
            "redirect": await page.inner_text("#redirect-uri"),
            "person": await page.inner_text("#person"),
            "scopes": await page.inner_text("#scopes"),
        }
        await page.click("#allow")
        with anyio.fail_after(10):
            await arrived.wait()
        await context.close()

    async def callback(self) -> AuthorizationCodeResult:
        return AuthorizationCodeResult(
            code=self.redirected["code"], state=self.redirected.get("state"), iss=self.redirected.get("iss")
        )


async def _oauth_call(
    gateway_url: str, mode: str, seen: dict, text: str, path: str = "/mcp"
) -> tuple[str, TokenMemory]:
    needs(servers.CHROMIUM.exists(), "Chromium is not installed (apt-get install chromium)")
    storage = TokenMemory()
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=str(servers.CHROMIUM), args=servers.CHROMIUM_ARGS)
        person = Person(browser, seen)
        metadata = OAuthClientMetadata(
            client_name="Test Desktop", redirect_uris=[CALLBACK], token_endpoint_auth_method="none", scope="mcp"
        )
        auth = OAuthClientProvider(f"{gateway_url}{path}", metadata, storage, person.sign_in_and_allow, person.callback)
        try:
            async with httpx2.AsyncClient(auth=auth, timeout=30) as http:
                transport = streamable_http_client(f"{gateway_url}{path}", http_client=http)
                async with Client(transport, mode=mode) as client:
                    result = await client.call_tool("demo__echo", {"text": text})
        finally:
            await browser.close()
    return result.content[0].text, storage


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
def test_an_oauth_only_client_signs_its_person_in_here_and_calls_as_them(gateway, ada, mode):
    mark = audit_mark()
    seen: dict = {}
    text, storage = anyio.run(_oauth_call, gateway.url, mode, seen, f"as ada, {mode}")
    assert text == f"as ada, {mode}"
    client_id = storage.client.client_id
    assert seen == {
        "client": "Test Desktop",
        "redirect": CALLBACK,
        "person": "Ada Lovelace",
        "scopes": "Use this gateway's tools as you",
    }
    rows = [row for row in audit_since(mark) if row.tool == "echo"]
    assert [row.kind for row in rows] == ["approved", "completed"]
    for row in rows:
        assert (row.agent_name, row.person_issuer, row.person_subject) == ("people", gateway.url, str(ada.pk))
        assert (row.person_name, row.client_id) == ("Ada Lovelace", client_id)


def test_the_metadata_points_a_client_here_and_offers_only_code_with_s256(gateway):
    resource = httpx2.get(f"{gateway.url}/.well-known/oauth-protected-resource/mcp", timeout=5).json()
    assert resource["authorization_servers"] == [gateway.url]
    assert resource["resource"] == f"{gateway.url}/mcp"
    server = httpx2.get(f"{gateway.url}/.well-known/oauth-authorization-server", timeout=5).json()
    assert server["issuer"] == gateway.url
    assert server["code_challenge_methods_supported"] == ["S256"]
    assert server["response_types_supported"] == ["code"]
    assert server["grant_types_supported"] == ["authorization_code", "refresh_token"]
    assert server["registration_endpoint"] == f"{gateway.url}/oauth/register/"
    assert server["authorization_response_iss_parameter_supported"] is True
    assert server["client_id_metadata_document_supported"] is True


def test_a_person_signs_in_for_a_virtual_server_whose_token_is_for_it_alone(gateway, ada):
    """A virtual server is a resource of its own: its metadata names it, the token a client gets for it has it as
    audience, and that token is refused at /mcp (and /mcp's at it)."""
    desk = VirtualServer.objects.create(name="desk", title="Front desk", tools=["demo__echo"])
    try:
        metadata = eventually(lambda: _metadata(gateway, "/mcp/s/desk"))
        unknown = httpx2.get(f"{gateway.url}/.well-known/oauth-protected-resource/mcp/s/nowhere", timeout=5)
        text, storage = anyio.run(_oauth_call, gateway.url, "legacy", {}, "at the desk", "/mcp/s/desk")
        token = {
            "Authorization": f"Bearer {storage.tokens.access_token}",
            "Accept": "application/json, text/event-stream",
        }
        at_mcp = httpx2.post(f"{gateway.url}/mcp", json=INITIALIZE, headers=token, timeout=5)
    finally:
        desk.delete()
    assert (metadata["resource"], metadata["resource_name"]) == (f"{gateway.url}/mcp/s/desk", "Front desk")
    assert (unknown.status_code, unknown.json()["error_description"]) == (404, "No such virtual server")
    assert text == "at the desk"
    assert at_mcp.status_code == 401
    assert (
        at_mcp.json()["error"]["message"]
        == "The token is unknown, expired or revoked, or not for this gateway: sign in again"
    )


def _metadata(gateway, path: str) -> dict | None:
    answer = httpx2.get(f"{gateway.url}/.well-known/oauth-protected-resource{path}", timeout=5)
    return answer.json() if answer.status_code == 200 else None


# The same steps over plain HTTP, for the refusals a browser would never show.


def _register(gateway, redirect: str = CALLBACK, address: str = "") -> httpx2.Response:
    body = {"client_name": "Raw", "redirect_uris": [redirect], "token_endpoint_auth_method": "none"}
    body |= {"grant_types": ["authorization_code", "refresh_token"], "response_types": ["code"]}
    return httpx2.post(f"{gateway.url}/oauth/register/", json=body, timeout=10)


def _pkce() -> tuple[str, str]:
    verifier = secrets.token_urlsafe(48)
    return verifier, base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()


@contextmanager
def _signed_in(gateway) -> Iterator[httpx2.Client]:
    with httpx2.Client(base_url=gateway.url, timeout=10) as http:
        page = http.get("/accounts/login/")
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)
        form = {"csrfmiddlewaretoken": token, "username": "ada", "password": PASSWORD, "next": "/"}
        assert http.post("/accounts/login/", data=form, headers={"referer": f"{gateway.url}/"}).status_code == 302
        yield http


def _authorize(http: httpx2.Client, gateway, client_id: str, **query: str) -> httpx2.Response:
    """The consent page for `query`, allowed: the redirect the server answers with."""
    base = {"client_id": client_id, "response_type": "code", "redirect_uri": CALLBACK, "scope": "mcp", "state": "s1"}
    page = http.get(f"/oauth/authorize/?{urlencode(base | query)}")
    if page.status_code != 200 or 'id="allow"' not in page.text:
        return page
    form = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', page.text))
    form |= {"allow": "Authorize"}
    return http.post("/oauth/authorize/", data=form, headers={"referer": str(page.url)})


def _code(reply: httpx2.Response) -> str:
    assert reply.status_code == 302, reply.text[:500]
    return parse_qs(urlsplit(reply.headers["location"]).query)["code"][0]


def _token(gateway, **form: str) -> httpx2.Response:
    return httpx2.post(f"{gateway.url}/oauth/token/", data=form, timeout=10)


def test_pkce_is_required_and_only_s256(gateway):
    client_id = _register(gateway).json()["client_id"]
    with _signed_in(gateway) as http:
        verifier, challenge = _pkce()
        missing = _authorize(http, gateway, client_id)
        plain = _authorize(http, gateway, client_id, code_challenge=verifier, code_challenge_method="plain")
    for refused in (missing, plain):
        location = refused.headers.get("location", "")
        assert refused.status_code == 302 and location.startswith(CALLBACK), refused.text[:300]
        assert parse_qs(urlsplit(location).query)["error"] == ["invalid_request"]


def test_a_code_works_once_and_a_rotated_refresh_token_works_once(gateway):
    client_id = _register(gateway).json()["client_id"]
    verifier, challenge = _pkce()
    with _signed_in(gateway) as http:
        code = _code(_authorize(http, gateway, client_id, code_challenge=challenge, code_challenge_method="S256"))
    exchange = {"grant_type": "authorization_code", "code": code, "redirect_uri": CALLBACK, "client_id": client_id}
    exchange |= {"code_verifier": verifier}
    first = _token(gateway, **exchange)
    assert first.status_code == 200, first.text
    assert first.json()["expires_in"] == 600
    replayed = _token(gateway, **exchange)
    assert (replayed.status_code, replayed.json()["error"]) == (400, "invalid_grant")
    refresh = {"grant_type": "refresh_token", "refresh_token": first.json()["refresh_token"], "client_id": client_id}
    rotated = _token(gateway, **refresh)
    assert rotated.status_code == 200 and rotated.json()["refresh_token"] != first.json()["refresh_token"]
    reused = _token(gateway, **refresh)
    assert (reused.status_code, reused.json()["error"]) == (400, "invalid_grant")


def test_openid_connect_an_id_token_names_the_person_and_verifies_with_the_published_keys(gateway, ada):
    discovery = httpx2.get(f"{gateway.url}/.well-known/openid-configuration", timeout=5).json()
    assert discovery["issuer"] == gateway.url  # the same issuer as the RFC 8414 document's
    client_id = _register(gateway).json()["client_id"]
    verifier, challenge = _pkce()
    with _signed_in(gateway) as http:
        pkce = {"code_challenge": challenge, "code_challenge_method": "S256", "scope": "openid mcp", "nonce": "n1"}
        code = _code(_authorize(http, gateway, client_id, **pkce))
    exchange = {"grant_type": "authorization_code", "code": code, "redirect_uri": CALLBACK, "client_id": client_id}
    tokens = _token(gateway, **exchange, code_verifier=verifier).json()
    key = jwt.PyJWKClient(discovery["jwks_uri"]).get_signing_key_from_jwt(tokens["id_token"])
    claims = jwt.decode(tokens["id_token"], key, algorithms=["RS256"], audience=client_id, issuer=gateway.url)
    assert (claims["sub"], claims["nonce"]) == (str(ada.pk), "n1")
    assert (
        anyio.run(call, gateway.url, tokens["access_token"], "demo__echo", {"text": "oidc"}).content[0].text == "oidc"
    )


def test_a_redirect_uri_must_match_exactly_and_be_http(gateway):
    client_id = _register(gateway).json()["client_id"]
    _verifier, challenge = _pkce()
    with _signed_in(gateway) as http:
        other = _authorize(
            http,
            gateway,
            client_id,
            redirect_uri=f"{CALLBACK}/more",
            code_challenge=challenge,
            code_challenge_method="S256",
        )
    assert other.status_code == 400 and "Mismatching redirect URI" in other.text  # never sent there
    for scheme in ("javascript:alert(1)", "data:text/html,hi"):
        refused = _register(gateway, redirect=scheme)
        assert refused.status_code == 400, scheme
        assert refused.json()["error"] == "invalid_client_metadata"


def test_a_client_registered_later_meets_its_own_consent_page_which_no_site_may_frame(gateway):
    """The confused deputy: a consent once given to one client is never another client's. A client registered
    afterwards (with the attacker's redirect) gets the page again, naming it and where it sends the person."""
    verifier, challenge = _pkce()
    pkce = {"code_challenge": challenge, "code_challenge_method": "S256", "approval_prompt": "auto"}
    allowed = _register(gateway).json()["client_id"]
    elsewhere = "http://127.0.0.1:9/attacker"
    later = _register(gateway, redirect=elsewhere).json()["client_id"]
    with _signed_in(gateway) as http:
        code = _code(_authorize(http, gateway, allowed, **pkce))
        exchange = {"grant_type": "authorization_code", "code": code, "redirect_uri": CALLBACK, "client_id": allowed}
        assert _token(gateway, **exchange, code_verifier=verifier).status_code == 200
        query = {"response_type": "code", "scope": "mcp", "state": "s2"} | pkce
        again = http.get(f"/oauth/authorize/?{urlencode(query | {'client_id': allowed, 'redirect_uri': CALLBACK})}")
        page = http.get(f"/oauth/authorize/?{urlencode(query | {'client_id': later, 'redirect_uri': elsewhere})}")
    assert again.status_code == 302 and _code(again)  # the client allowed before is not asked again...
    assert page.status_code == 200 and 'id="allow"' in page.text  # ...but the new one is, not sent a code
    assert "Raw" in page.text and elsewhere in page.text
    assert page.headers["content-security-policy"] == "frame-ancestors 'none'"
    assert page.headers["x-frame-options"] == "DENY"


def test_a_client_metadata_document_at_a_private_address_is_never_fetched(gateway):
    _verifier, challenge = _pkce()
    pkce = {"code_challenge": challenge, "code_challenge_method": "S256"}
    with _signed_in(gateway) as http:
        private = _authorize(http, gateway, "https://127.0.0.1:9/client.json", **pkce)
        plain_http = _authorize(http, gateway, "http://example.test/client.json", **pkce)
    for refused in (private, plain_http):  # the second is no metadata URL (https only), and no client either
        assert refused.status_code == 400
        assert "invalid_request: Invalid client_id parameter value." in refused.text
    # Refused before any connection: the address is checked once resolved (django-oauth-toolkit's fetcher).
    reason = "CIMDError('client_id host resolves to a non-public address (127.0.0.1)')"
    assert eventually(lambda: reason in gateway.log.read_text())


def test_a_token_of_this_server_works_on_the_websocket_and_a_revoked_one_is_refused(gateway, ada):
    client_id = _register(gateway).json()["client_id"]
    verifier, challenge = _pkce()
    with _signed_in(gateway) as http:
        code = _code(_authorize(http, gateway, client_id, code_challenge=challenge, code_challenge_method="S256"))
    exchange = {"grant_type": "authorization_code", "code": code, "redirect_uri": CALLBACK, "client_id": client_id}
    token = _token(gateway, **exchange, code_verifier=verifier).json()["access_token"]
    mark = audit_mark()

    async def scenario() -> dict:
        async with ws_session(gateway.url, token) as session:
            return await session.request("tools/call", {"name": "demo__echo", "arguments": {"text": "ws"}})

    assert anyio.run(scenario)["result"]["content"] == [{"type": "text", "text": "ws"}]
    assert {row.person_subject for row in audit_since(mark) if row.tool == "echo"} == {str(ada.pk)}
    revoked = httpx2.post(
        f"{gateway.url}/oauth/revoke_token/", data={"token": token, "client_id": client_id}, timeout=10
    )
    assert revoked.status_code == 200
    headers = {"authorization": f"Bearer {token}", "accept": "application/json, text/event-stream"}
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}

    def refused() -> httpx2.Response | None:  # within GATEWAY_AUTH_LOOKUP_SECONDS, 1 s here
        reply = httpx2.post(f"{gateway.url}/mcp", json=initialize, headers=headers, timeout=10)
        return reply if reply.status_code == 401 else None

    reply = eventually(refused, timeout=10)
    message = "The token is unknown, expired or revoked, or not for this gateway: sign in again"
    assert reply.json()["error"]["message"] == message


def _allowed_client(gateway) -> tuple[str, dict]:
    """A client registered and allowed by ada: its id and its tokens."""
    client_id = _register(gateway).json()["client_id"]
    verifier, challenge = _pkce()
    with _signed_in(gateway) as http:
        code = _code(_authorize(http, gateway, client_id, code_challenge=challenge, code_challenge_method="S256"))
    exchange = {"grant_type": "authorization_code", "code": code, "redirect_uri": CALLBACK, "client_id": client_id}
    return client_id, _token(gateway, **exchange, code_verifier=verifier).json()


def _account_post(http: httpx2.Client, **form: str) -> httpx2.Response:
    page = http.get("/account/")
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)
    return http.post("/account/", data={"csrfmiddlewaretoken": token} | form, headers={"referer": str(page.url)})


def test_a_person_sees_the_clients_they_allowed_and_revokes_one_whose_token_then_fails(gateway, ada):
    client_id, tokens = _allowed_client(gateway)
    other_id, other_tokens = _allowed_client(gateway)
    assert _initialize(gateway, tokens["access_token"]).status_code == 200
    mark = audit_mark()
    with _signed_in(gateway) as http:
        listed = http.get("/account/").text
        revoked = _account_post(http, revoke_client=client_id)
        after = http.get("/account/").text
        stranger = _account_post(http, revoke_client="not-a-client-of-ada")
    row = re.search(rf'<tr id="client-{client_id}">(.*?)</tr>', listed, re.S)
    assert row and "Raw" in row.group(1) and 'name="revoke_client"' in row.group(1)
    assert revoked.status_code == 302 and stranger.status_code == 302
    assert f'id="client-{client_id}"' not in after and f'id="client-{other_id}"' in after, "only the one revoked"
    [audited] = [r for r in audit_since(mark) if r.kind == "admin_change"]
    assert (audited.actor, audited.detail) == (
        "ada",
        {"action": "oauth_client_revoked", "client_id": client_id, "client": "Raw", "tokens": 2},
    )
    refused = eventually(lambda: (reply := _initialize(gateway, tokens["access_token"])).status_code == 401 and reply)
    message = "The token is unknown, expired or revoked, or not for this gateway: sign in again"
    assert refused.json()["error"]["message"] == message
    refresh = {"grant_type": "refresh_token", "refresh_token": tokens["refresh_token"], "client_id": client_id}
    reused = _token(gateway, **refresh)
    assert (reused.status_code, reused.json()["error"]) == (400, "invalid_grant")
    assert _initialize(gateway, other_tokens["access_token"]).status_code == 200, "the other client still works"
    assert tokens["access_token"] not in json.dumps([r.detail for r in audit_since(mark)])


def test_registration_is_open_but_a_flood_is_refused_by_every_web_process_alike(server_env, world, logs):
    redis.Redis.from_url(os.environ["REDIS_URL"]).delete("sb:registrations:127.0.0.1")  # earlier tests' count
    settings = {"GATEWAY_AUTH_REGISTRATIONS_PER_HOUR": "3"}
    with (
        servers.inline_gateway_with(server_env, logs / "gateway-as-flood-1.log", **settings) as one,
        servers.inline_gateway_with(server_env, logs / "gateway-as-flood-2.log", **settings) as two,
    ):
        statuses = [_register(gateway).status_code for gateway in (one, two, one)]
        flood = _register(two)  # the fourth from this address within the hour, wherever it lands
    assert statuses == [201, 201, 201]
    assert flood.status_code == 429
    assert flood.json()["error"] == "too_many_requests"
    assert int(flood.headers["retry-after"]) > 3000


# Personal API keys, made on My account.


def _make_key(http: httpx2.Client, **form: str) -> str:
    page = http.get("/account/")
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)
    made = http.post("/account/", data={"csrfmiddlewaretoken": token} | form, headers={"referer": str(page.url)})
    return re.search(r'<code id="new-key">([^<]+)</code>', made.text).group(1)


def _revoke(http: httpx2.Client, prefix: str) -> None:
    page = http.get("/account/")
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)
    http.post("/account/", data={"csrfmiddlewaretoken": token, "revoke": prefix}, headers={"referer": str(page.url)})


def test_a_person_makes_a_personal_key_limited_to_some_tools_and_revokes_it(gateway, ada):
    with _signed_in(gateway) as http:
        key = _make_key(http, label="laptop", days="7", tools="demo__echo demo__pid")
        prefix = key.split("_")[1]
        eventually(lambda: _initialize(gateway, key).status_code == 200)  # once the gateway knows the new key
        mark = audit_mark()
        echoed = anyio.run(call, gateway.url, key, "demo__echo", {"text": "with my key"})
        refused = anyio.run(call, gateway.url, key, "demo__add", {"a": 1, "b": 2})
        listed = anyio.run(tool_names, gateway.url, key)
        stored = eventually(lambda: (k := AgentKey.objects.get(prefix=prefix)).last_used_at and k)
        _revoke(http, prefix)
        row = eventually(lambda: "revoked" in (reply := _initialize(gateway, key)).text and reply)
    assert echoed.content[0].text == "with my key"
    assert refused.error.data["code"] == "KEY_SCOPE"
    assert refused.error.message == "This API key may call only demo__echo demo__pid: 'demo__add' is not among them."
    assert listed == {"demo__echo", "demo__pid"}
    assert (stored.owner_id, stored.label, stored.last_used_from, stored.tools) == (
        ada.pk,
        "laptop",
        "127.0.0.1",
        "demo__echo demo__pid",
    )
    assert timedelta(days=7) - timedelta(minutes=1) < stored.expires_at - stored.created_at <= timedelta(days=7)
    calls = [r for r in audit_since(mark) if r.tool == "echo"]
    assert {(r.agent_name, r.person_subject, r.person_name) for r in calls} == {("people", str(ada.pk), "Ada Lovelace")}
    message = "This API key was revoked (or its owner's account closed): ask for a new one"
    assert row.json()["error"]["message"] == message
    assert "KEY_REVOKED" in {r.error_code for r in audit_since(mark)}


def _initialize(gateway, key: str) -> httpx2.Response:
    headers = {"authorization": f"Bearer {key}", "accept": "application/json, text/event-stream"}
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}
    return httpx2.post(f"{gateway.url}/mcp", json=initialize, headers=headers, timeout=10)


def test_an_expired_key_is_refused_with_when_it_expired(gateway):
    people = Agent.objects.get(name="people")
    expired = timezone.now() - timedelta(minutes=5)
    key = agent_key_issue(agent=people, label="old", actor="tests", expires_at=expired).key
    mark = audit_mark()
    reply = eventually(lambda: "expired" in (r := _initialize(gateway, key)).text and r)  # once the gateway knows it
    message = f"This API key expired at {expired.astimezone(UTC).isoformat(timespec='minutes')}: make a new one"
    assert reply.json()["error"] == {"code": -32600, "message": message}
    assert 'error="invalid_token"' in reply.headers["www-authenticate"]
    assert [r.error_code for r in audit_since(mark)] == ["KEY_EXPIRED"]
