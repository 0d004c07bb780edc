"""The service registry's HTTP API switches upstreams and groups at once, through the audited services, for
an operator authenticated with HTTP Basic who holds the permission."""

from django.contrib.auth import get_user_model
from mcp.shared.exceptions import MCPError

from policy.models import ServerGroup
from registry.models import Upstream
from tests.clients import api, call
from tests.helpers import audit_mark, audit_since, eventually, run


def echo_refusal(gateway, key: str) -> str | None:
    result = run(lambda: call(gateway.url, key, "demo__echo", {"text": "x"}))
    return result.data["code"] if isinstance(result, MCPError) else None


def test_an_operator_switches_an_upstream_off_and_on_and_the_gateway_follows(inline_gateway, world, admin_client):
    mark = audit_mark()
    off = api(inline_gateway, "POST", "upstreams/demo/enabled", json={"enabled": False})
    try:
        assert (off.status_code, off.json()) == (200, {"enabled": False})
        assert eventually(lambda: echo_refusal(inline_gateway, world.key)) == "UPSTREAM_DISABLED"
        listing = api(inline_gateway, "GET", "upstreams").json()["upstreams"]
        circuit = {"state": "closed", "failures": 0, "retry_after": 0.0}
        assert {"slug": "demo", "transport": "stdio", "group": None, "enabled": False, "reachable": False,
                "circuit": circuit} in listing  # fmt: skip
    finally:
        on = api(inline_gateway, "POST", "upstreams/demo/enabled", json={"enabled": True})
    assert on.status_code == 200 and Upstream.objects.get(slug="demo").enabled
    actions = [(r.actor, r.detail["action"]) for r in audit_since(mark) if r.kind == "admin_change"]
    assert actions == [("operator", "upstream_disabled"), ("operator", "upstream_enabled")]


def test_an_operator_switches_a_server_group(inline_gateway, world, admin_client):
    group = ServerGroup.objects.create(name="batch-jobs")
    try:
        response = api(inline_gateway, "POST", "groups/batch-jobs/enabled", json={"enabled": False})
        assert response.status_code == 200 and not ServerGroup.objects.get(pk=group.pk).enabled
    finally:
        group.delete()


def test_the_api_refuses_strangers_users_without_permission_and_bad_requests(inline_gateway, world, admin_client):
    clerk = get_user_model().objects.create_user("clerk", password="clerk-pw-for-tests")
    try:
        anonymous = api(inline_gateway, "GET", "upstreams", auth=None)
        wrong = api(inline_gateway, "GET", "upstreams", auth=("operator", "not-the-password"))
        unprivileged = api(
            inline_gateway,
            "POST",
            "upstreams/demo/enabled",
            auth=("clerk", "clerk-pw-for-tests"),
            json={"enabled": False},
        )
        bad_body = api(inline_gateway, "POST", "upstreams/demo/enabled", json={"enabled": "no"})
        unknown = api(inline_gateway, "POST", "upstreams/nowhere/enabled", json={"enabled": False})
        # What a cross-site form could send, with credentials the browser remembered.
        form = api(inline_gateway, "POST", "upstreams/demo/enabled", content=b'{"enabled": false}',
                   headers={"content-type": "text/plain"})  # fmt: skip
    finally:
        clerk.delete()
    assert (anonymous.status_code, anonymous.headers["www-authenticate"]) == (401, 'Basic realm="switchboard"')
    assert wrong.status_code == 401
    assert (unprivileged.status_code, unprivileged.json()) == (
        403, {"error": "This user lacks the permission registry.change_upstream."}
    )  # fmt: skip
    assert (bad_body.status_code, bad_body.json()) == (400, {"error": 'Send a JSON object such as {"enabled": false}.'})
    assert (unknown.status_code, unknown.json()) == (404, {"error": "No such upstream or group."})
    assert (form.status_code, form.json()) == (415, {"error": "Send Content-Type: application/json."})
    assert Upstream.objects.get(slug="demo").enabled
