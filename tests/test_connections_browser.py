"""The Connections pages in a real browser (Debian's Chromium, driven by Playwright) against a running gateway: a
person pastes their own token for a per-person upstream into a password field and their agent then reaches it as
them; someone else who opens the link made for them is refused; an administrator sees who connected what (never a
value) and revokes; the person disconnects and the sealed value goes with the row; a token that is not one line
of visible characters is refused; no token reaches the gateway's log."""

import json
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import parse_qs, quote, urlsplit

import pytest
from django.contrib.auth import get_user_model
from django.utils.timezone import now
from mcp.shared.exceptions import MCPError
from playwright.sync_api import Browser, Page

from policy.models import Agent, Person
from policy.services import agent_key_issue
from registry.models import PersonalCredential, SealedSecret, Upstream
from registry.personal import connect_link, credential_path, personal_connect, personal_disconnect
from tests import servers
from tests.clients import sdk_client, tool_names
from tests.factories import person_upstream
from tests.helpers import eventually, run

pytestmark = pytest.mark.e2e

PASSWORD = "connections-pw-for-tests-only"
TIMEOUT_MS = 10_000
SLUG = "journal"
WHOAMI = f"{SLUG}__whoami"
TOKENS = {"alice": "tok-journal-alice-7c41e9b2a0", "bob": "tok-journal-bob-2f8d5a6c13"}
CATALOG_TOKEN = "tok-journal-admin-9e3b1d7f42"  # the administrator's own, to sync the catalog
REFUSED = ["tok-journal two-words-5d0c", "tok-journal\nsecond-line-8a1f"]  # refused by the form, never stored
ONE_LINE = "A token is one line of visible characters, without spaces."


@pytest.fixture(scope="module")
def gateway(server_env, logs) -> Iterator[servers.Running]:
    """An inline gateway of this module's own, so that its log holds only what these tests did."""
    with servers.inline_gateway_with(server_env, logs / "gateway-connections.log") as running:
        yield running


@pytest.fixture(scope="module")
def journal(db, logs) -> Iterator[Upstream]:
    """The protected test upstream (static tokens), per person by pasted token in the bearer slot; its catalog
    synced through the administrator's own connection."""
    tokens = TOKENS | {"admin": CATALOG_TOKEN}
    seen = logs / f"{SLUG}-seen.log"
    running = servers.start_protected_upstream("http://127.0.0.1:9", logs / f"{SLUG}.log", tokens=tokens, seen=seen)
    upstream = person_upstream(SLUG, CATALOG_TOKEN, transport="streamable_http", url=running.url, internal=True)
    try:
        yield upstream
    finally:
        for credential in PersonalCredential.objects.filter(upstream=upstream).select_related("upstream"):
            personal_disconnect(credential)
        upstream.delete()
        running.stop()


@pytest.fixture(scope="module")
def people(db) -> Iterator[dict]:
    """Alice and Bob, console accounts with a password (they sign in to their own pages) and a personal key each
    (their agents'); an administrator, a superuser."""
    model = get_user_model()
    agent = Agent.objects.create(name="connections-people")
    users = {
        name: model.objects.create_user(f"{name}-cb", password=PASSWORD, first_name=name.title()) for name in TOKENS
    }
    keys = {name: agent_key_issue(agent=agent, owner=user, actor="tests").key for name, user in users.items()}
    admin = model.objects.create_superuser("connections-admin", password=PASSWORD)
    try:
        yield {"users": users, "keys": keys, "admin": admin}
    finally:
        agent.delete()
        admin.delete()
        for user in users.values():
            user.delete()


@contextmanager
def signed_in(browser: Browser, gateway: servers.Running, user, path: str) -> Iterator[Page]:
    """A fresh browser context (nobody's cookies) signed in through the console's login form as `user`, on `path`."""
    context = browser.new_context()
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    try:
        page.goto(f"{gateway.url}/accounts/login/?next={quote(path)}")
        page.fill("#id_username", user.username)
        page.fill("#id_password", PASSWORD)
        page.click("#sign-in")
        page.wait_for_url(re.compile(re.escape(gateway.url + path.split("?")[0])))
        yield page
    finally:
        context.close()


def agent_run(scenario):
    """An MCP client scenario, on a thread of its own: this one holds Playwright's event loop."""
    with ThreadPoolExecutor(1) as thread:
        return thread.submit(run, scenario).result()


def whoami(gateway: servers.Running, key: str) -> str:
    async def scenario() -> str:
        async with sdk_client(gateway.url, key, "legacy") as client:
            result = await client.call_tool(WHOAMI, {})
        assert not result.is_error, result
        return json.loads(result.content[0].text)["person"]

    return agent_run(scenario)


def refusal(gateway: servers.Running, key: str) -> MCPError | None:
    async def scenario() -> MCPError | None:
        async with sdk_client(gateway.url, key, "legacy") as client:
            try:
                await client.call_tool(WHOAMI, {})
            except MCPError as refused:
                return refused
        return None

    return agent_run(scenario)


def listed(gateway: servers.Running, key: str) -> None:
    """Wait until the gateway's snapshot offers the upstream's tool (it sees a new upstream within a second)."""
    eventually(lambda: WHOAMI in agent_run(lambda: tool_names(gateway.url, key)))


def person_of(gateway: servers.Running, user) -> dict[str, str]:
    """How a personal key names its owner toward upstreams: issuer the gateway's URL, subject the account's pk."""
    return {"issuer": gateway.url, "subject": str(user.pk)}


def stored(upstream: Upstream, gateway: servers.Running, user) -> tuple[PersonalCredential | None, bool]:
    """The person's credential row, and whether the secret store holds a sealed value at its path."""
    person = person_of(gateway, user)
    credential = PersonalCredential.objects.filter(
        upstream=upstream, person_issuer=person["issuer"], person_subject=person["subject"]
    ).first()
    path = credential_path(upstream, person["issuer"], person["subject"])
    return credential, SealedSecret.objects.filter(path=path).exists()


def forget(upstream: Upstream, gateway: servers.Running, user) -> None:
    credential, _sealed = stored(upstream, gateway, user)
    if credential is not None:
        personal_disconnect(credential)


def connect(upstream: Upstream, gateway: servers.Running, user, name: str) -> PersonalCredential:
    """The person's token stored directly, as the page stores it (for tests about what comes after)."""
    values = {"token": TOKENS[name]}
    return personal_connect(
        upstream=upstream, name=user.first_name, kind="token", values=values, **person_of(gateway, user)
    )


def test_a_person_pastes_their_token_and_their_agent_then_calls_as_them(browser, gateway, journal, people):
    alice = people["users"]["alice"]
    forget(journal, gateway, alice)
    with signed_in(browser, gateway, alice, "/account/") as page:
        page.click("#connections-link")
        row = page.locator(f"#connection-{SLUG}")
        assert "not connected" in row.inner_text()
        row.locator("a.connect").click()
        page.wait_for_url(f"{gateway.url}/account/connections/{SLUG}/")
        assert page.inner_text("#person") == "Alice"
        field = page.locator("#paste-token input[name=token]")
        assert (field.get_attribute("type"), field.get_attribute("autocomplete")) == ("password", "off")
        field.fill(TOKENS["alice"])
        page.click("#connect")
        page.wait_for_url(f"{gateway.url}/account/connections/{SLUG}/?connected=1")
        assert page.inner_text("#connected") == "Connected. Go back to your agent and call again."
        assert page.input_value("#paste-token input[name=token]") == ""
        assert TOKENS["alice"] not in page.content()
        page.click("text=All connections")
        row = page.locator(f"#connection-{SLUG}")
        assert "not connected" not in row.inner_text()
        assert row.locator("button.disconnect").inner_text() == "Disconnect"
        assert TOKENS["alice"] not in page.content()
    credential, sealed = stored(journal, gateway, alice)
    assert sealed and (credential.kind, credential.person_name, credential.revoked_at) == ("token", "Alice", None)
    listed(gateway, people["keys"]["alice"])
    assert whoami(gateway, people["keys"]["alice"]) == "alice"


def test_the_link_an_agent_was_given_connects_the_person_it_names_and_says_so(browser, gateway, journal, people):
    """Alice's account also acts as a person of the IdP (she signed in there once, and that person is the one her
    pages offer first); her agent's personal key names the account itself, and its refusal carries a link for
    that one. The page she lands on after connecting speaks of that person, not the IdP one."""
    alice, key = people["users"]["alice"], people["keys"]["alice"]
    forget(journal, gateway, alice)
    idp = Person.objects.create(
        issuer="https://idp.example.com", subject="alice-journal", name="Alice at the IdP", user=alice, last_seen=now()
    )
    try:
        listed(gateway, key)
        refused = eventually(lambda: refusal(gateway, key))
        assert refused.error.data["code"] == "CREDENTIAL_REQUIRED"
        link = refused.error.data["connectUrl"]
        with signed_in(browser, gateway, alice, f"/account/connections/{SLUG}/") as page:
            assert page.inner_text("#person") == "Alice at the IdP"
            page.goto(link)
            assert page.inner_text("#person") == "Alice"
            page.fill("#paste-token input[name=token]", TOKENS["alice"])
            page.click("#connect")
            page.wait_for_selector("#connected")
            assert parse_qs(urlsplit(page.url).query)["for"] == parse_qs(urlsplit(link).query)["for"]
            assert page.inner_text("#person") == "Alice"
            assert TOKENS["alice"] not in page.content()
        assert stored(journal, gateway, alice)[1]
        assert not PersonalCredential.objects.filter(upstream=journal, person_subject=idp.subject).exists()
        assert whoami(gateway, key) == "alice"
    finally:
        idp.delete()


def test_someone_else_who_opens_a_persons_link_is_refused_and_nothing_is_stored(browser, gateway, journal, people):
    alice, bob = people["users"]["alice"], people["users"]["bob"]
    for user in (alice, bob):
        forget(journal, gateway, user)
    link = connect_link(gateway.url, SLUG, gateway.url, str(alice.pk))
    with signed_in(browser, gateway, bob, f"/account/connections/{SLUG}/") as page:
        answer = page.goto(link)
        assert answer.status == 403
        assert page.inner_text("#refused") == "This link was made for someone else"
        assert "you are signed in as Bob" in page.inner_text("body")
        assert page.locator("input[name=token]").count() == 0
        # His own page's form, carrying the `for` of Alice's link: refused too, before anything is stored.
        page.goto(f"{gateway.url}/account/connections/{SLUG}/")
        page.eval_on_selector(
            "#paste-token input[name=for]",
            "(input, value) => input.value = value",
            parse_qs(urlsplit(link).query)["for"][0],
        )
        page.fill("#paste-token input[name=token]", TOKENS["bob"])
        with page.expect_navigation() as posted:
            page.click("#connect")
        assert posted.value.status == 403
        assert page.inner_text("#refused") == "This link was made for someone else"
    assert stored(journal, gateway, bob) == (None, False)
    assert stored(journal, gateway, alice) == (None, False)


def test_an_administrator_sees_the_connection_without_its_value_and_revokes_it(browser, gateway, journal, people):
    alice, admin, key = people["users"]["alice"], people["admin"], people["keys"]["alice"]
    credential = connect(journal, gateway, alice, "alice")
    listed(gateway, key)
    assert whoami(gateway, key) == "alice"
    with signed_in(
        browser, gateway, admin, f"/admin/registry/personalcredential/?upstream__id__exact={journal.pk}"
    ) as page:
        row = page.locator("#result_list tbody tr", has_text="Alice")
        assert str(alice.pk) in row.inner_text() and "active" in row.inner_text()
        assert not [token for token in [*TOKENS.values(), CATALOG_TOKEN] if token in page.content()]
        row.locator("input.action-select").check()
        page.select_option("select[name=action]", "revoke")
        page.click("button[name=index]")
        page.wait_for_selector("text=1 connection(s) revoked.")
        assert f"revoked by {admin.username}" in page.locator("#result_list tbody tr", has_text="Alice").inner_text()
        assert not [token for token in [*TOKENS.values(), CATALOG_TOKEN] if token in page.content()]
    assert stored(journal, gateway, alice) == (PersonalCredential.objects.get(pk=credential.pk), False)
    with signed_in(browser, gateway, alice, "/account/connections/") as page:
        assert f"(revoked by {admin.username})" in page.inner_text(f"#connection-{SLUG}")
        page.goto(f"{gateway.url}/account/connections/{SLUG}/?connected=1")  # the address she was sent to once
        assert page.locator("#connected").count() == 0
        assert f"revoked by {admin.username}. Connecting again replaces it." in page.inner_text("#status")
    refused = refusal(gateway, key)  # the very next call: every process reads the row
    assert refused.error.data["code"] == "CREDENTIAL_REVOKED"
    assert refused.error.message.startswith(f"An administrator revoked your connection to {SLUG}: connect again at")


def test_a_person_disconnects_and_the_sealed_value_goes_with_the_row(browser, gateway, journal, people):
    alice, key = people["users"]["alice"], people["keys"]["alice"]
    connect(journal, gateway, alice, "alice")
    assert stored(journal, gateway, alice)[1]
    listed(gateway, key)
    assert whoami(gateway, key) == "alice"
    with signed_in(browser, gateway, alice, "/account/connections/") as page:
        page.locator(f"#connection-{SLUG} button.disconnect").click()
        page.wait_for_url(f"{gateway.url}/account/connections/")
        assert "not connected" in page.inner_text(f"#connection-{SLUG}")
    assert stored(journal, gateway, alice) == (None, False)
    refused = refusal(gateway, key)  # the very next call
    assert refused.error.data["code"] == "CREDENTIAL_REQUIRED"


def test_a_token_with_a_space_or_a_newline_is_refused_by_the_form_and_nothing_is_stored(
    browser, gateway, journal, people
):
    alice = people["users"]["alice"]
    forget(journal, gateway, alice)
    spaced, two_lines = REFUSED
    with signed_in(browser, gateway, alice, f"/account/connections/{SLUG}/") as page:
        page.fill("#paste-token input[name=token]", spaced)
        page.click("#connect")
        page.wait_for_selector("#paste-token .errorlist")
        assert page.inner_text("#paste-token .errorlist") == ONE_LINE
        assert page.input_value("#paste-token input[name=token]") == "" and spaced not in page.content()
        # A password field drops line breaks as it is filled (HTML's value sanitization), so a client that
        # sends one posts the form itself, with the page's CSRF token and the person's session.
        csrf = page.input_value("#paste-token input[name=csrfmiddlewaretoken]")
        form = {"csrfmiddlewaretoken": csrf, "for": "", "token": two_lines}
        answer = page.request.post(page.url, form=form, headers={"Referer": page.url})
        assert answer.status == 200 and ONE_LINE in answer.text() and two_lines not in answer.text()
    assert stored(journal, gateway, alice) == (None, False)


def test_no_token_reaches_the_gateways_log_and_the_upstream_saw_only_stored_ones(gateway, journal, logs):
    log = Path(gateway.log).read_text(errors="replace")
    assert f"/account/connections/{SLUG}/" in log, "the gateway's log does not show the pages the tests opened"
    secrets = [*TOKENS.values(), CATALOG_TOKEN, *REFUSED, *REFUSED[1].splitlines()]
    for path in (gateway.log, logs / f"{SLUG}.log"):
        text = Path(path).read_text(errors="replace")
        assert not [secret for secret in secrets if secret in text], path
    # What the upstream was sent, on purpose: never Bob's (refused), nor a token the form refused.
    seen = set(re.findall(r"Bearer (\S+)", (logs / f"{SLUG}-seen.log").read_text()))
    assert seen == {TOKENS["alice"], CATALOG_TOKEN}
