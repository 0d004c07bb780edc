"""Run by tests/test_team_migration.py in a process of its own, on an empty database of its own: migrate to
just before teams, write what a deployment had then (objects, operators, audit rows), migrate to the end, and
print what became of it as JSON."""

import json

import django

django.setup()

from django.db import connection  # noqa: E402  (after setup, as in any script)
from django.db.migrations.executor import MigrationExecutor  # noqa: E402
from django.utils import timezone  # noqa: E402

BEFORE = [
    ("policy", "0009_person_account"),
    ("registry", "0015_upstream_package"),
    ("handoff", "0004_connect_timeout_bound"),
    ("audit", "0007_person"),
]


def before_teams(apps) -> None:
    """A deployment as it stood: one of everything teams will own, operators of each kind, two audit rows."""
    from audit.integrity import row_seal

    upstream = apps.get_model("registry", "Upstream").objects.create(slug="legacy", transport="stdio", command="x")
    apps.get_model("handoff", "HandoffRoute").objects.create(domain="books", description="Books.", target=upstream)
    agent = apps.get_model("policy", "Agent").objects.create(name="legacy-bot")
    apps.get_model("policy", "AgentKey").objects.create(agent=agent, prefix="legacy", digest="0" * 64)
    apps.get_model("policy", "AgentGroup").objects.create(name="legacy-group").agents.add(agent)
    apps.get_model("policy", "ServerGroup").objects.create(name="legacy-servers")
    apps.get_model("policy", "Rule").objects.create(effect="allow", agent=agent, upstream=upstream)
    _operators(apps)
    event = apps.get_model("audit", "AuditEvent")
    defaults = {f.attname: f.get_default() for f in event._meta.concrete_fields if f.attname not in ("id", "mac")}
    for person in ("", "someone"):  # version 1, and version 2 (a person named)
        row = defaults | {"kind": "completed", "created_at": timezone.now(), "agent_name": "legacy-bot"}
        row |= {"upstream": "legacy", "tool": "echo", "outcome": "ok", "person_subject": person}
        event.objects.create(**row, mac=row_seal(row))


def _operators(apps) -> None:
    user = apps.get_model("auth", "User").objects
    group = apps.get_model("auth", "Group").objects
    kinds = apps.get_model("contenttypes", "ContentType").objects
    kind, _ = kinds.get_or_create(app_label="registry", model="upstream")
    permission = apps.get_model("auth", "Permission").objects
    change = permission.create(codename="change_upstream", name="Can change upstream", content_type=kind)
    view = permission.create(codename="view_upstream", name="Can view upstream", content_type=kind)
    operators = group.create(name="Operators")
    operators.permissions.add(change)
    reader = group.create(name="Reader")
    reader.permissions.add(view)
    user.create(username="root", is_staff=True, is_superuser=True)
    user.create(username="op", is_staff=True).groups.add(operators)
    user.create(username="own-rights", is_staff=True).user_permissions.add(change)
    user.create(username="auditor", is_staff=True).groups.add(group.get(name="Auditor"))
    user.create(username="reader", is_staff=True).groups.add(reader)
    user.create(username="staff-only", is_staff=True)
    user.create(username="person")  # not staff: a person who calls, no console role


def after_teams() -> dict:
    from audit.integrity import audit_verify
    from audit.models import AuditEvent
    from handoff.models import HandoffRoute
    from policy.models import Agent, AgentGroup, Rule, ServerGroup, Team, TeamMember
    from registry.models import Upstream

    owned = [Upstream, HandoffRoute, Agent, AgentGroup, ServerGroup, Rule]
    report = audit_verify()
    return {
        "teams": list(Team.objects.values_list("slug", "name")),
        "owners": {model.__name__: sorted(set(model.objects.values_list("team__slug", flat=True))) for model in owned},
        "members": dict(TeamMember.objects.values_list("user__username", "role")),
        "member_teams": sorted(set(TeamMember.objects.values_list("team__slug", flat=True))),
        "audit": [(row.team, row.seal, row.team_slug) for row in AuditEvent.objects.order_by("id")],
        "audit_intact": report.intact,
        "audit_problems": report.problems,
        "rows_checked": report.rows_checked,
    }


def main() -> None:
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    before_teams(executor.loader.project_state(BEFORE).apps)
    executor = MigrationExecutor(connection)  # the graph again, as `migrate` would read it now
    executor.migrate(executor.loader.graph.leaf_nodes())
    print(json.dumps(after_teams()))


main()
