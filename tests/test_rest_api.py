"""The REST API: admin tokens only, the user's model permissions decide, every write goes through the
admin's services (so the same audit rows), secrets are write-only, and the OpenAPI schema describes it."""

import uuid

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from mcp.shared.exceptions import MCPError

from policy.models import Agent, Rule, ServerGroup, Team, TeamMember
from policy.services import admin_token_issue, admin_token_revoke
from registry.models import Tool, Upstream
from tests.clients import api, call, tool_names
from tests.factories import demo_upstream
from tests.helpers import audit_mark, audit_since, eventually, run, schema_validator


def echo_refusal(gateway, key: str) -> str | None:
    result = run(lambda: call(gateway.url, key, "demo__echo", {"text": "x"}))
    return result.data["code"] if isinstance(result, MCPError) else None


def test_an_operator_switches_an_upstream_off_and_on_and_the_gateway_follows(inline_gateway, world, admin_token):
    mark = audit_mark()
    off = api(inline_gateway, "POST", "upstreams/demo/enabled", admin_token, json={"enabled": False})
    try:
        assert (off.status_code, off.json()) == (200, {"enabled": False})
        assert eventually(lambda: echo_refusal(inline_gateway, world.key)) == "UPSTREAM_DISABLED"
        demo = api(inline_gateway, "GET", "upstreams/demo", admin_token).json()
        assert (demo["enabled"], demo["reachable"], demo["circuit"]) == (
            False, False, {"state": "closed", "failures": 0, "retry_after": 0.0}
        )  # fmt: skip
    finally:
        on = api(inline_gateway, "POST", "upstreams/demo/enabled", admin_token, json={"enabled": True})
    assert on.status_code == 200 and Upstream.objects.get(slug="demo").enabled
    actions = [(r.actor, r.detail["action"]) for r in audit_since(mark) if r.kind == "admin_change"]
    assert actions == [("operator", "upstream_disabled"), ("operator", "upstream_enabled")]


def test_upstreams_are_created_changed_and_deleted_with_credentials_write_only(inline_gateway, world, admin_token):
    body = {"slug": "restful", "transport": "stdio", "command": "python3", "args": ["x.py"], "env": {"TOKEN": "s3cret"}}
    mark = audit_mark()
    created = api(inline_gateway, "POST", "upstreams", admin_token, json=body)
    try:
        assert created.status_code == 201, created.text
        assert created.json()["env"] == {"TOKEN": "********"} and "s3cret" not in created.text
        kept = api(inline_gateway, "PATCH", "upstreams/restful", admin_token, json={"env": {"TOKEN": "********"}})
        unknown = api(inline_gateway, "PATCH", "upstreams/restful", admin_token, json={"env": {"NEW": "********"}})
        invalid = api(inline_gateway, "PATCH", "upstreams/restful", admin_token, json={"command": ""})
        assert kept.status_code == 200
        assert (unknown.status_code, unknown.json()) == (400, {"env": ["Send a value for NEW: none is stored yet."]})
        assert (invalid.status_code, invalid.json()) == (400, {"command": ["A stdio upstream needs a command."]})
    finally:
        deleted = api(inline_gateway, "DELETE", "upstreams/restful", admin_token)
    assert deleted.status_code == 204 and not Upstream.objects.filter(slug="restful").exists()
    rows = [r for r in audit_since(mark) if r.kind == "admin_change" and r.upstream == "restful"]
    assert [r.detail["action"] for r in rows] == ["upstream_created", "upstream_saved", "upstream_deleted"]
    assert all("s3cret" not in str(r.detail) for r in rows)


def test_agents_groups_and_rules_through_the_api(inline_gateway, world, admin_token):
    mark = audit_mark()
    made = api(inline_gateway, "POST", "agents", admin_token, json={"name": "api-bot", "calls_per_minute": 5})
    key = made.json()["key"]
    group = api(inline_gateway, "POST", "groups", admin_token, json={"name": "api-group", "isolation": "strict"})
    rule = api(inline_gateway, "POST", "rules", admin_token,
               json={"effect": "deny", "agent": "api-bot", "upstream": "demo", "tool_pattern": "echo"})  # fmt: skip
    try:
        assert (made.status_code, made.json()["calls_per_minute"], group.status_code) == (201, 5, 201)
        assert rule.status_code == 201, rule.text
        names = eventually(lambda: (n := run(lambda: tool_names(inline_gateway.url, key))) and n)
        assert "demo__add" in names and "demo__echo" not in names
        second = api(inline_gateway, "POST", "agents/api-bot/keys", admin_token, json={"label": "ci"})
        prefix = second.json()["key"].split("_")[1]
        revoked = api(inline_gateway, "DELETE", f"agents/api-bot/keys/{prefix}", admin_token)
        assert (second.status_code, revoked.status_code) == (201, 204)
    finally:
        for path in (f"rules/{rule.json().get('id')}", "groups/api-group", "agents/api-bot"):
            api(inline_gateway, "DELETE", path, admin_token)
    assert not Agent.objects.filter(name="api-bot").exists() and not ServerGroup.objects.filter(name="api-group")
    assert not Rule.objects.filter(tool_pattern="echo", agent__name="api-bot").exists()
    actions = [r.detail["action"] for r in audit_since(mark) if r.kind == "admin_change" and r.actor == "operator"]
    assert actions == ["agent_created", "agent_key_issued", "agent_saved", "servergroup_created", "rule_created",
                       "agent_key_issued", "agent_key_revoked", "rule_deleted", "servergroup_deleted",
                       "agent_deleted"]  # fmt: skip


def _operator(name: str, team: Team, role: str, *codenames: str) -> tuple[object, str]:
    """A console account with `role` in `team` and these model permissions, and an admin token of its."""
    user = get_user_model().objects.create_user(name, password=f"{name}-pw-for-tests")
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    TeamMember.objects.create(user=user, team=team, role=role)
    return user, admin_token_issue(user=user, actor="tests")


AGENT_RIGHTS = ("view_agent", "add_agent", "change_agent", "delete_agent")


def test_a_team_admin_sees_and_changes_only_its_teams_objects_through_the_api(inline_gateway, world, admin_token):
    payments, default = Team.objects.create(slug="payments", name="Payments"), Team.objects.get(slug="default")
    pam, pam_token = _operator("pam", payments, "admin", *AGENT_RIGHTS, "view_upstream", "view_rule", "add_rule")
    dee, dee_token = _operator("dee", default, "admin", *AGENT_RIGHTS)
    try:
        made = api(inline_gateway, "POST", "agents", admin_token, json={"name": "api-payer", "team": "payments"})
        own = api(inline_gateway, "POST", "agents", pam_token, json={"name": "api-pam-bot"})  # her only team
        listed = {a["name"] for a in api(inline_gateway, "GET", "agents", pam_token).json()}
        upstreams = api(inline_gateway, "GET", "upstreams", pam_token).json()
        foreign = {
            "read": api(inline_gateway, "GET", "agents/api-payer", dee_token),
            "change": api(inline_gateway, "PATCH", "agents/api-payer", dee_token, json={"calls_per_minute": 1}),
            "switch": api(inline_gateway, "POST", "agents/api-payer/enabled", dee_token, json={"enabled": False}),
            "key": api(inline_gateway, "POST", "agents/api-payer/keys", dee_token, json={}),
            "delete": api(inline_gateway, "DELETE", "agents/api-payer", dee_token),
            "explain": api(inline_gateway, "GET", "agents/alice/explain", pam_token, params={"tool": "demo__echo"}),
        }
        into = api(inline_gateway, "POST", "agents", dee_token, json={"name": "api-sneak", "team": "payments"})
        moved = api(inline_gateway, "PATCH", "agents/alice", dee_token, json={"team": "payments"})
        rule = api(inline_gateway, "POST", "rules", pam_token, json={"effect": "allow", "agent": "alice"})
    finally:
        for name in ("api-payer", "api-pam-bot", "api-sneak"):
            Agent.objects.filter(name=name).delete()
        pam.delete()
        dee.delete()
        payments.delete()
    assert (made.status_code, made.json()["team"]) == (201, "payments")  # a gateway admin makes it anywhere
    assert (own.status_code, own.json()["team"]) == (201, "payments")
    assert listed == {"api-payer", "api-pam-bot"} and upstreams == []
    assert {action: reply.status_code for action, reply in foreign.items()} == dict.fromkeys(foreign, 404)
    message = "You are not an admin of team 'payments': you make and change only your teams' objects."
    assert (into.status_code, into.json()) == (403, {"detail": message})
    assert (moved.status_code, moved.json()) == (403, {"detail": message})
    assert (rule.status_code, rule.json()) == (400, {"agent": ["Object with name=alice does not exist."]})


def test_a_borrower_calls_a_shared_upstream_under_its_own_rules_and_cannot_change_it(inline_gateway, world):
    borrow = Team.objects.create(slug="borrow", name="Borrow")
    demo = Upstream.objects.get(slug="demo")
    demo.shared_with.add(borrow)  # the share goes with the team
    rights = ("view_upstream", "add_upstream", "change_upstream", "delete_upstream", "add_rule", "view_rule")
    bea, token = _operator("bea", borrow, "admin", *rights)
    try:
        changes = {
            "read": api(inline_gateway, "GET", "upstreams/demo", token),
            "change": api(inline_gateway, "PATCH", "upstreams/demo", token, json={"call_timeout": 1}),
            "switch": api(inline_gateway, "POST", "upstreams/demo/enabled", token, json={"enabled": False}),
            "sync": api(inline_gateway, "POST", "upstreams/demo/sync", token),
            "delete": api(inline_gateway, "DELETE", "upstreams/demo", token),
        }
        rule = api(inline_gateway, "POST", "rules", token, json={"effect": "allow", "upstream": "demo", "note": "x"})
        kept = Upstream.objects.get(slug="demo")
    finally:
        Rule.objects.filter(team=borrow).delete()
        bea.delete()
        borrow.delete()
    assert {action: reply.status_code for action, reply in changes.items()} == dict.fromkeys(changes, 404)
    assert (kept.enabled, kept.call_timeout) == (demo.enabled, demo.call_timeout)
    assert (rule.status_code, rule.json()["team"], rule.json()["upstream"]) == (201, "borrow", "demo")


def test_an_auditor_reads_only_its_teams_audit_rows_through_the_api(inline_gateway, world, admin_token):
    from audit.services import audit_record

    payments = Team.objects.create(slug="payments", name="Payments")
    aud, aud_token = _operator("aud", payments, "auditor", "view_auditevent")
    tool = f"teams-{uuid.uuid4().hex[:8]}"
    theirs = audit_record(kind="completed", tool=tool, outcome="ok", team="payments")
    others = audit_record(kind="completed", tool=tool, outcome="ok", team="default")
    try:
        page = api(inline_gateway, "GET", "audit", aud_token, params={"tool": tool}).json()
        everyone = api(inline_gateway, "GET", "audit", admin_token, params={"tool": tool}).json()
        by_id = api(inline_gateway, "GET", f"audit/{others.id}", aud_token)
        own = api(inline_gateway, "GET", f"audit/{theirs.id}", aud_token)
    finally:
        aud.delete()
        payments.delete()
    assert [row["id"] for row in page["results"]] == [theirs.id]
    assert [row["id"] for row in everyone["results"]] == [others.id, theirs.id]
    assert (by_id.status_code, own.status_code) == (404, 200)


def test_the_audit_feed_pages_by_keyset_and_filters(inline_gateway, admin_token):
    from audit.services import audit_record

    tool = f"feed-{uuid.uuid4().hex[:8]}"
    ids = [audit_record(kind="completed", tool=tool, outcome="ok").id for _ in range(3)]
    first = api(inline_gateway, "GET", "audit", admin_token, params={"tool": tool, "limit": 2}).json()
    rest = api(inline_gateway, "GET", "audit", admin_token,
               params={"tool": tool, "limit": 2, "before": first["next_before"]}).json()  # fmt: skip
    assert [r["id"] for r in first["results"]] == ids[:0:-1] and [r["id"] for r in rest["results"]] == ids[:1]
    assert rest["next_before"] is None
    bad = api(inline_gateway, "GET", "audit", admin_token, params={"trace_id": "x"})
    assert (bad.status_code, bad.json()) == (400, {"trace_id": ["32 hex digits"]})
    greedy = api(inline_gateway, "GET", "audit", admin_token, params={"limit": "all"})
    assert (greedy.status_code, greedy.json()) == (400, {"limit": ["A valid integer is required."]})
    assert api(inline_gateway, "POST", "audit", admin_token, json={}).status_code == 405


def test_the_api_refuses_strangers_revoked_tokens_and_users_without_permission(inline_gateway, admin_token):
    clerk = get_user_model().objects.create_user("clerk", password="clerk-pw-for-tests")
    clerk_token = admin_token_issue(user=clerk, actor="tests")
    try:
        anonymous = api(inline_gateway, "GET", "upstreams", None)
        forged = api(inline_gateway, "GET", "upstreams", admin_token[:-4] + "AAAA")
        blind = api(inline_gateway, "GET", "upstreams", clerk_token)
        clerk.user_permissions.add(Permission.objects.get(codename="view_upstream"))
        reader = api(inline_gateway, "GET", "upstreams", clerk_token)
        writer = api(inline_gateway, "POST", "upstreams/demo/enabled", clerk_token, json={"enabled": False})
        bad_body = api(inline_gateway, "POST", "upstreams/demo/enabled", admin_token, json={"enabled": "perhaps"})
        form = api(inline_gateway, "POST", "upstreams/demo/enabled", admin_token, content=b"enabled=false",
                   headers={"content-type": "application/x-www-form-urlencoded"})  # fmt: skip
        admin_token_revoke(token=clerk.admin_tokens.get(), actor="tests")
        revoked = api(inline_gateway, "GET", "upstreams", clerk_token)
    finally:
        clerk.delete()
    assert (anonymous.status_code, anonymous.headers["www-authenticate"]) == (401, 'Bearer realm="switchboard-admin"')
    assert (forged.status_code, forged.json()) == (401, {"detail": "Invalid or revoked admin token."})
    assert blind.status_code == 403 and reader.status_code == 200 and writer.status_code == 403
    assert (bad_body.status_code, bad_body.json()) == (400, {"enabled": ["Must be a valid boolean."]})
    assert form.status_code == 415 and revoked.status_code == 401
    assert Upstream.objects.get(slug="demo").enabled


def test_the_openapi_schema_describes_every_resource_and_the_token_scheme(inline_gateway, admin_token):
    schema = api(inline_gateway, "GET", "schema", admin_token, params={"format": "json"}).json()
    assert {"/api/v1/upstreams", "/api/v1/groups", "/api/v1/agents", "/api/v1/rules", "/api/v1/audit"} <= set(
        schema["paths"]
    )
    assert schema["components"]["securitySchemes"]["adminToken"] == {
        "type": "http", "scheme": "bearer", "description": "An admin token, sba_<prefix>_<secret>"
    }  # fmt: skip
    assert "post" not in schema["paths"]["/api/v1/audit"]


def test_the_schema_is_served_without_a_token_and_the_audit_feed_answers_as_it_says(inline_gateway, admin_token):
    from audit.services import audit_record

    served = api(inline_gateway, "GET", "schema", None, params={"format": "json"})
    assert served.status_code == 200, "no token needed: it holds nothing secret"
    schema = served.json()
    tool = f"schema-{uuid.uuid4().hex[:8]}"
    for _ in range(2):
        audit_record(kind="completed", tool=tool, outcome="ok")
    page = api(inline_gateway, "GET", "audit", admin_token, params={"tool": tool, "limit": 1}).json()
    bad = api(inline_gateway, "GET", "audit", admin_token, params={"trace_id": "x"}).json()
    missing = api(inline_gateway, "GET", "agents/nobody-by-this-name", admin_token).json()
    schema_validator(schema, "/api/v1/audit", "get", "200").validate(page)
    schema_validator(schema, "/api/v1/audit", "get", "400").validate(bad)
    schema_validator(schema, "/api/v1/agents/{name}", "get", "404").validate(missing)
    assert page["next_before"] is not None, "a page of an envelope, not a bare array"
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            assert {"400", "401", "403", "404", "429"} <= set(operation["responses"]), (method, path)
            assert "Retry-After" in operation["responses"]["429"]["headers"]
    parameters = {p["name"] for p in schema["paths"]["/api/v1/audit"]["get"]["parameters"]}
    assert {"since", "until", "kind", "agent", "tool", "outcome", "before", "limit", "trace_id"} <= parameters


def test_the_api_syncs_an_upstream_and_approves_a_held_tool(inline_gateway, world, admin_token):
    with demo_upstream("catalog") as upstream:
        synced = api(inline_gateway, "POST", "upstreams/catalog/sync", admin_token)
        echo = Tool.objects.get(upstream=upstream, name="echo")
        Tool.objects.filter(pk=echo.pk).update(approved_sha256="0" * 64)  # as if its definition had changed
        held = api(inline_gateway, "GET", "tools", admin_token, params={"upstream": "catalog", "pending": "true"})
        mark = audit_mark()
        approved = api(inline_gateway, "POST", f"tools/{echo.pk}/approve", admin_token)
        after = api(inline_gateway, "GET", "tools", admin_token, params={"upstream": "catalog", "pending": "true"})
        missing = api(inline_gateway, "POST", "upstreams/nothing-here/sync", admin_token)
    assert synced.status_code == 200
    assert synced.json() | {"added": [], "held": []} == {
        "upstream": "catalog", "ok": True, "added": [], "changed": [], "removed": [], "held": [], "rejected": [],
        "error": "", "summary": "catalog: 0 added, 0 changed, 0 removed, 0 rejected",
    }  # fmt: skip
    assert [(t["name"], t["upstream"], t["approved"]) for t in held.json()] == [("echo", "catalog", False)]
    assert (approved.status_code, approved.json()["approved"]) == (200, True)
    assert after.json() == []
    assert [(r.actor, r.detail["action"], r.tool) for r in audit_since(mark)] == [("operator", "tool_approved", "echo")]
    assert (missing.status_code, missing.json()) == (404, {"detail": "No Upstream matches the given query."})


def test_handoff_routes_are_managed_through_the_api(inline_gateway, world, admin_token):
    body = {"domain": "legal", "description": "Contracts and their clauses", "target": "demo", "max_sessions": 3}
    mark = audit_mark()
    created = api(inline_gateway, "POST", "handoff-routes", admin_token, json=body)
    try:
        changed = api(inline_gateway, "PATCH", "handoff-routes/legal", admin_token, json={"enabled": False})
        unknown = api(
            inline_gateway, "POST", "handoff-routes", admin_token, json=body | {"domain": "x", "target": "nope"}
        )
    finally:
        deleted = api(inline_gateway, "DELETE", "handoff-routes/legal", admin_token)
    assert created.status_code == 201 and created.json()["target"] == "demo"
    assert (changed.status_code, changed.json()["enabled"]) == (200, False)
    assert (unknown.status_code, unknown.json()) == (400, {"target": ["Object with slug=nope does not exist."]})
    assert deleted.status_code == 204
    actions = [r.detail["action"] for r in audit_since(mark) if r.kind == "admin_change"]
    assert actions == ["handoffroute_created", "handoffroute_saved", "handoffroute_deleted"]


def test_a_name_holding_a_nul_or_an_unbounded_timeout_is_refused_not_a_server_error(inline_gateway, world, admin_token):
    """Found by the REST API's fuzzing (tests/fuzz/test_rest_api_schema.py): a NUL in a name looked up by the
    database was a 500, and a route's connect timeout had no upper bound."""
    body = {"domain": "nul", "description": "d", "target": "de\x00mo"}
    named = api(inline_gateway, "POST", "handoff-routes", admin_token, json=body)
    rule = api(inline_gateway, "POST", "rules", admin_token, json={"effect": "allow", "agent": "al\x00ice"})
    endless = api(
        inline_gateway, "POST", "handoff-routes", admin_token, json=body | {"target": "demo", "connect_timeout": 1e308}
    )
    assert (named.status_code, named.json()) == (400, {"target": ["Object with slug=de\\x00mo does not exist."]})
    assert (rule.status_code, rule.json()) == (400, {"agent": ["Object with name=al\\x00ice does not exist."]})
    assert endless.status_code == 400
    assert endless.json() == {"connect_timeout": ["Ensure this value is less than or equal to 300.0."]}


def test_approving_a_tool_needs_the_permission_to_change_tools(inline_gateway, world, admin_token):
    clerk = get_user_model().objects.create_user("reader", password="reader-pw-for-tests")
    clerk.user_permissions.add(Permission.objects.get(codename="view_tool"))
    TeamMember.objects.create(user=clerk, team=Team.objects.get(slug="default"), role="admin")
    token = admin_token_issue(user=clerk, actor="tests")
    try:
        echo = Tool.objects.get(upstream__slug="demo", name="echo")
        listed = api(inline_gateway, "GET", "tools", token, params={"upstream": "demo"})
        refused = api(inline_gateway, "POST", f"tools/{echo.pk}/approve", token)
    finally:
        clerk.delete()
    assert listed.status_code == 200 and "echo" in [t["name"] for t in listed.json()]
    assert (refused.status_code, refused.json()) == (
        403,
        {"detail": "Approving a tool needs the permission to change tools."},
    )


def test_a_team_named_with_a_nul_is_refused_as_unknown_not_a_server_error(inline_gateway, admin_token):
    """The fuzzer's case: PostgreSQL text holds no NUL, so such a name is a 400, never a failed lookup."""
    sent = {"team": ">E\x005", "prefix": "aei-8", "upstream": "demo"}
    answer = api(inline_gateway, "POST", "local-prefixes", admin_token, json=sent)
    assert answer.status_code == 400, answer.text
    assert answer.json()["team"] == ["Object with slug=>E\\x005 does not exist."]
