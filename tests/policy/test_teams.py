"""Teams as data: IdP groups mapped to a team and a role, what a person's groups give them, and when a team
may be deleted."""

from collections.abc import Iterator

import pytest
from django.contrib.auth.models import Group

from audit.models import AuditEvent
from handoff.models import HandoffRoute
from policy.keys import key_split
from policy.models import Agent, Rule, ServerGroup, Team, TeamGroup, TeamMember, default_team
from policy.selectors import team_roles_list, teams_of, user_team_roles
from policy.services import TeamRefused, agent_create, agent_key_revoke, team_group_map
from registry.models import Upstream
from registry.services import team_delete
from tests.helpers import audit_mark, audit_since


@pytest.fixture
def payments(db) -> Iterator[Team]:
    team = Team.objects.create(slug="payments", name="Payments")
    team_id = team.pk  # a test may delete it
    yield team
    for owned in (HandoffRoute, Rule, Agent, ServerGroup, Upstream):
        owned.objects.filter(team_id=team_id).delete()
    Team.objects.filter(pk=team_id).delete()


@pytest.fixture
def ledger(payments) -> Upstream:
    return Upstream.objects.create(slug="ledger", team=payments, transport="stdio", command="ledger")


@pytest.mark.parametrize(
    ("team", "role", "code", "message"),
    [
        (
            "paymnts",
            "member",
            "TEAM_UNKNOWN",
            "No team 'paymnts': create the team first, then map 'okta-payments' to it.",
        ),
        ("payments", "owner", "TEAM_ROLE_UNKNOWN", "No role 'owner': a team role is one of admin, member, auditor."),
    ],
    ids=["team-that-does-not-exist", "role-that-does-not-exist"],
)
def test_an_idp_group_mapped_to_a_missing_team_or_role_is_refused_and_nothing_is_made(
    payments, team, role, code, message
):
    with pytest.raises(TeamRefused) as refused:
        team_group_map(group="okta-payments", team=team, role=role, actor="root")
    assert (refused.value.code, refused.value.message) == (code, message)
    assert not Team.objects.filter(slug="paymnts").exists()
    assert not TeamGroup.objects.filter(group="okta-payments").exists()


def test_a_group_name_with_an_invisible_character_is_refused(payments):
    with pytest.raises(Exception, match=r"Use visible characters only: this holds U\+200B \(ZERO WIDTH SPACE\)\."):
        team_group_map(group="okta\u200bpayments", team="payments", role="member")


def test_mapping_a_group_again_changes_its_role_and_each_mapping_is_audited(payments):
    mark = audit_mark()
    team_group_map(group="okta-payments", team="payments", role="member", actor="root")
    team_group_map(group="okta-payments", team="payments", role="auditor", actor="root")
    assert list(TeamGroup.objects.filter(team=payments).values_list("group", "role")) == [("okta-payments", "auditor")]
    rows = [(r.actor, r.team, r.detail) for r in audit_since(mark) if r.kind == AuditEvent.Kind.ADMIN_CHANGE]
    assert rows == [
        ("root", "payments", {"action": "team_group_mapped", "group": "okta-payments", "team": "payments", "role": r})
        for r in ("member", "auditor")
    ]


def test_a_persons_groups_give_them_the_strongest_role_in_each_team_they_map_to(payments):
    default = Team.objects.get(pk=default_team())
    team_group_map(group="payments-readers", team="payments", role="auditor")
    team_group_map(group="payments-devs", team="payments", role="member")
    team_group_map(group="everyone", team=default.slug, role="member")
    team_group_map(group="platform", team=default.slug, role="admin")
    try:
        assert team_roles_list(groups=["payments-readers", "payments-devs", "everyone"]) == {
            "payments": "member",
            "default": "member",
        }
        assert team_roles_list(groups=["everyone", "platform", "unmapped"]) == {"default": "admin"}
        assert team_roles_list(groups=[]) == {}
    finally:
        TeamGroup.objects.filter(team=default).delete()


def test_an_accounts_roles_come_from_its_memberships_and_its_console_groups_and_a_gateway_admin_has_every_team(
    payments, django_user_model
):
    ops = Team.objects.create(slug="ops", name="Ops")
    readers = Group.objects.create(name="payments-readers-console")
    try:
        pat = django_user_model.objects.create_user("pat", is_staff=True)
        root = django_user_model.objects.create_superuser("root-teams", password="x")
        pat.groups.add(readers)
        TeamGroup.objects.create(group=readers.name, team=payments, role="auditor")
        TeamMember.objects.create(user=pat, team=ops, role="admin")
        TeamMember.objects.create(user=pat, team=payments, role="member")  # stronger than the group's auditor
        assert user_team_roles(user=pat) == {"payments": "member", "ops": "admin"}
        assert teams_of(user=pat, roles=["admin"]) == frozenset({"ops"})
        assert teams_of(user=pat, roles=["admin", "auditor", "member"]) == frozenset({"ops", "payments"})
        assert teams_of(user=root, roles=["auditor"]) is None
    finally:
        readers.delete()
        ops.delete()


def test_objects_made_without_a_team_belong_to_the_default_team(db):
    group = ServerGroup.objects.create(name="teamless")
    try:
        assert group.team.slug == "default"
    finally:
        group.delete()


def test_a_team_that_shares_an_upstream_is_not_deleted_and_the_refusal_names_what_it_shares(payments, ledger):
    borrower = Team.objects.create(slug="treasury", name="Treasury")
    vault = Upstream.objects.create(slug="vault", team=payments, transport="stdio", command="vault")
    ledger.shared_with.add(borrower)
    Upstream.objects.filter(pk=vault.pk).update(shared_with_all=True)
    try:
        with pytest.raises(TeamRefused) as refused:
            team_delete(team=payments, actor="root")
        assert (refused.value.code, refused.value.message) == (
            "TEAM_SHARES_UPSTREAMS",
            "Team 'payments' still shares ledger, vault with other teams: stop sharing them before deleting the team.",
        )
        Upstream.objects.filter(pk=vault.pk).update(shared_with_all=False)
        with pytest.raises(
            TeamRefused, match=r"^Team 'payments' still shares ledger with other teams: stop sharing it"
        ):
            team_delete(team=payments, actor="root")
        assert Team.objects.filter(pk=payments.pk).exists() and ledger.shared_with.get() == borrower
    finally:
        borrower.delete()


def test_a_team_that_owns_anything_is_not_deleted_and_the_refusal_names_what_it_owns(payments, ledger):
    Agent.objects.create(name="payments-bot", team=payments)
    Rule.objects.create(effect="allow", team=payments, upstream=ledger, note="bots read the ledger")
    with pytest.raises(TeamRefused) as refused:
        team_delete(team=payments, actor="root")
    assert (refused.value.code, refused.value.message) == (
        "TEAM_NOT_EMPTY",
        "Team 'payments' still owns upstreams ledger; agents payments-bot; rules allow any agent → ledger / *: "
        "move them to another team or delete them first.",
    )


def test_a_team_that_owns_nothing_is_deleted_with_its_members_and_mappings_and_audited(payments, admin_client):
    operator = TeamMember.objects.create(team=payments, user_id=admin_client.session["_auth_user_id"], role="admin")
    team_group_map(group="okta-payments", team="payments", role="member")
    mark = audit_mark()
    team_delete(team=payments, actor="root")
    assert not Team.objects.filter(slug="payments").exists()
    assert not TeamMember.objects.filter(pk=operator.pk).exists() and not TeamGroup.objects.filter(
        group="okta-payments"
    )
    (row,) = audit_since(mark)
    assert (row.actor, row.team, row.detail) == ("root", "payments", {"action": "team_deleted", "name": "Payments"})


def test_a_key_revoked_by_its_prefix_is_audited_with_its_agents_team(payments):
    issued = agent_create(name="payments-keyed", actor="root", team=payments)
    mark = audit_mark()
    agent_key_revoke(prefix=key_split(issued.key)[0], actor="root")
    [row] = audit_since(mark)
    assert (row.detail["action"], row.team, issued.agent.team.slug) == ("agent_key_revoked", "payments", "payments")
