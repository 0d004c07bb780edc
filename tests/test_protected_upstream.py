"""The test support for per-person upstream credentials, proven with real parts: the protected upstream
(tests/support/protected_upstream.py) is an OAuth resource server whose 401 leads to its authorization server, the
tests' IdP (tests/support/oidc_provider.mjs); the IdP issues tokens for the upstream by the authorization code flow
(with a refresh token) and by RFC 8693 token exchange of a person's token for the gateway; the upstream serves
those and static personal tokens, and refuses the rest, a token for the gateway first of all."""

import base64
import hashlib
import json
import os
import re
import secrets
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urljoin, urlsplit

import anyio
import httpx2
import jwt
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.auth import OAuthClientProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import AuthorizationCodeResult, OAuthClientMetadata

from tests import servers
from tests.clients import INITIALIZE, TIMEOUT, TokenMemory
from tests.helpers import eventually
from tests.idp import ACCEPT, CLIENTS, REDIRECT, Idp, private_jwk

pytestmark = pytest.mark.e2e

EXCHANGE = "urn:ietf:params:oauth:grant-type:token-exchange"
ACCESS_TOKEN = "urn:ietf:params:oauth:token-type:access_token"
TTL = 120  # OIDC_UPSTREAM_TTL: not the provider's 300, to see that it is taken
# The gateway as the upstream's OAuth client: confidential, signs people in, refreshes and exchanges.
GATEWAY = ("switchboard", "switchboard-secret")
GATEWAY_CLIENT = {"client_id": GATEWAY[0], "client_secret": GATEWAY[1], "redirect_uris": [REDIRECT]}
GATEWAY_CLIENT |= {"grant_types": ["authorization_code", "refresh_token", EXCHANGE], "response_types": ["code"]}
STATIC = {"carol": "tok-carol-5e1d9a", "dan": "tok-dan-7c2b44"}
SCRIPT = servers.ROOT / "tests/support/protected_upstream.py"


@dataclass
class Protected:
    idp: Idp  # its resource is the gateway's (no gateway runs: its tokens only name it)
    url: str  # the upstream's /mcp, its resource
    seen: Path
    log: Path
    pid: int  # the upstream's process
    idp_log: Path


@pytest.fixture(scope="module")
def protected(logs) -> Iterator[Protected]:
    """The IdP, knowing the upstream's resource, and the upstream on a port chosen for it beforehand."""
    gateway_resource = f"http://127.0.0.1:{servers.free_port()}/mcp"
    port = servers.free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    key, jwk = private_jwk("idp-1")
    idp_log = logs / "oidc-provider-upstream.log"
    with pytest.MonkeyPatch.context() as patch:  # start_oidc_provider passes its own environment on
        patch.setenv("OIDC_UPSTREAM_RESOURCE", url)
        patch.setenv("OIDC_UPSTREAM_TTL", str(TTL))
        provider = servers.start_oidc_provider(gateway_resource, {"keys": [jwk]}, [*CLIENTS, GATEWAY_CLIENT], idp_log)
    seen, log = logs / "protected-seen.log", logs / "protected-upstream.log"
    try:
        upstream = servers.start_protected_upstream(provider.url, log, tokens=STATIC, seen=seen, port=port)
        try:
            idp = Idp(provider.url, gateway_resource, key)
            yield Protected(idp, upstream.url, seen, log, upstream.process.pid, idp_log)
        finally:
            upstream.stop()
    finally:
        provider.stop()


async def _whoami(url: str, token: str, mode: str = "legacy") -> dict:
    """`whoami` through the official SDK client, with the token on every request."""
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=TIMEOUT) as http:
        async with Client(streamable_http_client(url, http_client=http), mode=mode) as client:
            result = await client.call_tool("whoami", {})
    assert not result.is_error, result
    return json.loads(result.content[0].text)


def _post_initialize(url: str, token: str | None) -> httpx2.Response:
    headers = ACCEPT | ({"Authorization": f"Bearer {token}"} if token else {})
    return httpx2.post(url, json=INITIALIZE, headers=headers, timeout=TIMEOUT)


def _exchange(protected: Protected, subject_token: str, auth=GATEWAY, **fields) -> httpx2.Response:
    """An RFC 8693 request as the gateway makes it (tests may change or, with None, drop any field)."""
    body = {"grant_type": EXCHANGE, "subject_token": subject_token, "subject_token_type": ACCESS_TOKEN}
    body |= {"audience": protected.url, "resource": protected.url, "requested_token_type": ACCESS_TOKEN}
    body = {name: value for name, value in (body | fields).items() if value is not None}
    return httpx2.post(f"{protected.idp.issuer}/token", data=body, auth=auth, timeout=TIMEOUT)


def _forge(protected: Protected, key=None, typ: str = "at+jwt", **claims) -> str:
    """An access token for the upstream as the IdP would sign it, with any claim changed."""
    now = int(time.time())
    body = {"iss": protected.idp.issuer, "aud": protected.url, "sub": "forged", "iat": now, "exp": now + 300}
    body |= {"scope": "upstream", "client_id": GATEWAY[0]} | claims
    return jwt.encode(body, key or protected.idp.key, algorithm="RS256", headers={"kid": "idp-1", "typ": typ})


def _authorize(url: str, login: str, refuse_at: str = "") -> dict[str, str]:
    """The IdP's devInteractions pages from the authorization request `url` on, driven as a browser would: the query
    the client's redirect_uri is given. With `refuse_at` ("login" or "consent") the person follows that page's
    [ Cancel ] link instead."""
    with httpx2.Client(timeout=TIMEOUT) as http:
        page = http.get(url)
        for _step in range(10):
            if page.status_code in (302, 303):
                location = urljoin(str(page.url), page.headers["location"])
                if location.startswith(REDIRECT):
                    return {name: values[0] for name, values in parse_qs(urlsplit(location).query).items()}
                page = http.get(location)
                continue
            prompt = "login" if 'name="login"' in page.text else "consent"
            if prompt == refuse_at:
                page = http.get(urljoin(str(page.url), re.search(r'href="([^"]+/abort)"', page.text).group(1)))
                continue
            form = dict(re.findall(r'name="([^"]+)"(?: [^>]*)? value="([^"]*)"', page.text))
            if prompt == "login":
                form |= {"login": login, "password": "any"}
            page = http.post(urljoin(str(page.url), re.search(r'action="([^"]+)"', page.text).group(1)), data=form)
    raise AssertionError(f"the IdP's pages did not lead back to the client: {page.status_code} {page.text[:300]}")


def _upstream_request(protected: Protected, verifier: str) -> str:
    """The gateway's authorization request for the upstream, with a refresh token (offline_access needs
    prompt=consent)."""
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    query = {"client_id": GATEWAY[0], "response_type": "code", "redirect_uri": REDIRECT, "state": "st-1"}
    query |= {"scope": "openid offline_access upstream", "resource": protected.url, "prompt": "consent"}
    query |= {"code_challenge": challenge, "code_challenge_method": "S256"}
    return f"{protected.idp.issuer}/auth?{urlencode(query)}"


def _log_since(path: Path, mark: int) -> str:
    return path.read_bytes()[mark:].decode()


def test_without_a_token_the_upstream_leads_to_its_authorization_server(protected):
    reply = _post_initialize(protected.url, None)
    assert reply.status_code == 401
    metadata_url = re.search(r'resource_metadata="([^"]+)"', reply.headers["www-authenticate"]).group(1)
    origin = protected.url.removesuffix("/mcp")
    assert metadata_url == f"{origin}/.well-known/oauth-protected-resource/mcp"
    for url in (metadata_url, f"{origin}/.well-known/oauth-protected-resource"):
        assert httpx2.get(url, timeout=TIMEOUT).json() == {
            "resource": protected.url,
            "authorization_servers": [protected.idp.issuer],
            "scopes_supported": ["upstream"],
            "bearer_methods_supported": ["header"],
        }
    server = httpx2.get(f"{protected.idp.issuer}/.well-known/oauth-authorization-server", timeout=TIMEOUT).json()
    assert server["issuer"] == protected.idp.issuer
    assert {"authorization_code", "refresh_token", EXCHANGE} <= set(server["grant_types_supported"])
    assert "upstream" in server["scopes_supported"]


async def _oauth_whoami(url: str, login: str) -> tuple[dict, TokenMemory]:
    """The official SDK client with only OAuth: from the upstream's 401 it finds the metadata, then the IdP, registers
    there, and its person signs in on the IdP's pages (driven headlessly)."""
    redirected: dict[str, str] = {}

    async def sign_in(authorization_url: str) -> None:
        redirected.update(await anyio.to_thread.run_sync(_authorize, authorization_url, login))

    async def callback() -> AuthorizationCodeResult:
        return AuthorizationCodeResult(code=redirected["code"], state=redirected["state"], iss=redirected.get("iss"))

    storage = TokenMemory()
    metadata = OAuthClientMetadata(
        client_name="Upstream Desktop", redirect_uris=[REDIRECT], token_endpoint_auth_method="none", scope="upstream"
    )
    auth = OAuthClientProvider(url, metadata, storage, sign_in, callback)
    async with httpx2.AsyncClient(auth=auth, timeout=TIMEOUT) as http:
        async with Client(streamable_http_client(url, http_client=http), mode="legacy") as client:
            result = await client.call_tool("whoami", {})
    return json.loads(result.content[0].text), storage


def test_the_sdk_client_follows_the_401_to_the_idp_and_reaches_the_upstream_as_its_person(protected):
    answer, storage = anyio.run(_oauth_whoami, protected.url, "hana")
    assert (answer["person"], answer["audience"]) == ("hana", protected.url)
    claims = jwt.decode(storage.tokens.access_token, options={"verify_signature": False})
    assert (claims["aud"], claims["scope"], claims["client_id"]) == (
        protected.url,
        "upstream",
        storage.client.client_id,
    )


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
def test_a_token_exchanged_for_a_persons_gateway_token_reaches_the_upstream_as_them(protected, mode):
    subject = protected.idp.person_token(f"erin-{mode}")
    reply = _exchange(protected, subject, scope="upstream")
    assert reply.status_code == 200, reply.text
    issued = reply.json()
    token = issued.pop("access_token")
    assert issued == {"issued_token_type": ACCESS_TOKEN, "token_type": "Bearer", "expires_in": TTL, "scope": "upstream"}
    claims = jwt.decode(token, options={"verify_signature": False})
    assert (claims["sub"], claims["aud"], claims["iss"]) == (f"erin-{mode}", protected.url, protected.idp.issuer)
    assert claims["client_id"] == GATEWAY[0]

    answer = anyio.run(_whoami, protected.url, token, mode)
    assert answer.pop("process") and answer == {
        "person": f"erin-{mode}",
        "audience": protected.url,
        "pid": f"{protected.pid} {os.readlink('/proc/self/ns/pid')}",  # an HTTP server of the tests', unconfined
    }
    seen = protected.seen.read_text().splitlines()
    assert f"Bearer {token}" in seen and not any(subject in line for line in seen)


def test_a_static_personal_token_reaches_the_upstream_as_its_person(protected):
    answer = anyio.run(_whoami, protected.url, STATIC["carol"])
    assert (answer["person"], answer["audience"]) == ("carol", None)
    assert answer["pid"] == f"{protected.pid} {os.readlink('/proc/self/ns/pid')}"
    assert f"Bearer {STATIC['carol']}" in protected.seen.read_text().splitlines()


REFUSED = {
    "a person's token for the gateway": (
        lambda p: p.idp.person_token("mallory"),
        401,
        "InvalidAudienceError: Audience doesn't match",
    ),
    "signed with another key under the IdP's kid": (
        lambda p: _forge(p, key=private_jwk("idp-1")[0]),
        401,
        "InvalidSignatureError: Signature verification failed",
    ),
    "from another issuer": (
        lambda p: _forge(p, iss="https://idp.elsewhere.test"),
        401,
        "InvalidIssuerError: Invalid issuer",
    ),
    "expired": (
        lambda p: _forge(p, exp=int(time.time()) - 120, iat=int(time.time()) - 600),
        401,
        "ExpiredSignatureError: Signature has expired",
    ),
    "not typed as an access token": (
        lambda p: _forge(p, typ="JWT"),
        401,
        "InvalidTokenError: not a JWT access token (typ at+jwt)",
    ),
    "an unknown static token": (lambda p: "tok-nobody-0000", 401, ""),
    "without the upstream scope": (lambda p: _forge(p, scope="mcp"), 403, ""),
}


@pytest.mark.parametrize("case", REFUSED)
def test_the_upstream_refuses_every_other_token(protected, case):
    make, status, reason = REFUSED[case]
    token = make(protected)
    mark = protected.log.stat().st_size
    reply = _post_initialize(protected.url, token)
    assert reply.status_code == status
    challenge = reply.headers["www-authenticate"]
    error = "invalid_token" if status == 401 else "insufficient_scope"
    assert challenge.startswith(f'Bearer error="{error}"') and "resource_metadata=" in challenge
    if reason:
        assert f"refused a bearer token: {reason}" in _log_since(protected.log, mark)
    assert f"Bearer {token}" in protected.seen.read_text().splitlines()


INVALID_SUBJECT = {"error": "invalid_grant", "error_description": "grant request is invalid"}


def _subject(protected: Protected, **changes) -> dict[str, str]:
    """A subject token as the IdP signs one for the gateway, with any claim (or, given `key`, the key) changed."""
    claims = {"aud": protected.idp.resource, "scope": "mcp", "client_id": "desk"} | changes
    return {"subject_token": _forge(protected, **claims)}


NOT_A_SUBJECT = "invalid_grant: subject_token is not an access token this provider issued for the gateway"
EXCHANGE_REFUSED = {
    "a forged subject token": (
        lambda p: _subject(p, key=private_jwk("idp-1")[0]),
        f"{NOT_A_SUBJECT} (ERR_JWS_SIGNATURE_VERIFICATION_FAILED)",
    ),
    "a subject token of another issuer": (
        lambda p: _subject(p, iss="https://idp.elsewhere.test"),
        f"{NOT_A_SUBJECT} (ERR_JWT_CLAIM_VALIDATION_FAILED iss)",
    ),
    "an expired subject token": (
        lambda p: _subject(p, exp=int(time.time()) - 120, iat=int(time.time()) - 600),
        f"{NOT_A_SUBJECT} (ERR_JWT_EXPIRED exp)",
    ),
    "a subject token not typed as an access token": (
        lambda p: _subject(p, typ="JWT"),
        f"{NOT_A_SUBJECT} (ERR_JWT_CLAIM_VALIDATION_FAILED typ)",
    ),
    "an upstream token as the subject": (
        lambda p: {"subject_token": _forge(p)},
        f"{NOT_A_SUBJECT} (ERR_JWT_CLAIM_VALIDATION_FAILED aud)",
    ),
    "a subject token that is no JWT": (
        lambda p: {"subject_token": "opaque-value"},
        f"{NOT_A_SUBJECT} (ERR_JWS_INVALID)",
    ),
}


@pytest.mark.parametrize("case", EXCHANGE_REFUSED)
def test_the_exchange_refuses_a_subject_token_it_did_not_issue_for_the_gateway(protected, case):
    change, reason = EXCHANGE_REFUSED[case]
    mark = protected.idp_log.stat().st_size
    reply = _exchange(protected, **(_subject(protected, sub="victor") | change(protected)))
    assert (reply.status_code, reply.json()) == (400, INVALID_SUBJECT)
    # The answer is the same for each: the provider's log says which check refused it.
    assert eventually(lambda: f"grant.error {reason}\n" in _log_since(protected.idp_log, mark))


EXCHANGE_INVALID = {
    "an ID token's type": (
        lambda p: {"subject_token_type": "urn:ietf:params:oauth:token-type:id_token"},
        {"error": "invalid_request", "error_description": f"subject_token_type must be {ACCESS_TOKEN}"},
    ),
    "another audience": (
        lambda p: {"audience": p.idp.resource, "resource": None},
        {"error": "invalid_target", "error_description": "audience or resource must name the upstream resource"},
    ),
    "another scope": (
        lambda p: {"scope": "upstream mcp"},
        {"error": "invalid_scope", "error_description": "only the scope upstream is issued", "scope": "upstream mcp"},
    ),
    "a wrong client secret": (
        lambda p: {"auth": (GATEWAY[0], "not-the-secret")},
        {"error": "invalid_client", "error_description": "client authentication failed"},
    ),
    "a client not allowed to exchange": (
        lambda p: {"auth": ("robot", "robot-secret")},
        {"error": "invalid_request", "error_description": "requested grant type is not allowed for this client"},
    ),
}


@pytest.mark.parametrize("case", EXCHANGE_INVALID)
def test_the_exchange_refuses_a_request_it_must_not_serve(protected, case):
    change, error = EXCHANGE_INVALID[case]
    reply = _exchange(protected, **(_subject(protected, sub="victor") | change(protected)))
    assert reply.json() == error
    assert reply.status_code == (401 if error["error"] == "invalid_client" else 400)


def test_the_exchange_trades_the_unchanged_request(protected):
    """The refusals above change one thing each: the request they start from is served."""
    reply = _exchange(protected, **_subject(protected, sub="victor"))
    assert reply.status_code == 200, reply.text
    assert jwt.decode(reply.json()["access_token"], options={"verify_signature": False})["sub"] == "victor"


def test_a_person_signs_in_for_the_upstream_and_the_refresh_works(protected):
    verifier = secrets.token_urlsafe(48)
    redirected = _authorize(_upstream_request(protected, verifier), "fay")
    assert redirected["state"] == "st-1"
    grant = {"grant_type": "authorization_code", "code": redirected["code"], "redirect_uri": REDIRECT}
    grant |= {"code_verifier": verifier, "resource": protected.url}
    issued = httpx2.post(f"{protected.idp.issuer}/token", data=grant, auth=GATEWAY, timeout=TIMEOUT).json()
    assert (issued["scope"], issued["expires_in"], issued["token_type"]) == ("upstream", TTL, "Bearer")
    assert anyio.run(_whoami, protected.url, issued["access_token"])["person"] == "fay"

    refresh = {"grant_type": "refresh_token", "refresh_token": issued["refresh_token"]}
    renewed = httpx2.post(f"{protected.idp.issuer}/token", data=refresh, auth=GATEWAY, timeout=TIMEOUT).json()
    assert renewed["access_token"] != issued["access_token"] and renewed["expires_in"] == TTL
    claims = jwt.decode(renewed["access_token"], options={"verify_signature": False})
    assert (claims["sub"], claims["aud"], claims["scope"]) == ("fay", protected.url, "upstream")
    assert anyio.run(_whoami, protected.url, renewed["access_token"])["person"] == "fay"


@pytest.mark.parametrize("page", ["login", "consent"])
def test_a_person_who_refuses_at_the_idp_sends_the_client_access_denied(protected, page):
    redirected = _authorize(_upstream_request(protected, secrets.token_urlsafe(48)), "gil", refuse_at=page)
    assert redirected == {
        "error": "access_denied",
        "error_description": "End-User aborted interaction",
        "state": "st-1",
        "iss": protected.idp.issuer,
    }


async def _stdio_whoami(token: str, seen: Path) -> tuple[dict, bool]:
    tokens = ",".join(f"{person}:{value}" for person, value in STATIC.items())
    command = StdioServerParameters(
        command=sys.executable,
        args=[str(SCRIPT), "stdio", "--tokens", tokens, "--seen", str(seen)],
        env={"UPSTREAM_TOKEN": token},
    )
    async with Client(command, mode="legacy") as client:
        result = await client.call_tool("whoami", {})
    return json.loads(result.content[0].text), bool(result.is_error)


def test_over_stdio_the_person_comes_from_the_environment(tmp_path):
    seen = tmp_path / "seen.log"
    carol, carol_error = anyio.run(_stdio_whoami, STATIC["carol"], seen)
    dan, _ = anyio.run(_stdio_whoami, STATIC["dan"], seen)
    assert (carol["person"], carol["audience"], carol_error) == ("carol", None, False)
    assert dan["person"] == "dan" and carol["process"] != dan["process"]  # a process each
    nobody, refused = anyio.run(_stdio_whoami, "tok-nobody-0000", seen)
    assert refused and nobody["error"] == "UPSTREAM_TOKEN names nobody this server knows"
    assert seen.read_text().splitlines() == [f"UPSTREAM_TOKEN={t}" for t in (*STATIC.values(), "tok-nobody-0000")]
