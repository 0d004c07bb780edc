"""Console sign-in is throttled per username and client address: after GATEWAY_SIGN_IN_MAX_FAILURES the pair
is refused even with the right password, in every web process, until its window ends; other operators
from the same address sign in meanwhile."""

import os
import re
import uuid
from collections.abc import Iterator

import httpx2
import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from tests.conftest import needs
from tests.helpers import audit_mark, audit_since, eventually

PASSWORD = "right-password-for-tests"
WRONG = "Please enter the correct username and password for a staff account."
LOCKED = (
    "Too many failed sign-ins for this account from your address. Try again in 15 minutes, or ask another "
    "administrator to reset your password."
)


@pytest.fixture
def operator(db) -> Iterator[str]:
    user = get_user_model().objects.create_superuser(f"op-{uuid.uuid4().hex[:8]}", password=PASSWORD)
    yield user.username
    user.delete()


def sign_in(client: Client, username: str, password: str):
    return client.post("/admin/login/", {"username": username, "password": password, "next": "/admin/"})


def fail_until_locked(username: str) -> None:
    client = Client()
    for _ in range(5):
        response = sign_in(client, username, "not-the-password")
        assert response.status_code == 200 and WRONG in response.content.decode()


def test_after_five_failures_even_the_right_password_is_refused(operator, db):
    mark = audit_mark()
    fail_until_locked(operator)
    fail_until_locked(f"nobody-{uuid.uuid4().hex[:8]}")  # fresh: Redis keeps a lock for 15 minutes across runs
    assert [(r.kind, r.actor, r.detail) for r in audit_since(mark)] == [
        ("sign_in", operator, {"action": "sign_in_locked", "address": "127.0.0.1", "failures": 5, "known_user": True}),
        ("sign_in", "", {"action": "sign_in_locked", "address": "127.0.0.1", "failures": 5, "known_user": False}),
    ], "one row per lock, naming only real accounts"
    client = Client()
    refused = sign_in(client, operator, PASSWORD)
    assert refused.status_code == 200 and LOCKED in refused.content.decode()
    assert "_auth_user_id" not in client.session
    other = get_user_model().objects.create_superuser(f"op-{uuid.uuid4().hex[:8]}", password=PASSWORD)
    try:
        assert sign_in(Client(), other.username, PASSWORD).status_code == 302, "another operator is unaffected"
    finally:
        other.delete()


def test_the_lock_lifts_when_its_window_ends_and_a_success_clears_the_count(operator, settings):
    settings.GATEWAY_SIGN_IN_WINDOW_SECONDS = 2
    settings.GATEWAY_SIGN_IN_MAX_FAILURES = 2
    client = Client()
    assert WRONG in sign_in(client, operator, "wrong").content.decode()
    assert sign_in(client, operator, PASSWORD).status_code == 302, "one failure: still admitted"
    for _ in range(2):  # the success cleared the first failure, so two more are needed to lock
        assert WRONG in sign_in(Client(), operator, "wrong").content.decode()
    locked = sign_in(Client(), operator, PASSWORD).content.decode()
    assert "Too many failed sign-ins for this account from your address. Try again in 1 minute, or" in locked
    # A locked attempt counts as no failure, so trying until admitted does not hold the lock.
    eventually(lambda: sign_in(Client(), operator, PASSWORD).status_code == 302)


def test_a_lock_holds_in_every_web_process(operator, inline_gateway):
    needs(bool(os.environ.get("REDIS_URL")), "REDIS_URL is not set: the count is per process")
    fail_until_locked(operator)  # in this process
    with httpx2.Client(base_url=inline_gateway.url) as http:  # a Daphne gateway: another process
        form = http.get("/admin/login/")
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text).group(1)
        data = {"username": operator, "password": PASSWORD, "csrfmiddlewaretoken": token, "next": "/admin/"}
        refused = http.post("/admin/login/", data=data)
    assert refused.status_code == 200 and LOCKED in refused.text
    assert "sessionid" not in refused.cookies
