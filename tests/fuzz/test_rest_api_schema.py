"""The REST API under schemathesis: requests generated from its own OpenAPI schema (/api/v1/schema), valid ones
and invalid ones, against a real gateway with an admin token. No request may get a 5xx or go unanswered.

The gateway and the database are the other tests' too, so what the run may touch is fenced: a write names an
object that does not exist (its path parameters are moved out of the way, so it is a 404, a 400 or a 405),
a new upstream's command or URL reaches nothing, and every row the run created is deleted after it."""

from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode

from handoff.models import HandoffRoute
from policy.models import AdminToken, Agent, Rule, ServerGroup
from registry.models import Upstream
from tests.fuzz.conftest import EXAMPLES

EXAMPLES_PER_OPERATION = EXAMPLES or 12
TIMEOUT = 20  # seconds for one request: anything slower is a hang
WRITES = {"POST", "PUT", "PATCH", "DELETE"}
CREATED = [Rule, HandoffRoute, Upstream, ServerGroup, Agent, AdminToken]  # the order they can be deleted in


@pytest.fixture
def fenced(db) -> Any:
    """Deletes every row of CREATED that the test made."""
    before = {model: set(model.objects.values_list("pk", flat=True)) for model in CREATED}
    yield
    for model in CREATED:
        model.objects.exclude(pk__in=before[model]).delete()


def fence(case: Any) -> None:
    """Keep a generated write away from the objects other tests use, and away from anything outside."""
    if case.method.upper() in WRITES and case.path_parameters:
        case.path_parameters = {
            name: value + 2**40
            if isinstance(value, int) and value >= 0
            else f"fuzz-{value}"
            if isinstance(value, str)
            else value
            for name, value in case.path_parameters.items()
        }
    if isinstance(case.body, dict) and case.path.endswith("/upstreams"):
        if isinstance(case.body.get("command"), str):
            case.body["command"] = "/nonexistent/fuzz-" + case.body["command"].replace("/", "_")
        for name in ("url", "openapi_url"):
            case.body[name] = nowhere(case.body.get(name))


def elsewhere(value: Any) -> Any:
    """A path parameter that names no existing object (ids are small, names are plain words)."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        return value
    return (
        value + 2**40 if isinstance(value, int) and value >= 0 else f"fuzz-{value}" if isinstance(value, str) else value
    )


def nowhere(url: Any) -> Any:
    """A URL at a port where nothing listens, when it is one; anything else as it was (it is input to check)."""
    if not isinstance(url, str):
        return url
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    return (
        urlunsplit(parts._replace(netloc="127.0.0.1:9")) if parts.scheme in ("http", "https") and parts.netloc else url
    )


def test_no_generated_request_gets_a_server_error(inline_gateway, admin_token, fenced):
    auth = {"Authorization": f"Bearer {admin_token}"}
    schema = schemathesis.openapi.from_url(f"{inline_gateway.url}/api/v1/schema", headers=auth, timeout=TIMEOUT)
    failures: list[str] = []
    sent = 0
    for result in schema.get_all_operations():
        operation = result.ok()
        cases = operation.as_strategy(GenerationMode.POSITIVE) | operation.as_strategy(GenerationMode.NEGATIVE)

        @settings(
            max_examples=EXAMPLES_PER_OPERATION,
            deadline=None,
            database=None,
            derandomize=not EXAMPLES,
            suppress_health_check=list(HealthCheck),
        )
        @given(cases)
        def exercise(case: Any) -> None:
            nonlocal sent
            fence(case)
            sent += 1
            try:
                response = case.call(base_url=inline_gateway.url, headers=auth, timeout=TIMEOUT)
            except requests.Timeout:
                failures.append(f"no answer in {TIMEOUT} s: {case.as_curl_command(headers=auth)}")
                return
            if response.status_code >= 500:
                failures.append(f"{response.status_code}: {case.as_curl_command(headers=auth)}\n{response.text[:500]}")

        exercise()
    print(f"schemathesis: {sent} requests over {len(list(schema.get_all_operations()))} operations")
    assert failures == [], "\n\n".join(failures[:20])
