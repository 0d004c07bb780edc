"""Every password sign-in (the console's /admin/login/ and /accounts/login/, where people sign in for the built-in
authorization server) is throttled per username and client address by django-axes: after
GATEWAY_SIGN_IN_MAX_FAILURES the pair is refused even with the right password, in every web process, until its
window ends or an operator unlocks it; other people from the same address sign in meanwhile."""

import io
import re
import uuid
from collections.abc import Iterator
from datetime import timedelta

import httpx2
import pytest
from axes.models import AccessAttempt
from django.contrib.auth import authenticate, get_user_model
from django.core.management import call_command
from django.test import Client, RequestFactory

from tests import servers
from tests.helpers import audit_mark, audit_since, eventually

PASSWORD = "right-password-for-tests"
BAD_PASSWORD = "not-the-password"
PAGES = ["/admin/login/", "/accounts/login/"]
WRONG = {
    "/admin/login/": "Please enter the correct username and password for a staff account.",
    "/accounts/login/": "Your username and password did not match. Try again.",
}
# The authorization server sends a person here with the authorize request to come back to.
AUTHORIZE = "/oauth/authorize/?response_type=code&client_id=some-client"


def locked(username: str, failures: int = 5, wait: str = "15 minutes") -> str:
    return (
        f"Too many failed sign-ins: after {failures} failed attempts this account is locked at your address for "
        f"{wait}, and until then even the right password is refused. An operator can unlock it sooner with: "
        f"manage.py axes_reset_username {username}"
    )


@pytest.fixture
def operator(db) -> Iterator[str]:
    user = get_user_model().objects.create_superuser(f"op-{uuid.uuid4().hex[:8]}", password=PASSWORD)
    yield user.username
    user.delete()


def sign_in(client: Client, page: str, username: str, password: str):
    next_page = "/admin/" if page == "/admin/login/" else AUTHORIZE
    return client.post(page, {"username": username, "password": password, "next": next_page})


def fail_until_locked(page: str, username: str, failures: int = 5) -> None:
    """Wrong passwords until the pair locks: each is told so, and the one that locks is told it is locked."""
    client = Client()
    for _ in range(failures - 1):
        response = sign_in(client, page, username, BAD_PASSWORD)
        assert response.status_code == 200 and WRONG[page] in response.content.decode()
    response = sign_in(client, page, username, BAD_PASSWORD)
    assert response.status_code == 429 and locked(username, failures) in response.content.decode()


def sign_in_rows(mark: int) -> list:
    """The sign-in rows since `mark`: the outcome sweep may settle another test's leftover call meanwhile."""
    return [row for row in audit_since(mark) if row.kind == "sign_in"]


@pytest.mark.parametrize("page", PAGES)
def test_after_five_failures_on_either_sign_in_page_even_the_right_password_is_refused(operator, page):
    mark = audit_mark()
    fail_until_locked(page, operator)
    stranger = f"nobody-{uuid.uuid4().hex[:8]}"
    fail_until_locked(page, stranger)
    rows = sign_in_rows(mark)
    detail = {"action": "sign_in_locked", "address": "127.0.0.1", "failures": 5, "page": page}
    assert [(r.kind, r.actor, r.detail) for r in rows] == [
        ("sign_in", operator, detail | {"known_user": True}),
        ("sign_in", "", detail | {"known_user": False}),
    ], "one row per lock, naming only real accounts"
    assert BAD_PASSWORD not in repr([(r.actor, r.detail) for r in rows])
    client = Client()
    refused = sign_in(client, page, operator, PASSWORD)
    assert refused.status_code == 429 and locked(operator) in refused.content.decode()
    assert "_auth_user_id" not in client.session
    assert len(sign_in_rows(mark)) == 2, "a refused attempt while locked writes no more rows"
    other = get_user_model().objects.create_superuser(f"op-{uuid.uuid4().hex[:8]}", password=PASSWORD)
    try:
        assert sign_in(Client(), page, other.username, PASSWORD).status_code == 302, "another person is unaffected"
    finally:
        other.delete()


def test_the_lock_lifts_when_its_window_ends_and_a_success_clears_the_count(operator, settings):
    settings.AXES_COOLOFF_TIME = timedelta(seconds=10)  # a password check can take a second here
    settings.AXES_FAILURE_LIMIT = 2
    page = "/admin/login/"
    client = Client()
    assert WRONG[page] in sign_in(client, page, operator, "wrong").content.decode()
    assert sign_in(client, page, operator, PASSWORD).status_code == 302, "one failure: still admitted"
    assert WRONG[page] in sign_in(Client(), page, operator, "wrong").content.decode(), "the success cleared it"
    assert sign_in(Client(), page, operator, "wrong").status_code == 429
    refused = sign_in(Client(), page, operator, PASSWORD)
    assert refused.status_code == 429 and locked(operator, 2, "1 minute") in refused.content.decode()
    # A refused attempt counts as no failure, so trying until admitted does not hold the lock.
    eventually(lambda: sign_in(Client(), page, operator, PASSWORD).status_code == 302, timeout=60)


def test_an_operator_unlocks_an_account_with_axes_reset_username(operator):
    fail_until_locked("/accounts/login/", operator)
    out = io.StringIO()
    call_command("axes_reset_username", operator, stdout=out)
    assert out.getvalue() == "1 attempts removed.\n"
    assert sign_in(Client(), "/accounts/login/", operator, PASSWORD).status_code == 302


def test_failures_without_a_username_such_as_the_idps_callback_are_not_counted(db):
    """The IdP's callback authenticates with a code, no username: counted, five of them would lock everyone at
    that address (a whole office behind one proxy) out of signing in with the IdP."""
    address = "192.0.2.7"
    for _ in range(6):
        request = RequestFactory().get("/oidc/callback/", REMOTE_ADDR=address)
        assert authenticate(request, nonce="n", code_verifier="v") is None
        assert not request.axes_locked_out
    assert not AccessAttempt.objects.filter(ip_address=address).exists()


def test_a_lock_holds_in_every_web_process(operator, inline_gateway):
    fail_until_locked("/accounts/login/", operator)  # in this process
    with httpx2.Client(base_url=inline_gateway.url) as http:  # a Daphne gateway: another process
        for page in PAGES:
            refused = http_sign_in(http, page, operator, PASSWORD)
            assert refused.status_code == 429 and locked(operator) in refused.text
            assert "sessionid" not in refused.cookies


def http_sign_in(http: httpx2.Client, page: str, username: str, password: str) -> httpx2.Response:
    form = http.get(page)
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text).group(1)
    data = {"username": username, "password": password, "csrfmiddlewaretoken": token}
    return http.post(page, data=data | {"next": "/admin/" if page == "/admin/login/" else AUTHORIZE})


@pytest.fixture(scope="module")
def short_lock_gateway(server_env, world, logs) -> Iterator[servers.Running]:
    """A gateway that locks after two failures, for ten seconds: long enough for the test's steps on a loaded machine
    (at three, the lock had ended before the right password was refused, on 2026-11-27)."""
    settings = {"GATEWAY_SIGN_IN_MAX_FAILURES": "2", "GATEWAY_SIGN_IN_WINDOW_SECONDS": "10"}
    with servers.inline_gateway_with(server_env, logs / "gateway-short-lock.log", **settings) as running:
        yield running


def test_a_gateways_sign_in_settings_set_its_limit_and_window(operator, short_lock_gateway):
    mark = audit_mark()
    page = "/accounts/login/"
    with httpx2.Client(base_url=short_lock_gateway.url) as http:
        assert WRONG[page] in http_sign_in(http, page, operator, BAD_PASSWORD).text
        locking = http_sign_in(http, page, operator, BAD_PASSWORD)
        assert locking.status_code == 429 and locked(operator, 2, "1 minute") in locking.text
        assert locking.headers["retry-after"] == "10", "the window: a refused attempt does not extend it"
        assert http_sign_in(http, page, operator, PASSWORD).status_code == 429
        eventually(lambda: http_sign_in(http, page, operator, PASSWORD).status_code == 302, timeout=60)
    detail = {"action": "sign_in_locked", "address": "127.0.0.1", "failures": 2, "known_user": True, "page": page}
    assert [(r.kind, r.actor, r.detail) for r in sign_in_rows(mark)] == [("sign_in", operator, detail)]
    log = short_lock_gateway.log.read_text()
    assert "sign-in locked" in log and BAD_PASSWORD not in log and PASSWORD not in log
