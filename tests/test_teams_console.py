"""Teams in the console: a gateway admin (a superuser) makes teams, their members and their group mappings;
no one else opens those pages; the lists of what teams own show and filter by team."""

from collections.abc import Iterator

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client

from policy.models import Agent, Team, TeamGroup, TeamMember, default_team
from registry.models import Upstream
from registry.services import upstream_set_enabled
from tests.helpers import audit_mark, audit_since


@pytest.fixture
def payments(db) -> Iterator[Team]:
    team = Team.objects.create(slug="payments", name="Payments")
    team_id = team.pk
    yield team
    Upstream.objects.filter(team_id=team_id).delete()
    Team.objects.filter(pk=team_id).delete()


@pytest.fixture
def staff_client(db) -> Iterator[Client]:
    """A staff operator who may do anything with policy objects, but is no superuser."""
    user = get_user_model().objects.create_user("staffer", password="pw-for-tests-only", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="policy"))
    client = Client()
    client.force_login(user)
    yield client
    user.delete()


def test_only_a_gateway_admin_opens_the_team_pages(admin_client, staff_client):
    for page in ("/admin/policy/team/", "/admin/policy/team/add/", "/admin/policy/teamgroup/"):
        assert staff_client.get(page).status_code == 403, page
        assert admin_client.get(page).status_code == 200, page
    assert staff_client.post("/admin/policy/team/add/", {"slug": "sneaky", "name": "Sneaky"}).status_code == 403
    assert not Team.objects.filter(slug="sneaky").exists()


def test_a_gateway_admin_creates_a_team_with_a_member_and_a_group_mapping(admin_client):
    operator = get_user_model().objects.get(username="operator")
    form = {
        "slug": "treasury",
        "name": "Treasury",
        "members-TOTAL_FORMS": "1",
        "members-INITIAL_FORMS": "0",
        "members-0-user": operator.pk,
        "members-0-role": "admin",
        "idp_groups-TOTAL_FORMS": "1",
        "idp_groups-INITIAL_FORMS": "0",
        "idp_groups-0-group": "okta-treasury",
        "idp_groups-0-role": "member",
    }
    mark = audit_mark()
    response = admin_client.post("/admin/policy/team/add/", form)
    try:
        assert response.status_code == 302, response.content.decode()[:3000]
        team = Team.objects.get(slug="treasury")
        assert list(team.members.values_list("user__username", "role")) == [("operator", "admin")]
        assert list(team.idp_groups.values_list("group", "role")) == [("okta-treasury", "member")]
        changes = [r for r in audit_since(mark) if r.kind == "admin_change"]
        actions = [r.detail for r in changes]
        assert actions[0]["action"] == "team_created" and {r.team for r in changes} == {"treasury"}
        assert actions[-1] == {
            "action": "team_members",
            "name": "Treasury",
            "members": ["operator: admin"],
            "groups": ["okta-treasury: member"],
        }
    finally:
        TeamMember.objects.filter(team__slug="treasury").delete()
        TeamGroup.objects.filter(team__slug="treasury").delete()
        Team.objects.filter(slug="treasury").delete()


def test_a_crafted_mapping_to_a_team_that_does_not_exist_is_refused_by_the_form(admin_client):
    form = {"group": "okta-ghosts", "team": "987654321", "role": "member"}
    response = admin_client.post("/admin/policy/teamgroup/add/", form)
    assert response.status_code == 200  # the form again, with its error
    assert "Select a valid choice. That choice is not one of the available choices." in response.content.decode()
    assert not TeamGroup.objects.filter(group="okta-ghosts").exists()


def test_an_upstream_is_not_shared_with_the_team_that_owns_it(admin_client, payments):
    form = {"slug": "ledger", "team": payments.pk, "shared_with": [payments.pk], "transport": "stdio"}
    form |= {"command": "ledger", "timeout": "5", "new_tools": "hold", "person_connect": "token"}
    form |= {"person_slot": "bearer", "person_client": "{}", "tools-TOTAL_FORMS": "0", "tools-INITIAL_FORMS": "0"}
    response = admin_client.post("/admin/registry/upstream/add/", form)
    assert response.status_code == 200
    assert "Team &#x27;payments&#x27; owns this upstream: share it with other teams." in response.content.decode()
    assert not Upstream.objects.filter(slug="ledger").exists()


def test_the_upstream_list_shows_each_team_and_filters_by_it(admin_client, payments):
    Upstream.objects.create(slug="ledger", team=payments, transport="stdio", command="ledger")
    almanac = Upstream.objects.create(slug="almanac", transport="stdio", command="almanac")  # the default team's
    try:
        listed = admin_client.get("/admin/registry/upstream/", {"team__id__exact": payments.pk})
        assert [(u.slug, u.team.slug) for u in listed.context["cl"].result_list] == [("ledger", "payments")]
        everyone = admin_client.get("/admin/registry/upstream/")
        shown = {(u.slug, u.team_id) for u in everyone.context["cl"].result_list}
        assert {("ledger", payments.pk), ("almanac", default_team())} <= shown
        assert 'class="sortable column-team"' in everyone.content.decode()  # the Team column
    finally:
        almanac.delete()


def test_deleting_a_team_that_owns_an_upstream_in_the_console_is_refused_naming_it(admin_client, payments):
    Upstream.objects.create(slug="ledger", team=payments, transport="stdio", command="ledger")
    page = admin_client.post(f"/admin/policy/team/{payments.pk}/delete/", {"post": "yes"})
    assert page.status_code == 200
    assert "would require deleting the following protected related objects" in page.content.decode()
    assert "ledger" in page.content.decode()
    assert Team.objects.filter(pk=payments.pk).exists()


def test_a_new_objects_form_has_the_default_team_chosen(admin_client, payments):
    pages = ("policy/agent", "policy/servergroup", "policy/agentgroup", "policy/rule", "registry/upstream")
    for page in (*pages, "handoff/handoffroute"):
        form = admin_client.get(f"/admin/{page}/add/").content.decode()
        assert f'<option value="{default_team()}" selected>Default</option>' in form, page
        assert f'<option value="{payments.pk}">Payments</option>' in form, page


def test_an_admin_change_to_a_teams_object_carries_that_team(admin_client, payments):
    mark = audit_mark()
    form = {"name": "payments-bot", "team": payments.pk, "enabled": "on"}
    added = admin_client.post("/admin/policy/agent/add/", form | {"keys-TOTAL_FORMS": "0", "keys-INITIAL_FORMS": "0"})
    ledger = Upstream.objects.create(slug="ledger", team=payments, transport="stdio", command="ledger")
    upstream_set_enabled(upstream=ledger, enabled=False, actor="operator")
    bot = Agent.objects.get(name="payments-bot")
    admin_client.post(f"/admin/policy/agent/{bot.pk}/delete/", {"post": "yes"})
    assert added.status_code == 302
    rows = [(r.detail["action"], r.team) for r in audit_since(mark) if r.kind == "admin_change"]
    assert rows == [
        ("agent_created", "payments"),
        ("agent_key_issued", "payments"),  # a key is its agent's team's
        ("upstream_disabled", "payments"),
        ("agent_deleted", "payments"),
    ]


def test_a_gateway_admin_sets_a_teams_limits_on_its_page_and_a_limit_below_one_is_refused(admin_client, payments):
    page = f"/admin/policy/team/{payments.pk}/change/"
    form = {
        "slug": "payments",
        "name": "Payments",
        "calls_per_minute": "120",
        "max_concurrent": "8",
        "daily_calls": "",
        "members-TOTAL_FORMS": "0",
        "members-INITIAL_FORMS": "0",
        "idp_groups-TOTAL_FORMS": "0",
        "idp_groups-INITIAL_FORMS": "0",
    }
    assert 'name="daily_calls"' in admin_client.get(page).content.decode()
    response = admin_client.post(page, form)
    assert response.status_code == 302, response.content.decode()[:3000]
    payments.refresh_from_db()
    assert (payments.calls_per_minute, payments.max_concurrent, payments.daily_calls) == (120, 8, None)
    refused = admin_client.post(page, form | {"max_concurrent": "0"})
    assert refused.status_code == 200
    assert refused.context["adminform"].form.errors == {
        "max_concurrent": ["Ensure this value is greater than or equal to 1."]
    }
    payments.refresh_from_db()
    assert payments.max_concurrent == 8
