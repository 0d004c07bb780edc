"""The console by team (issue 36): a team admin sees, picks and changes only the objects of teams it administers;
another team's object by id is 404, a save into another team is refused by the form; a gateway admin sees all."""

import json
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from django.contrib.admin import RelatedFieldListFilter
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client
from django.utils import timezone

from audit.models import AuditEvent
from audit.services import audit_record
from gateway_project.dashboard import gateway_state, window_stats
from handoff.models import HandoffRoute, Tunnel
from policy.models import Agent, AgentGroup, Rule, ServerGroup, Team, TeamMember
from registry.models import Tool, Upstream
from tests.helpers import audit_mark

OWNED = ("registry", "policy", "handoff")


@dataclass
class TwoTeams:
    payments: Team
    support: Team
    ledger: Upstream  # payments'
    helpdesk: Upstream  # support's
    vault: Upstream  # support's, shared with payments
    pay_client: Client  # payments' admin
    support_client: Client  # support's admin


def team_admin(name: str, team: Team) -> Client:
    """A staff account with every permission on owned objects, `admin` of `team` only."""
    user = get_user_model().objects.create_user(name, password="pw-for-tests-only", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(content_type__app_label__in=OWNED))
    TeamMember.objects.create(team=team, user=user, role="admin")
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def two_teams(db) -> Iterator[TwoTeams]:
    payments = Team.objects.create(slug="payments", name="Payments")
    support = Team.objects.create(slug="support", name="Support")
    ledger = Upstream.objects.create(slug="ledger", team=payments, transport="stdio", command="ledger")
    helpdesk = Upstream.objects.create(slug="helpdesk", team=support, transport="stdio", command="helpdesk")
    vault = Upstream.objects.create(slug="vault", team=support, transport="stdio", command="vault")
    vault.shared_with.add(payments)
    yield TwoTeams(
        payments, support, ledger, helpdesk, vault, team_admin("pay-admin", payments), team_admin("sup-admin", support)
    )
    teams = (payments, support)
    HandoffRoute.objects.filter(team__in=teams).delete()
    Rule.objects.filter(team__in=teams).delete()
    AgentGroup.objects.filter(team__in=teams).delete()
    Agent.objects.filter(team__in=teams).delete()
    ServerGroup.objects.filter(team__in=teams).delete()
    Upstream.objects.filter(team__in=teams).delete()
    get_user_model().objects.filter(username__in=["pay-admin", "sup-admin"]).delete()
    Team.objects.filter(pk__in=[t.pk for t in teams]).delete()


def test_a_team_admin_lists_only_its_own_teams_upstreams(two_teams):
    page = two_teams.pay_client.get("/admin/registry/upstream/").content.decode()
    assert "ledger" in page and "helpdesk" not in page and "almanac" not in page
    page = two_teams.support_client.get("/admin/registry/upstream/").content.decode()
    assert "helpdesk" in page and "vault" in page and "ledger" not in page


def test_a_gateway_admin_lists_every_teams_upstreams(two_teams, admin_client):
    page = admin_client.get("/admin/registry/upstream/").content.decode()
    assert "ledger" in page and "helpdesk" in page


def test_another_teams_upstream_by_id_is_404_to_open_change_delete_and_a_crafted_post(two_teams):
    client, helpdesk = two_teams.pay_client, two_teams.helpdesk
    base = f"/admin/registry/upstream/{helpdesk.pk}"
    for page in (f"{base}/change/", f"{base}/delete/", f"{base}/history/"):
        assert client.get(page).status_code == 404, page
    assert client.post(f"{base}/change/", {"slug": "stolen", "team": two_teams.payments.pk}).status_code == 404
    assert client.post(f"{base}/delete/", {"post": "yes"}).status_code == 404
    helpdesk.refresh_from_db()
    assert helpdesk.slug == "helpdesk" and helpdesk.team == two_teams.support
    assert client.get(f"/admin/registry/upstream/{two_teams.ledger.pk}/change/").status_code == 200


def test_a_shared_upstream_is_listed_to_its_borrower_and_shown_read_only(two_teams):
    Upstream.objects.filter(pk=two_teams.vault.pk).update(env={"VAULT_TOKEN": "s3cret"}, command="vault-server")
    Tool.objects.create(upstream=two_teams.vault, name="unseal", definition={}, last_seen_at=timezone.now())
    client, base = two_teams.pay_client, f"/admin/registry/upstream/{two_teams.vault.pk}"
    listed = client.get("/admin/registry/upstream/").content.decode()
    assert f'href="{base}/change/"' in listed and "helpdesk" not in listed
    response = client.get(f"{base}/change/")
    page = response.content.decode()
    assert response.status_code == 200 and "vault" in page and "unseal" in page
    assert 'name="_save"' not in page and 'name="_continue"' not in page and "/delete/" not in page
    assert "VAULT_TOKEN" not in page and "vault-server" not in page and 'name="shared_with"' not in page
    assert not re.search(r"/admin/registry/tool/\d+/change/", page)  # its tools are its owner's to open
    own = client.get(f"/admin/registry/upstream/{two_teams.ledger.pk}/change/").content.decode()
    assert 'name="_save"' in own


def test_a_borrower_changes_deletes_and_acts_on_a_shared_upstream_never(two_teams):
    client, vault, base = two_teams.pay_client, two_teams.vault, f"/admin/registry/upstream/{two_teams.vault.pk}"
    form = {"slug": "stolen", "team": two_teams.payments.pk, "transport": "stdio", "command": "x"}
    assert client.post(f"{base}/change/", form).status_code == 403
    assert client.post(f"{base}/delete/", {"post": "yes"}).status_code == 403
    assert client.get(f"{base}/delete/").status_code == 403
    assert client.get(f"{base}/history/").status_code == 403
    for action in ({"action": "disable", "index": 0}, {"action": "delete_selected", "post": "yes"}):
        client.post("/admin/registry/upstream/", {**action, "_selected_action": [vault.pk]})
    vault.refresh_from_db()
    assert (vault.slug, vault.team, vault.enabled) == ("vault", two_teams.support, True)
    assert two_teams.support_client.get(f"{base}/change/").content.decode().count('name="_save"') == 1


def test_a_bulk_action_on_another_teams_upstream_does_nothing(two_teams):
    form = {"action": "disable", "_selected_action": [two_teams.helpdesk.pk], "index": 0}
    two_teams.pay_client.post("/admin/registry/upstream/", form)
    two_teams.helpdesk.refresh_from_db()
    assert two_teams.helpdesk.enabled


def test_another_teams_tool_is_404(two_teams):
    tool = Tool.objects.create(upstream=two_teams.helpdesk, name="ticket", definition={}, last_seen_at=timezone.now())
    assert two_teams.pay_client.get(f"/admin/registry/tool/{tool.pk}/change/").status_code == 404
    assert two_teams.pay_client.get(f"/admin/registry/tool/{tool.pk}/test/").status_code == 404
    assert two_teams.support_client.get(f"/admin/registry/tool/{tool.pk}/change/").status_code == 200


def test_another_teams_agent_rule_group_and_route_are_404(two_teams):
    support = two_teams.support
    agent = Agent.objects.create(name="support-bot", team=support)
    group = ServerGroup.objects.create(name="support-tools", team=support)
    rule = Rule.objects.create(team=support, agent=agent, effect="allow")
    route = HandoffRoute.objects.create(domain="support.example", target=two_teams.helpdesk, team=support)
    for page in (
        f"/admin/policy/agent/{agent.pk}/change/",
        f"/admin/policy/servergroup/{group.pk}/change/",
        f"/admin/policy/rule/{rule.pk}/change/",
        f"/admin/handoff/handoffroute/{route.pk}/change/",
    ):
        assert two_teams.pay_client.get(page).status_code == 404, page
        assert two_teams.support_client.get(page).status_code == 200, page
    assert two_teams.pay_client.post(f"/admin/policy/agent/{agent.pk}/delete/", {"post": "yes"}).status_code == 404
    assert Agent.objects.filter(pk=agent.pk).exists()


def test_a_team_admin_is_offered_only_its_teams_and_their_objects(two_teams):
    Agent.objects.create(name="support-bot", team=two_teams.support)
    Agent.objects.create(name="payments-bot", team=two_teams.payments)
    form = two_teams.pay_client.get("/admin/policy/rule/add/").context["adminform"].form
    assert list(form.fields["team"].queryset) == [two_teams.payments]
    assert [a.name for a in form.fields["agent"].queryset] == ["payments-bot"]
    assert {u.slug for u in form.fields["upstream"].queryset} == {"ledger", "vault"}  # its own and one shared


def test_saving_into_another_team_is_refused_by_the_form(two_teams):
    form = {"name": "sneaky", "team": two_teams.support.pk, "isolation": "open", "enabled": "on"}
    response = two_teams.pay_client.post("/admin/policy/servergroup/add/", form)
    assert response.status_code == 200
    assert "You may save only into a team you administer" in response.content.decode()
    assert not ServerGroup.objects.filter(name="sneaky").exists()


def test_a_rule_naming_another_teams_upstream_is_refused_by_the_form(two_teams):
    form = {"team": two_teams.payments.pk, "effect": "allow", "upstream": two_teams.helpdesk.pk, "enabled": "on"}
    response = two_teams.pay_client.post("/admin/policy/rule/add/", form)
    assert response.status_code == 200
    assert "Select a valid choice" in response.content.decode()
    assert not Rule.objects.filter(upstream=two_teams.helpdesk).exists()


def test_recent_actions_hold_only_the_accounts_own(two_teams):
    two_teams.support_client.post(f"/admin/registry/upstream/{two_teams.helpdesk.pk}/delete/", {"post": "yes"})
    index = two_teams.pay_client.get("/admin/").content.decode()
    assert "helpdesk" not in index


@pytest.fixture
def payments_auditor(two_teams) -> Iterator[Client]:
    """A staff account that may view the audit trail, `auditor` of payments only."""
    user = get_user_model().objects.create_user("pay-auditor", password="pw-for-tests-only", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename="view_auditevent"))
    TeamMember.objects.create(team=two_teams.payments, user=user, role="auditor")
    client = Client()
    client.force_login(user)
    yield client
    user.delete()


def test_an_auditor_reads_only_its_teams_rows_in_the_browser_by_id_request_and_export(payments_auditor):
    tool = f"scoped-{uuid.uuid4().hex[:8]}"
    ours = audit_record(kind="completed", request_id=uuid.uuid4(), upstream="ledger", tool=tool, team="payments")
    theirs = audit_record(kind="completed", request_id=uuid.uuid4(), upstream="helpdesk", tool=tool, team="support")
    page = payments_auditor.get("/admin/audit/auditevent/", {"tool": tool}).content.decode()
    assert f"/admin/audit/auditevent/{ours.pk}/" in page and f"/admin/audit/auditevent/{theirs.pk}/" not in page
    assert payments_auditor.get(f"/admin/audit/auditevent/{ours.pk}/change/").status_code == 200
    assert payments_auditor.get(f"/admin/audit/auditevent/{theirs.pk}/change/").status_code == 404
    assert payments_auditor.get(f"/admin/audit/auditevent/request/{ours.request_id}/").status_code == 200
    assert payments_auditor.get(f"/admin/audit/auditevent/request/{theirs.request_id}/").status_code == 404
    mark = audit_mark()
    export = b"".join(payments_auditor.get("/admin/audit/auditevent/export.jsonl", {"tool": tool}).streaming_content)
    assert [json.loads(line)["id"] for line in export.splitlines()] == [ours.pk]
    exported = AuditEvent.objects.filter(id__gt=mark, detail__action="audit_exported")
    assert [(row.actor, row.team) for row in exported] == [("pay-auditor", "payments")]  # the trail it concerns


def test_a_gateway_admin_reads_every_teams_rows(two_teams, admin_client):
    tool = f"scoped-{uuid.uuid4().hex[:8]}"
    theirs = audit_record(kind="completed", request_id=uuid.uuid4(), upstream="helpdesk", tool=tool, team="support")
    assert admin_client.get(f"/admin/audit/auditevent/{theirs.pk}/change/").status_code == 200


def test_a_team_admin_reads_its_teams_rows_too(two_teams):
    ours = audit_record(kind="completed", request_id=uuid.uuid4(), upstream="ledger", tool="t", team="payments")
    admins = get_user_model().objects.filter(username__in=["pay-admin", "sup-admin"])
    Permission.objects.get(codename="view_auditevent").user_set.add(*admins)
    assert two_teams.pay_client.get(f"/admin/audit/auditevent/{ours.pk}/change/").status_code == 200
    assert two_teams.support_client.get(f"/admin/audit/auditevent/{ours.pk}/change/").status_code == 404


def team_page_form(team: Team, **fields: str) -> dict[str, object]:
    return {
        "members-TOTAL_FORMS": "0",
        "members-INITIAL_FORMS": "0",
        "idp_groups-TOTAL_FORMS": "0",
        "idp_groups-INITIAL_FORMS": "0",
        **fields,
    }


def test_a_team_admin_manages_its_own_teams_members_and_group_mappings_not_its_limits(two_teams):
    page = f"/admin/policy/team/{two_teams.payments.pk}/change/"
    assert two_teams.pay_client.get(page).status_code == 200
    form = team_page_form(
        two_teams.payments,
        calls_per_minute="1",
        **{"idp_groups-TOTAL_FORMS": "1", "idp_groups-0-group": "okta-payments", "idp_groups-0-role": "member"},
    )
    response = two_teams.pay_client.post(page, form)
    assert response.status_code == 302, response.content.decode()[:2000]
    two_teams.payments.refresh_from_db()
    assert two_teams.payments.calls_per_minute is None
    assert list(two_teams.payments.idp_groups.values_list("group", "role")) == [("okta-payments", "member")]


def test_a_team_admin_opens_no_other_team_and_makes_or_deletes_none(two_teams):
    other = f"/admin/policy/team/{two_teams.support.pk}"
    assert two_teams.pay_client.get(f"{other}/change/").status_code == 404
    crafted = team_page_form(
        two_teams.support,
        **{"members-TOTAL_FORMS": "1", "members-0-user": "1", "members-0-role": "admin"},
    )
    assert two_teams.pay_client.post(f"{other}/change/", crafted).status_code == 404
    assert two_teams.pay_client.get("/admin/policy/team/add/").status_code == 403
    assert (
        two_teams.pay_client.post(f"/admin/policy/team/{two_teams.payments.pk}/delete/", {"post": "yes"}).status_code
        == 403
    )
    assert two_teams.pay_client.get("/admin/policy/teamgroup/").status_code == 403
    assert list(two_teams.support.members.values_list("user__username", flat=True)) == ["sup-admin"]
    listed = two_teams.pay_client.get("/admin/policy/team/").content.decode()
    assert "payments" in listed and "support" not in listed


def test_the_sign_in_page_opens_for_a_visitor_not_yet_signed_in(db):
    assert Client().get("/admin/login/").status_code == 200


def test_the_dashboard_lists_only_the_upstreams_of_an_auditors_teams(payments_auditor):
    Permission.objects.get(codename="view_auditevent").user_set.add(
        get_user_model().objects.get(username="pay-auditor")
    )
    page = payments_auditor.get("/admin/").content.decode()
    totals = page[page.index('id="upstream-totals"') :]
    assert "ledger" in totals and "helpdesk" not in totals


def test_the_explain_page_refuses_another_teams_agent(two_teams):
    Agent.objects.create(name="support-bot", team=two_teams.support)
    response = two_teams.pay_client.get("/admin/policy/rule/explain/", {"agent": "support-bot", "tool": "helpdesk__t"})
    assert response.status_code == 400
    assert "Select a valid choice" in response.content.decode()


def test_an_upstream_and_an_agent_group_offer_only_the_admins_teams_groups_and_agents(two_teams):
    ServerGroup.objects.create(name="payments-tools", team=two_teams.payments)
    ServerGroup.objects.create(name="support-tools", team=two_teams.support)
    Agent.objects.create(name="payments-bot", team=two_teams.payments)
    Agent.objects.create(name="support-bot", team=two_teams.support)
    upstream_form = two_teams.pay_client.get("/admin/registry/upstream/add/").context["adminform"].form
    assert list(upstream_form.fields["team"].queryset) == [two_teams.payments]
    assert [g.name for g in upstream_form.fields["group"].queryset] == ["payments-tools"]
    group_form = two_teams.pay_client.get("/admin/policy/agentgroup/add/").context["adminform"].form
    assert [a.name for a in group_form.fields["agents"].queryset] == ["payments-bot"]


def pending_tool(upstream: Upstream) -> Tool:
    return Tool.objects.create(
        upstream=upstream, name="t", definition={}, definition_sha256="new", approved_sha256="old",
        last_seen_at=timezone.now(),
    )  # fmt: skip


def test_the_dashboards_people_and_tiles_hold_only_the_auditors_teams(two_teams, payments_auditor, admin_client):
    support, helpdesk = two_teams.support, two_teams.helpdesk
    pay_bot = Agent.objects.create(name="payments-bot", team=two_teams.payments)
    sup_bot = Agent.objects.create(name="support-bot", team=support)
    for agent, upstream in ((pay_bot, two_teams.ledger), (sup_bot, helpdesk)):
        Tunnel.objects.create(agent=agent, session_key=agent.name, domain=upstream.slug, upstream=upstream,
                              idle_timeout=60, state="open")  # fmt: skip
        pending_tool(upstream)
    Upstream.objects.filter(pk=helpdesk.pk).update(
        health="failing", health_cause="refused", package={"held": {"name": "h", "version": "2", "integrity": "x"}}
    )
    ours, theirs = (f"{team}-{uuid.uuid4().hex[:8]}" for team in ("pay", "sup"))
    for person, team, upstream in ((ours, "payments", "ledger"), (theirs, "support", "helpdesk")):
        audit_record(kind="completed", request_id=uuid.uuid4(), upstream=upstream, tool="t", outcome="ok",
                     person_subject=person, person_name=person, team=team, session_id=person)  # fmt: skip

    state = gateway_state(teams=frozenset({"payments"}))
    assert (state.failing_upstreams, state.held_packages, state.pending_tools) == ([], [], 1)
    assert [t.agent.name for t in state.live_tunnels] == ["payments-bot"] and state.active_sessions == 1
    page = payments_auditor.get("/admin/").content.decode()
    assert ours in page and theirs not in page
    assert '<strong id="pending-tools">1</strong>' in page and '<strong id="live-tunnels">1</strong>' in page
    assert '<strong id="failing-upstreams">0</strong>' in page and "held-packages" not in page

    every = gateway_state()
    assert [u.slug for u in every.failing_upstreams] == ["helpdesk"] and "helpdesk" in every.held_packages
    assert {"payments-bot", "support-bot"} <= {t.agent.name for t in every.live_tunnels}
    assert every.pending_tools >= 2 and every.active_sessions >= 2
    page = admin_client.get("/admin/").content.decode()
    assert "held-packages" in page  # its busiest people are every team's: these two may be outrun by others'
    both = window_stats(window="hour", teams=frozenset({"payments", "support"})).people
    assert {ours, theirs} <= {person["name"] for person in both}


def filter_choices(client: Client, changelist: str) -> dict[str, set[str]]:
    """The names each list filter on a related object offers, by the filter's parameter."""
    specs = client.get(changelist).context["cl"].filter_specs
    related = [spec for spec in specs if isinstance(spec, RelatedFieldListFilter)]
    return {spec.lookup_kwarg: {name for _, name in spec.lookup_choices} for spec in related}


def test_list_filters_on_a_related_object_name_only_the_admins_teams_objects(two_teams, admin_client):
    for team in (two_teams.payments, two_teams.support):
        ServerGroup.objects.create(name=f"{team.slug}-tools", team=team)
        Agent.objects.create(name=f"{team.slug}-bot", team=team)
        AgentGroup.objects.create(name=f"{team.slug}-crew", team=team)
    rules = filter_choices(two_teams.pay_client, "/admin/policy/rule/")
    assert rules["agent__id__exact"] == {"payments-bot"}
    assert rules["upstream__id__exact"] == {"ledger", "vault"}  # its own and one shared with it, as the form's
    assert rules["server_group__id__exact"] == {"payments-tools"}
    assert "team__id__exact" not in rules  # one team to pick: no filter at all, rather than every team's names
    upstreams = filter_choices(two_teams.pay_client, "/admin/registry/upstream/")
    assert upstreams["group__id__exact"] == {"payments-tools"} and "team__id__exact" not in upstreams
    assert filter_choices(two_teams.pay_client, "/admin/policy/agent/")["agent_groups__id__exact"] == {"payments-crew"}
    every = filter_choices(admin_client, "/admin/policy/rule/")
    assert {"payments-bot", "support-bot"} <= every["agent__id__exact"]
    assert {"ledger", "helpdesk", "vault"} <= every["upstream__id__exact"]
    assert {"Payments", "Support"} <= every["team__id__exact"]
