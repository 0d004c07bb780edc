"""A person connects a per-person upstream by signing in at the upstream's own authorization server, in Chromium:
the executor finds the server from the upstream's 401 (RFC 9728, RFC 8414), registers the gateway there (RFC 7591)
or uses the administrator's client, holds the PKCE verifier and exchanges the code; the web process sees a sealed
code only. Then the person's calls reach the upstream as them, a token that runs out is refreshed, and a refresh
that fails asks them to connect again. Links, states and sign-ins are each the person's own and used once; a
refusal at the server connects nothing; a server on a private address is not reached; no token reaches a log."""

import json
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, quote, urlencode, urljoin, urlsplit

import anyio
import httpx2
import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone
from mcp.shared.auth import OAuthMetadata
from mcp.shared.exceptions import MCPError
from playwright.async_api import Browser, Page, async_playwright

from policy.models import Agent
from policy.services import agent_key_issue
from registry.models import ConnectAttempt, PersonalCredential, Upstream
from registry.personal import connect_link, credential_path, personal_disconnect
from registry.secret_store import secret_store, secrets_open
from registry.services import upstream_save
from registry.upstreams import upstream_oauth
from tests import servers
from tests.clients import sdk_client
from tests.conftest import needs
from tests.factories import person_upstream
from tests.helpers import orm
from tests.idp import CLIENTS, private_jwk

pytestmark = pytest.mark.e2e

PASSWORD = "pw-for-tests-only"
TTL = 20  # the upstream's tokens: under REFRESH_MARGIN_SECONDS (30), so every call refreshes first
CATALOG_TOKEN = "tok-catalog-4b8e1f0a"  # a static token of the upstream's, the admin's for catalog sync
DESK = ("switchboard-desk", "desk-secret-for-tests-only")  # a client an administrator registered by hand
CALLBACK = "/account/connect-callback/"


@dataclass
class Stack:
    """An authorization server (the tests' oidc-provider), the protected upstream it serves, and its row; or an
    upstream whose metadata names some other `authorization_server` (then no provider)."""

    provider: servers.Running | None
    upstream: servers.Running
    row: Upstream
    seen: Path  # every Authorization header the upstream received

    def stop(self) -> None:
        self.row.delete()
        self.upstream.stop()
        if self.provider is not None:
            self.provider.stop()


def _provider(logs: Path, slug: str, url: str, clients: list[dict]) -> servers.Running:
    _key, jwk = private_jwk("idp-1")
    with pytest.MonkeyPatch.context() as patch:  # start_oidc_provider passes its environment on
        patch.setenv("OIDC_UPSTREAM_RESOURCE", url)
        patch.setenv("OIDC_UPSTREAM_TTL", str(TTL))
        gateway_resource = f"http://127.0.0.1:{servers.free_port()}/mcp"  # no gateway trusts this one
        return servers.start_oidc_provider(
            gateway_resource, {"keys": [jwk]}, [*CLIENTS, *clients], logs / f"{slug}-as.log"
        )


def _stack(logs: Path, slug: str, clients: list[dict] = (), authorization_server: str = "") -> Stack:
    port = servers.free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    provider = None if authorization_server else _provider(logs, slug, url, clients)
    seen = logs / f"{slug}-seen.log"
    upstream = servers.start_protected_upstream(
        authorization_server or provider.url, logs / f"{slug}.log", {"catalog": CATALOG_TOKEN}, seen, port
    )
    row = person_upstream(slug, CATALOG_TOKEN, transport="streamable_http", url=url, person_connect="oauth")
    return Stack(provider, upstream, row, seen)


@dataclass
class People:
    users: dict[str, object]
    keys: dict[str, str]
    secrets: list[str] = field(default_factory=list)  # every token and client secret the tests saw stored


@pytest.fixture(scope="module")
def people(db) -> Iterator[People]:
    """Alice and Bob: console accounts (they sign in to the connection pages) with personal keys (their agents)."""
    agent = Agent.objects.get_or_create(name="people")[0]
    users = {
        name: get_user_model().objects.create_user(f"{name}-oa", password=PASSWORD, first_name=name.title())
        for name in ("alice", "bob")
    }
    keys = {name: agent_key_issue(agent=agent, owner=user, actor="tests").key for name, user in users.items()}
    yield People(users, keys)
    for user in users.values():
        user.delete()


@pytest.fixture(scope="module")
def notes(logs, inline_gateway) -> Iterator[Stack]:
    """The upstream people connect by registering the gateway at its server (no client set up)."""
    desk = {"client_id": DESK[0], "client_secret": DESK[1], "response_types": ["code"]}
    desk |= {
        "redirect_uris": [f"{inline_gateway.url}{CALLBACK}"],
        "grant_types": ["authorization_code", "refresh_token"],
    }
    stack = _stack(logs, "notes", [desk])
    yield stack
    stack.stop()


def _stored(row: Upstream, gateway: servers.Running, user) -> tuple[PersonalCredential | None, dict[str, str]]:
    """The person's credential row and, opened here (the tests hold the private key), its values."""
    credential = PersonalCredential.objects.filter(upstream=row, person_subject=str(user.pk)).first()
    path = credential_path(row, gateway.url, str(user.pk))
    return credential, secrets_open(path, secret_store().read(path))


def _forget(row: Upstream) -> None:
    for credential in PersonalCredential.objects.filter(upstream=row).exclude(person_subject="admin"):
        personal_disconnect(credential)


async def _chromium(playwright) -> Browser:
    needs(servers.CHROMIUM.exists(), "Chromium is not installed (apt-get install chromium)")
    return await playwright.chromium.launch(executable_path=str(servers.CHROMIUM), args=servers.CHROMIUM_ARGS)


async def _signed_in(browser: Browser, gateway: str, user, path: str) -> Page:
    """A fresh browser (no cookie of anyone's) signed in to the gateway as `user`, on `path`."""
    page = await (await browser.new_context()).new_page()
    page.set_default_timeout(10_000)
    await page.goto(f"{gateway}/accounts/login/?next={quote(path)}")
    await page.fill("#id_username", user.username)
    await page.fill("#id_password", PASSWORD)
    await page.click("#sign-in")
    await page.wait_for_url(re.compile(re.escape(gateway + path.split("?")[0])))
    return page


async def _at_the_server(page: Page, login: str, decline: bool = False) -> None:
    """The authorization server's own pages (devInteractions): sign in as `login`, then consent or decline."""
    await page.fill("input[name=login]", login)
    await page.fill("input[name=password]", "any")
    await page.click("button[type=submit]")
    await page.click("text=[ Cancel ]" if decline else "button[type=submit]")


async def _connect(gateway: str, user, slug: str, login: str, decline: bool = False) -> tuple[str, str]:
    """`user` connects `slug` in Chromium, signing in at its server as `login`: the page they end on, and its text."""
    async with async_playwright() as playwright:
        browser = await _chromium(playwright)
        try:
            page = await _signed_in(browser, gateway, user, f"/account/connections/{slug}/")
            await page.click("#connect")
            await _at_the_server(page, login, decline)
            await page.wait_for_url(re.compile(re.escape(gateway) + "/account/"))
            await page.wait_for_load_state()
            return page.url, await page.inner_text("body")
        finally:
            await browser.close()


async def _whoami(gateway: str, key: str, slug: str) -> dict:
    async with sdk_client(gateway, key, "legacy") as client:
        result = await client.call_tool(f"{slug}__whoami", {})
    assert not result.is_error, result
    return json.loads(result.content[0].text)


async def _refused(gateway: str, key: str, slug: str) -> MCPError:
    async with sdk_client(gateway, key, "legacy") as client:
        with pytest.raises(MCPError) as refused:
            await client.call_tool(f"{slug}__whoami", {})
    return refused.value


def test_a_person_connects_by_signing_in_at_the_upstreams_server_and_calls_as_themselves(notes, people, gateway):
    alice = people.users["alice"]
    _forget(notes.row)
    ended, text = anyio.run(_connect, gateway.url, alice, "notes", "alice")
    assert ended == f"{gateway.url}/account/connections/notes/?connected=1"
    assert "Connected. Go back to your agent and call again." in text
    credential, values = _stored(notes.row, gateway, alice)
    assert (credential.kind, credential.person_name, credential.person_issuer) == ("oauth", "Alice", gateway.url)
    assert credential.expires_at is not None and not ConnectAttempt.objects.filter(upstream=notes.row).exists()
    # Registered at the server just now (not the administrator's client), confidential, with a refresh token.
    assert values["client_id"] != DESK[0] and values["client_secret"] and values["refresh_token"]
    assert (values["resource"], values["token_url"]) == (notes.row.url, f"{notes.provider.url}/token")
    people.secrets += [values["token"], values["refresh_token"], values["client_secret"]]
    answer = anyio.run(_whoami, gateway.url, people.keys["alice"], "notes")
    assert (answer["person"], answer["audience"]) == ("alice", notes.row.url)


def test_a_token_that_runs_out_is_refreshed_by_the_executor_on_the_next_call(notes, people, inline_gateway):
    alice = people.users["alice"]
    _forget(notes.row)
    anyio.run(_connect, inline_gateway.url, alice, "notes", "alice")
    before, first = _stored(notes.row, inline_gateway, alice)
    assert before.expires_at < timezone.now() + timedelta(seconds=TTL + 1)  # within the refresh margin
    assert anyio.run(_whoami, inline_gateway.url, people.keys["alice"], "notes")["person"] == "alice"
    after, second = _stored(notes.row, inline_gateway, alice)
    assert after.version > before.version and after.expires_at > before.expires_at
    assert second["token"] != first["token"]
    people.secrets += [first["token"], first["refresh_token"], second["token"], second.get("refresh_token", "")]
    received = notes.seen.read_text().splitlines()
    assert f"Bearer {second['token']}" in received and f"Bearer {first['token']}" not in received


def _through_the_server(url: str, login: str) -> str:
    """The server's pages from the authorization request `url` on, driven as a browser would but stopping short
    of the gateway: where the server sends the person back (the callback, with its code and state)."""
    with httpx2.Client(timeout=10) as http:
        page = http.get(url)
        for _step in range(10):
            if page.status_code in (302, 303):
                location = urljoin(str(page.url), page.headers["location"])
                if CALLBACK in location:
                    return location
                page = http.get(location)
                continue
            form = dict(re.findall(r'name="([^"]+)"(?: [^>]*)? value="([^"]*)"', page.text))
            if 'name="login"' in page.text:
                form |= {"login": login, "password": "any"}
            page = http.post(urljoin(str(page.url), re.search(r'action="([^"]+)"', page.text).group(1)), data=form)
    raise AssertionError(f"the server's pages did not lead back: {page.status_code} {page.text[:300]}")


async def _held_callback(gateway: str, alice, slug: str, browser: Browser) -> tuple[Page, str]:
    """Alice begins in her browser and signs in at the server, but her way back to the gateway is held: her page,
    and the callback's URL. (Chromium's routing cannot hold the end of a redirect chain, so the server's pages
    are walked with httpx.)"""
    page = await _signed_in(browser, gateway, alice, f"/account/connections/{slug}/")
    form = {"csrfmiddlewaretoken": await page.input_value("#oauth-start input[name=csrfmiddlewaretoken]")}
    begun = await page.request.post(f"{gateway}/account/connections/{slug}/oauth/", form=form, max_redirects=0)
    assert begun.status == 302, await begun.text()
    return page, await anyio.to_thread.run_sync(_through_the_server, begun.headers["location"], "alice")


def test_someone_else_can_neither_begin_nor_finish_a_persons_sign_in_and_a_state_is_used_once(
    notes, people, inline_gateway
):
    alice, bob = people.users["alice"], people.users["bob"]
    _forget(notes.row)
    gateway = inline_gateway.url
    alices_link = connect_link(gateway, "notes", gateway, str(alice.pk))

    async def scenario() -> dict[str, tuple[int, str]]:
        seen: dict[str, tuple[int, str]] = {}
        async with async_playwright() as playwright:
            browser = await _chromium(playwright)
            try:
                # Bob, with the `for` of Alice's link in his own connection page's form.
                bobs = await _signed_in(browser, gateway, bob, "/account/connections/notes/")
                made_for = parse_qs(urlsplit(alices_link).query)["for"][0]
                await bobs.eval_on_selector(
                    "#oauth-start input[name=for]", "(input, value) => input.value = value", made_for
                )
                async with bobs.expect_navigation() as begun:
                    await bobs.click("#connect")
                seen["bob begins"] = ((await begun.value).status, await bobs.inner_text("body"))
                alices, callback = await _held_callback(gateway, alice, "notes", browser)
                answer = await bobs.goto(callback)
                seen["bob finishes"] = (answer.status, await bobs.inner_text("body"))
                answer = await alices.goto(callback)
                seen["alice finishes"] = (answer.status, alices.url)
                answer = await alices.goto(callback)
                seen["alice again"] = (answer.status, await alices.inner_text("body"))
            finally:
                await browser.close()
        return seen

    seen = anyio.run(scenario)
    for refused in ("bob begins", "bob finishes"):
        assert seen[refused][0] == 403 and "This link was made for someone else" in seen[refused][1]
        assert "you are signed in as Bob" in seen[refused][1]
    assert seen["alice finishes"] == (200, f"{gateway}/account/connections/notes/?connected=1")
    assert seen["alice again"][0] == 400
    assert "This sign-in is unknown or was finished already: nothing more was connected." in seen["alice again"][1]
    credential, values = _stored(notes.row, inline_gateway, alice)
    assert credential.person_name == "Alice" and not _stored(notes.row, inline_gateway, bob)[0]
    people.secrets += [values["token"], values["refresh_token"], values["client_secret"]]


def test_a_sign_in_finished_too_late_is_refused(notes, people, inline_gateway):
    alice, gateway = people.users["alice"], inline_gateway.url
    _forget(notes.row)

    async def scenario() -> tuple[int, str]:
        async with async_playwright() as playwright:
            browser = await _chromium(playwright)
            try:
                page, callback = await _held_callback(gateway, alice, "notes", browser)
                past = timezone.now() - timedelta(seconds=1)
                await orm(lambda: ConnectAttempt.objects.update(expires_at=past))
                answer = await page.goto(callback)
                return answer.status, await page.inner_text("body")
            finally:
                await browser.close()

    status, text = anyio.run(scenario)
    assert status == 400 and "This sign-in took too long and has expired: nothing was connected." in text
    assert not _stored(notes.row, inline_gateway, alice)[0] and not ConnectAttempt.objects.exists()


def test_declining_at_the_server_connects_nothing_and_says_so(notes, people, inline_gateway):
    alice = people.users["alice"]
    _forget(notes.row)
    ended, text = anyio.run(_connect, inline_gateway.url, alice, "notes", "alice", True)
    assert urlsplit(ended).path == CALLBACK
    assert "You declined at notes: nothing was connected." in text
    assert _stored(notes.row, inline_gateway, alice) == (None, {})
    assert not ConnectAttempt.objects.filter(upstream=notes.row).exists()


def test_an_administrators_client_is_used_instead_of_registering_one(notes, people, inline_gateway):
    alice = people.users["alice"]
    desk = Upstream.objects.get(pk=notes.row.pk)
    desk.pk, desk.slug, desk.catalog_credential = None, "notes-desk", None
    desk.person_client = {"client_id": DESK[0], "client_secret": DESK[1]}
    upstream_save(upstream=desk, created=True)  # sealed on save
    try:
        ended, _text = anyio.run(_connect, inline_gateway.url, alice, "notes-desk", "alice")
        assert ended.endswith("/account/connections/notes-desk/?connected=1")
        credential, values = _stored(desk, inline_gateway, alice)
        assert (values["client_id"], values["client_secret"]) == DESK and credential.kind == "oauth"
        people.secrets += [values["token"], values["refresh_token"]]
    finally:
        desk.delete()


@pytest.mark.parametrize(
    ("change", "status", "said"),
    [
        ({"iss": "http://127.0.0.1:9"}, 400, "The sign-in's answer came from another server than the one you were"),
        ({"iss": None}, 400, "The sign-in's answer does not say which server sent it, as that server promised to"),
        ({"code": None}, 400, "The sign-in's answer carries no code: start again."),
        ({"code": "not-the-code"}, 502, "notes's authorization server gave no token, so nothing was connected"),
    ],
)
def test_a_sign_ins_answer_that_does_not_hold_connects_nothing(notes, people, inline_gateway, change, status, said):
    alice, gateway = people.users["alice"], inline_gateway.url
    _forget(notes.row)

    async def scenario() -> tuple[int, str]:
        async with async_playwright() as playwright:
            browser = await _chromium(playwright)
            try:
                page, callback = await _held_callback(gateway, alice, "notes", browser)
                query = {name: values[0] for name, values in parse_qs(urlsplit(callback).query).items()}
                query = {name: value for name, value in (query | change).items() if value is not None}
                answer = await page.goto(f"{gateway}{CALLBACK}?{urlencode(query)}")
                return answer.status, await page.inner_text("body")
            finally:
                await browser.close()

    answered, text = anyio.run(scenario)
    assert answered == status and said in text
    assert not _stored(notes.row, inline_gateway, alice)[0] and not ConnectAttempt.objects.exists()


class Oversized(ThreadingHTTPServer):
    """Answers every GET with a JSON object past the gateway's limit on what it reads of an authorization server."""

    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = json.dumps({"issuer": "x", "padding": "x" * (upstream_oauth.MAX_ANSWER_BYTES + 1)}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        threading.Thread(target=self.serve_forever, daemon=True).start()


def test_an_authorization_server_that_says_too_much_or_nothing_ends_the_sign_in(logs, settings):
    """Straight on the executor's side (this process's), with a short connect timeout."""
    settings.GATEWAY_CONNECT_TIMEOUT = 0.5
    oversized, silent = Oversized(), servers.SilentServer()
    silent_origin = silent.url.removesuffix("/mcp")
    stacks = [_stack(logs, "wordy", authorization_server=oversized.url)]
    stacks.append(_stack(logs, "silent", authorization_server=silent_origin))
    try:
        begun = [anyio.run(upstream_oauth.oauth_begin, stack.row.id, "https://gw.example.com/cb/") for stack in stacks]
    finally:
        for stack in stacks:
            stack.stop()
        oversized.shutdown()
        silent.close()
    assert [(outcome["ok"], outcome["code"]) for outcome in begun] == [(False, "UPSTREAM_OAUTH_FAILED")] * 2
    wordy_url = f"{oversized.url}/.well-known/oauth-authorization-server"
    assert begun[0]["message"] == f"{wordy_url} answered with over {upstream_oauth.MAX_ANSWER_BYTES} bytes."
    said = f"{silent_origin} could not be reached while signing in to silent. Try again later."
    timed_out = f"GET {silent_origin}/.well-known/oauth-authorization-server: ReadTimeout"
    assert (begun[1]["message"], begun[1]["detail"]) == (said, timed_out)


async def _begin_page(gateway: str, user, slug: str) -> tuple[int, str]:
    async with async_playwright() as playwright:
        browser = await _chromium(playwright)
        try:
            page = await _signed_in(browser, gateway, user, f"/account/connections/{slug}/")
            async with page.expect_navigation() as begun:
                await page.click("#connect")
            return (await begun.value).status, await page.inner_text("body")
        finally:
            await browser.close()


def test_an_authorization_server_on_a_private_address_is_not_reached(logs, people, server_env, inline_gateway):
    inside = "http://127.0.0.2:9"  # loopback, and not the one address the tests' egress allows
    stack = _stack(logs, "inside", authorization_server=inside)
    try:
        status, text = anyio.run(_begin_page, inline_gateway.url, people.users["alice"], "inside")
        assert status == 502
        assert (
            "inside's authorization server http://127.0.0.2:9 is on an address this gateway does not reach "
            "(127.0.0.2 is not a public address). If it is your organisation's own, an administrator can list "
            "http://127.0.0.2:9 in GATEWAY_INTERNAL_AUTH_SERVERS."
        ) in text
        # Listed, it is tried (and nothing answers there).
        listed = {"GATEWAY_INTERNAL_AUTH_SERVERS": inside}
        with servers.inline_gateway_with(server_env, logs / "gateway-listed.log", **listed) as trusting:
            status, text = anyio.run(_begin_page, trusting.url, people.users["alice"], "inside")
        assert status == 502
        assert "http://127.0.0.2:9 could not be reached while signing in to inside. Try again later." in text
        assert not ConnectAttempt.objects.exists()
    finally:
        stack.stop()


def test_a_refresh_that_fails_asks_the_person_to_connect_again(logs, people, inline_gateway):
    alice, gateway = people.users["alice"], inline_gateway.url
    stack = _stack(logs, "fading")
    try:
        anyio.run(_connect, gateway, alice, "fading", "alice")
        credential, values = _stored(stack.row, inline_gateway, alice)
        people.secrets += [values["token"], values["refresh_token"], values["client_secret"]]
        stack.provider.stop()  # its tokens run out within the margin: the next call must refresh, and cannot
        for _ in range(2):  # the executor finds it; then the web process already knows
            refused = anyio.run(_refused, gateway, people.keys["alice"], "fading")
            link = refused.error.data["connectUrl"]
            assert refused.error.data["code"] == "CREDENTIAL_EXPIRED"
            assert refused.error.message == (
                f"Your connection to fading ran out and could not be renewed: connect again at {link}, "
                "then call fading__whoami again."
            )
        assert link.startswith(f"{gateway}/account/connections/fading/?for=")
        assert PersonalCredential.objects.get(pk=credential.pk).refresh_failed_at is not None
    finally:
        stack.stop()


def test_the_gateway_serves_its_client_metadata_document_and_uses_it_where_the_server_takes_one(inline_gateway):
    document = httpx2.get(f"{inline_gateway.url}/account/connect-client/", timeout=5).json()
    assert document == {
        "client_id": f"{inline_gateway.url}/account/connect-client/",
        "client_name": f"Switchboard at {urlsplit(inline_gateway.url).netloc}",
        "redirect_uris": [f"{inline_gateway.url}{CALLBACK}"],
        "grant_types": ["authorization_code", "refresh_token"],
        "response_types": ["code"],
        "token_endpoint_auth_method": "none",
        "application_type": "web",
    }
    metadata = OAuthMetadata.model_validate(
        {
            "issuer": "https://as.example.com",
            "authorization_endpoint": "https://as.example.com/authorize",
            "token_endpoint": "https://as.example.com/token",
            "code_challenge_methods_supported": ["S256"],
            "client_id_metadata_document_supported": True,
        }
    )
    found = upstream_oauth.Found("https://up.example.com/mcp", "https://as.example.com", metadata, None)
    row = Upstream(slug="documented", url="https://up.example.com/mcp")
    https = anyio.run(upstream_oauth._client, row, found, "https://gw.example.com/account/connect-callback/")
    assert https == {"client_id": "https://gw.example.com/account/connect-client/", "client_secret": ""}
    # A document's URL must be https: over plain http the server has no registration to fall back on here.
    with pytest.raises(upstream_oauth.SignInFailed, match="offers no client registration"):
        anyio.run(upstream_oauth._client, row, found, f"{inline_gateway.url}{CALLBACK}")


def test_no_token_or_client_secret_reaches_any_log(people, logs):
    secrets = [value for value in people.secrets if value]
    assert len(secrets) >= 8, "the tests above stored fewer credentials than expected"
    for path in logs.iterdir():
        if path.is_file() and not path.name.endswith("-seen.log"):  # what the upstream was sent, on purpose
            text = path.read_text(errors="replace")
            assert not [secret for secret in secrets if secret in text], path.name
