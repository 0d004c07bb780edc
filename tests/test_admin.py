"""The admin: switches go through the services (and so the audit), keys are shown once, the trail is
read-only."""

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from audit.models import AuditEvent
from policy.models import Agent, AgentKey, ServerGroup
from registry.models import Upstream
from tests.helpers import audit_mark, audit_since


@pytest.fixture
def admin_client(db):
    user = get_user_model().objects.create_superuser("operator", password="pw-for-tests-only")
    client = Client()
    client.force_login(user)
    yield client
    user.delete()


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
        {"name": "ci-bot", "enabled": "on", "keys-TOTAL_FORMS": "0", "keys-INITIAL_FORMS": "0"},
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
