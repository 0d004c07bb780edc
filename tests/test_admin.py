"""The admin: switches go through the services (and so the audit), keys are shown once, the trail is
read-only."""

import json
import os
import subprocess
import sys

import anyio
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group

from audit.models import AuditEvent
from policy.limits.stores import limit_store
from policy.models import Agent, AgentGroup, AgentKey, Rule, ServerGroup, default_team
from registry.credentials import credentials_open
from registry.models import Upstream
from registry.services import upstream_save
from tests import servers
from tests.conftest import BIN
from tests.factories import DEMO, admission, agent
from tests.helpers import audit_mark, audit_since


def test_disabling_an_upstream_from_the_admin_is_audited_with_the_operator(admin_client, world):
    demo = Upstream.objects.get(slug="demo")
    mark = audit_mark()
    response = admin_client.post("/admin/registry/upstream/", {"action": "disable", "_selected_action": [demo.pk]})
    try:
        assert response.status_code == 302
        assert not Upstream.objects.get(pk=demo.pk).enabled
        (row,) = [r for r in audit_since(mark) if r.kind == "admin_change"]
        assert (row.actor, row.upstream, row.detail["action"]) == ("operator", "demo", "upstream_disabled")
    finally:
        admin_client.post("/admin/registry/upstream/", {"action": "enable", "_selected_action": [demo.pk]})
    assert Upstream.objects.get(pk=demo.pk).enabled


def test_disabling_a_group_from_the_admin_goes_through_the_service(admin_client):
    group = ServerGroup.objects.create(name="finance")
    try:
        admin_client.post("/admin/policy/servergroup/", {"action": "disable", "_selected_action": [group.pk]})
        assert not ServerGroup.objects.get(pk=group.pk).enabled
        assert AuditEvent.objects.filter(actor="operator", detail__action="group_disabled").exists()
    finally:
        group.delete()


def test_a_new_agent_gets_a_key_shown_once_in_the_admin(admin_client):
    response = admin_client.post(
        "/admin/policy/agent/add/",
        {"name": "ci-bot", "team": default_team(), "enabled": "on", "keys-TOTAL_FORMS": "0", "keys-INITIAL_FORMS": "0"},
        follow=True,
    )
    try:
        shown = [str(m) for m in response.context["messages"] if "API key for ci-bot" in str(m)]
        assert len(shown) == 1
        key = shown[0].rsplit(" ", 1)[1]
        stored = AgentKey.objects.get(agent__name="ci-bot")
        assert key.startswith(f"sb_{stored.prefix}_") and key.split("_", 2)[2] not in stored.digest
        page = admin_client.get(f"/admin/policy/agent/{stored.agent_id}/change/").content.decode()
        assert key not in page and key.split("_", 2)[2] not in page
    finally:
        Agent.objects.filter(name="ci-bot").delete()


def test_the_audit_trail_cannot_be_added_changed_or_deleted_in_the_admin(admin_client, world):
    row = AuditEvent.objects.order_by("-id").first()
    assert admin_client.get("/admin/audit/auditevent/").status_code == 200
    assert admin_client.get("/admin/audit/auditevent/add/").status_code == 403
    assert admin_client.get(f"/admin/audit/auditevent/{row.pk}/delete/").status_code == 403
    admin_client.post(f"/admin/audit/auditevent/{row.pk}/change/", {"kind": "denied"})
    assert AuditEvent.objects.get(pk=row.pk).kind == row.kind


def test_the_audit_list_says_what_an_admin_change_did_and_the_root_leads_to_the_console(admin_client, world):
    page = admin_client.get("/admin/audit/auditevent/?kind=admin_change").content.decode()
    assert "agent_key_issued" in page
    assert admin_client.get("/").headers["location"] == "/admin/"


def _upstream_form(upstream: Upstream, **changes: str) -> dict[str, str]:
    data = {
        "slug": upstream.slug,
        "team": upstream.team_id or default_team(),
        "name": upstream.name,
        "transport": upstream.transport,
        "command": upstream.command,
        "args": json.dumps(upstream.args),
        "cwd": upstream.cwd,
        "url": upstream.url,
        "timeout": str(upstream.timeout),
        "enabled": "on",
        "group": "",
        "new_tools": upstream.new_tools,
        "person_connect": upstream.person_connect,
        "person_slot": upstream.person_slot,
        "person_client": "{}",
        "tools-TOTAL_FORMS": "0",
        "tools-INITIAL_FORMS": "0",
    }
    return data | changes


def test_upstream_secrets_never_reach_the_browser_and_survive_an_edit(admin_client, db):
    upstream = Upstream(
        slug="vault", transport="stdio", command="true", env={"API_TOKEN": "s3cr3t-value", "REGION": "eu"}
    )
    upstream_save(upstream=upstream, created=True)
    try:
        page = admin_client.get(f"/admin/registry/upstream/{upstream.pk}/change/").content.decode()
        assert "s3cr3t-value" not in page and "API_TOKEN" in page
        # The form comes back with the mask for the token, a new region, and a new key.
        env = json.dumps({"API_TOKEN": "********", "REGION": "us", "DEBUG": "1"})
        response = admin_client.post(
            f"/admin/registry/upstream/{upstream.pk}/change/", _upstream_form(upstream, env=env, headers="{}")
        )
        assert response.status_code == 302, response.content.decode()[:2000]
        upstream.refresh_from_db()
        assert credentials_open(upstream.env) == {"API_TOKEN": "s3cr3t-value", "REGION": "us", "DEBUG": "1"}
        assert "s3cr3t-value" not in json.dumps(upstream.env)
        masked_new_key = json.dumps({"NEW_KEY": "********"})
        refused = admin_client.post(
            f"/admin/registry/upstream/{upstream.pk}/change/",
            _upstream_form(upstream, env=masked_new_key, headers="{}"),
        )
        assert "Enter a value for NEW_KEY: nothing is stored for it yet." in refused.content.decode()
        assert "s3cr3t-value" not in refused.content.decode()
    finally:
        upstream.delete()


def test_a_rule_added_in_the_admin_is_audited_with_the_operator_and_listed(admin_client, world):
    demo = Upstream.objects.get(slug="demo")
    mark = audit_mark()
    form = {"effect": "deny", "upstream": demo.pk, "tool_pattern": "crash", "enabled": "on", "note": "no crashes",
            "team": default_team()}  # fmt: skip
    response = admin_client.post("/admin/policy/rule/add/", form)
    rule = Rule.objects.get(note="no crashes")
    try:
        assert response.status_code == 302
        page = admin_client.get("/admin/policy/rule/").content.decode()
        assert "no crashes" in page and "crash" in page
        assert "A call that no enabled rule matches is\n<strong>allowed</strong>" in page
        [row] = [r for r in audit_since(mark) if r.kind == "admin_change"]
        after = row.detail["after"]
        assert (row.actor, row.detail["action"], after["upstream"], after["tool_pattern"], row.detail["before"]) == (
            "operator", "rule_created", "demo", "crash", None
        )  # fmt: skip
    finally:
        rule.delete()


def test_the_upstream_list_shows_an_open_circuit_and_an_operator_can_close_it(admin_client, world, settings):
    settings.GATEWAY_BREAKER_FIRST_OPEN_SECONDS = 60.0  # open long enough to be read
    upstream = Upstream(slug="tripped", transport="stdio", command="true")
    upstream_save(upstream=upstream, created=True)
    store = limit_store()
    tripped = admission(id=upstream.id, slug=upstream.slug, breaker_failures=1, breaker_recovery=60.0)
    try:
        assert anyio.run(store.admit, tripped).code == ""
        anyio.run(store.release, tripped, "fail", False)
        page = admin_client.get("/admin/registry/upstream/").content.decode()
        assert "open (1 failures; probe in 60 s)" in page or "open (1 failures; probe in 59 s)" in page
        mark = audit_mark()
        admin_client.post("/admin/registry/upstream/", {"action": "close_circuit", "_selected_action": [upstream.pk]})
        assert store.breaker(upstream.id).state == "closed"
        assert [r.detail["action"] for r in audit_since(mark)] == ["breaker_reset"]
    finally:
        upstream.delete()


def test_a_rule_names_one_agent_or_agent_group_and_one_upstream_or_server_group(admin_client, world):
    demo, group = Upstream.objects.get(slug="demo"), ServerGroup.objects.create(name="both-ways")
    try:
        form = {"effect": "deny", "upstream": demo.pk, "server_group": group.pk, "tool_pattern": "*", "enabled": "on",
                "team": default_team()}  # fmt: skip
        page = admin_client.post("/admin/policy/rule/add/", form).content.decode()
    finally:
        group.delete()
    assert "Name an upstream or a server group, not both: make two rules." in page
    assert not Rule.objects.filter(upstream=demo, tool_pattern="*").exists()


def test_agents_and_groups_edited_in_the_admin_are_audited_with_their_settings(admin_client, world):
    mark = audit_mark()
    with agent("ivan") as (ivan, _):
        form = {"name": "ivan", "team": ivan.team_id, "enabled": "on", "calls_per_minute": "30",
                "max_calls_per_session": "", "keys-TOTAL_FORMS": "0", "keys-INITIAL_FORMS": "0"}  # fmt: skip
        assert admin_client.post(f"/admin/policy/agent/{ivan.pk}/change/", form).status_code == 302
        team = default_team()
        group = {"name": "ledgers", "team": team, "isolation": "strict", "enabled": "on"}
        admin_client.post("/admin/policy/servergroup/add/", group)
        admin_client.post("/admin/policy/agentgroup/add/", {"name": "auditors", "team": team, "agents": [ivan.pk]})
        rows = [r.detail for r in audit_since(mark) if r.kind == "admin_change" and r.actor == "operator"]
    ServerGroup.objects.filter(name="ledgers").delete()
    AgentGroup.objects.filter(name="auditors").delete()
    assert {"action": "agent_saved", "name": "ivan", "before": {"calls_per_minute": None},
            "after": {"calls_per_minute": 30}} in rows  # fmt: skip
    assert {"action": "servergroup_created", "name": "ledgers", "before": None,
            "after": {"name": "ledgers", "team": "Default", "isolation": "strict",
                      "enabled": True}} in rows  # fmt: skip
    assert {"action": "agentgroup_members", "name": "auditors", "members": ["ivan"]} in rows


def test_an_upstream_change_is_audited_as_before_and_after_with_its_secrets_masked(db):
    upstream = Upstream(slug="masked", transport="streamable_http", url="https://u:pw@api.example/mcp?token=abc123")
    upstream.headers = {"Authorization": "Bearer first-secret"}
    upstream_save(upstream=upstream, created=True, actor="operator")
    mark = audit_mark()
    try:
        upstream.headers = {"Authorization": "Bearer second-secret"}
        upstream.timeout = 12.0
        upstream_save(upstream=upstream, actor="operator")
        [row] = audit_since(mark)
        before, after = row.detail["before"], row.detail["after"]
        assert sorted(after) == ["headers", "timeout"]  # only what changed
        assert (before["timeout"], after["timeout"]) == (30.0, 12.0)
        assert before["headers"]["Authorization"] != after["headers"]["Authorization"]
        assert after["headers"]["Authorization"].startswith("•••• ")
        created = AuditEvent.objects.filter(upstream="masked", detail__action="upstream_created").get()
        assert created.detail["after"]["url"] == "https://••••@api.example/mcp"  # its query moved, sealed:
        assert created.detail["after"]["query"]["token"].startswith("•••• ")
        text = json.dumps([row.detail, created.detail])
        assert not any(secret in text for secret in ("first-secret", "second-secret", "abc123", "pw@"))
    finally:
        upstream.delete()


def test_deleting_in_the_admin_and_revoking_a_key_inline_are_audited(admin_client):
    with agent("doomed") as (doomed, _):
        keys = list(doomed.keys.all())
        form = {"name": "doomed", "team": doomed.team_id, "enabled": "on", "calls_per_minute": "",
                "max_calls_per_session": "", "keys-TOTAL_FORMS": "1", "keys-INITIAL_FORMS": "1",
                "keys-0-id": keys[0].pk, "keys-0-agent": doomed.pk, "keys-0-label": "",
                "keys-0-revoked": "on"}  # fmt: skip
        mark = audit_mark()
        assert admin_client.post(f"/admin/policy/agent/{doomed.pk}/change/", form).status_code == 302
        assert AgentKey.objects.get(pk=keys[0].pk).revoked
        deleted = admin_client.post(f"/admin/policy/agent/{doomed.pk}/delete/", {"post": "yes"})
        assert deleted.status_code == 302 and not Agent.objects.filter(pk=doomed.pk).exists()
        rows = [(r.actor, r.detail["action"]) for r in audit_since(mark) if r.kind == "admin_change"]
    assert ("operator", "agent_key_revoked") in rows and rows[-1] == ("operator", "agent_deleted")
    [gone] = AuditEvent.objects.filter(id__gt=mark, detail__action="agent_deleted")
    assert gone.detail["before"]["name"] == "doomed" and gone.detail["after"] is None


def test_operator_accounts_changed_in_the_admin_are_audited_with_the_password_masked(admin_client):
    mark = audit_mark()
    password = "Zq8!long-enough-pw"
    form = {"username": "newop", "password1": password, "password2": password, "usable_password": "true"}
    created = admin_client.post("/admin/auth/user/add/", form)
    newop = get_user_model().objects.get(username="newop")
    try:
        assert created.status_code == 302
        auditors = Group.objects.get(name="Auditor")
        form = {"username": "newop", "is_active": "on", "is_staff": "on", "groups": [auditors.pk],
                "date_joined_0": "2026-11-22", "date_joined_1": "08:00:00"}  # fmt: skip
        changed = admin_client.post(f"/admin/auth/user/{newop.pk}/change/", form)
        assert changed.status_code == 302, changed.content.decode()[:3000]
        rows = [r for r in audit_since(mark) if r.kind == "admin_change" and r.actor == "operator"]
    finally:
        newop.delete()
    actions = [r.detail["action"] for r in rows]
    assert actions == ["user_created", "user_access", "user_saved", "user_access"]
    made = rows[0].detail["after"]
    assert made["username"] == "newop" and made["password"].startswith("•••• ")
    assert newop.password not in json.dumps([r.detail for r in rows])
    assert rows[2].detail["after"]["is_staff"] is True and rows[3].detail["groups"] == ["Auditor"]
    assert "password" not in rows[2].detail["after"]  # unchanged: not in the change


def _messages(response) -> list[str]:
    return [str(message) for message in response.context["messages"]]


def test_an_upstream_added_with_a_missing_command_is_saved_disabled_and_the_command_named(admin_client, admin_executor):
    """Trying later would find the command missing still: the page says what is wrong, and agents are not
    offered an upstream that cannot start."""
    missing = Upstream(slug="ghost-cmd", transport="stdio", command="/nonexistent/mcp-server-ghost")
    mark = audit_mark()
    form = _upstream_form(missing, env="{}", headers="{}")
    added = admin_client.post("/admin/registry/upstream/add/", form, follow=True)
    upstream = Upstream.objects.get(slug="ghost-cmd")
    try:
        said = (
            "ghost-cmd: catalog sync failed: command not found: /nonexistent/mcp-server-ghost. "
            "It was saved disabled: install the command or correct it, then enable it."
        )
        assert _messages(added)[-1] == said
        assert "Try later" not in added.content.decode()
        assert not upstream.enabled
        assert upstream.last_sync_error == said.removeprefix("ghost-cmd: catalog sync failed: ")
        actions = [(r.actor, r.detail["action"]) for r in audit_since(mark) if r.upstream == "ghost-cmd"]
        assert actions == [("operator", "upstream_created"), ("operator", "upstream_disabled")]
    finally:
        upstream.delete()


def test_adding_and_editing_an_upstream_in_the_admin_reports_the_sync_of_what_was_saved(admin_client, admin_executor):
    """The sync runs once the save is committed, so the executor (another connection, or another process) reads
    the row as saved: a new upstream is found, and an edit reports the edited command, not the previous one."""
    time_server = Upstream(slug="clock", transport="stdio", command=str(BIN / "mcp-server-time"))
    form = _upstream_form(time_server, args=json.dumps(["--local-timezone", "UTC"]), env="{}", headers="{}")
    added = admin_client.post("/admin/registry/upstream/add/", form, follow=True)
    upstream = Upstream.objects.get(slug="clock")
    try:
        assert _messages(added)[-1] == "clock: 2 added, 0 changed, 0 removed, 0 rejected"
        edit = _upstream_form(upstream, command=sys.executable, args=json.dumps(DEMO), env="{}", headers="{}")
        edited = admin_client.post(f"/admin/registry/upstream/{upstream.pk}/change/", edit, follow=True)
        [report] = [m for m in _messages(edited) if m.startswith("clock:")]
        assert report.startswith("clock: ") and " 2 removed, 0 rejected; held for approval: " in report
        names = set(upstream.tools.values_list("name", flat=True))
        assert "echo" in names and "get_current_time" not in names, "the catalog is the edited command's"
    finally:
        upstream.delete()


def test_the_console_pages_register_at_their_first_use_the_urls_the_checks_or_the_team_roles(tmp_path):
    """Django's setup leaves the console's pages (each app's admin.py) to their first use (audit/apps.py): a process
    that only serves /mcp never loads them; the URLconf, the admin's checks and a team role's permissions
    (policy/console_groups.py) each find them all registered, in a process where nothing else did."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env |= {"DJANGO_SETTINGS_MODULE": "gateway_project.settings", "SWITCHBOARD_VAR_DIR": str(tmp_path)}
    first_uses = {
        "urls": "import gateway_project.urls",
        "checks": "from django.core import checks; assert not checks.run_checks(tags=[checks.Tags.admin])",
        "team roles": "from policy.console_groups import _team_scoped_models; assert Agent in _team_scoped_models()",
    }
    for name, first_use in first_uses.items():
        probe = (
            "import django; django.setup(); from django.contrib import admin; from policy.models import Agent; "
            f"before = len(admin.site._registry); {first_use}; print(before, Agent in admin.site._registry)"
        )
        done = subprocess.run([sys.executable, "-c", probe], env=env, cwd=servers.ROOT, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-3000:]
        assert done.stdout.split() == ["0", "True"], name
