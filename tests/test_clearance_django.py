"""`ClearanceMiddleware`: the same guard for a specialist written as a Django project."""

import anyio
import pytest
from django.test import AsyncClient

from gateway_project.lib.signing import KeyRing, token_mint

KEYS = "k1:" + "s" * 40


@pytest.fixture
def guarded(settings):
    settings.MIDDLEWARE = ["handoff.clearance.ClearanceMiddleware"]
    settings.ROOT_URLCONF = "tests.support.clearance_urls"
    settings.SWITCHBOARD_CLEARANCE = {"keys": KEYS, "audience": "hr"}
    return AsyncClient()


def test_a_django_specialist_sees_the_clearance_of_a_valid_token(guarded):
    claims = {"iss": "switchboard", "sub": "hr", "aud": "hr", "tid": "d" * 32, "reason": "leave", "state": [1, 2]}
    token = token_mint(KeyRing.parse(KEYS), claims)
    traceparent = "00-" + "a" * 32 + "-" + "b" * 16 + "-01"
    response = anyio.run(
        lambda: guarded.get("/whoami", headers={"x-switchboard-delegation": token, "traceparent": traceparent})
    )
    assert response.status_code == 200
    assert response.json() == {
        "token_id": "d" * 32,
        "domain": "hr",
        "issuer": "switchboard",
        "reason": "leave",
        "state": [1, 2],
        "traceparent": traceparent,
    }


def test_a_django_specialist_refuses_a_request_without_a_valid_token(guarded):
    foreign = token_mint(KeyRing.parse("k1:" + "x" * 40), {"aud": "hr", "tid": "e" * 32})
    missing = anyio.run(lambda: guarded.get("/whoami"))
    forged = anyio.run(lambda: guarded.get("/whoami", headers={"x-switchboard-delegation": foreign}))
    assert (missing.status_code, missing["x-switchboard-error"]) == (401, "MISSING_DELEGATION_TOKEN")
    assert missing.json()["error"]["message"] == "This server only answers requests from the gateway."
    assert (forged.status_code, forged["x-switchboard-error"]) == (401, "INVALID_DELEGATION_TOKEN")
    assert forged["www-authenticate"] == 'Bearer error="invalid_token"'
