"""The routing snapshot: compiled from the rows routing reads (whose every change moves its version), and the
decisions it makes from them."""

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.utils import timezone

from handoff.models import HandoffRoute
from handoff.snapshot import snapshot_compile
from policy.config_version import config_version
from policy.decisions import Who
from policy.limits.admission import TeamLimits
from policy.models import Agent, Rule, ServerGroup, Team, TeamGroup
from registry.models import Tool, Upstream
from tests.factories import agent, team


@pytest.mark.parametrize(
    "change",
    [
        lambda: Agent.objects.create(name="version-probe"),
        lambda: ServerGroup.objects.create(name="version-probe"),
        lambda: Upstream.objects.create(slug="version-probe", transport="stdio", command="x"),
        lambda: Team.objects.create(slug="version-probe", name="Version probe"),
    ],
    ids=["agent", "group", "upstream", "team"],
)
def test_saving_and_deleting_a_routing_row_moves_the_version(db, change):
    before = config_version()
    row = change()
    saved = config_version()
    row.delete()
    assert before < saved < config_version()


def test_a_compiled_snapshot_holds_only_keys_of_enabled_agents_and_reachable_tools(world):
    snap = snapshot_compile()
    names = {entry.agent_name for entry in snap.keys.values()}
    assert "alice" in names and "mallory" not in names
    alice = next(entry.agent_id for entry in snap.keys.values() if entry.agent_name == "alice")
    denial, entry, upstream = snap.decide(alice, "demo__echo")
    assert (denial, entry.route.tool, upstream) == (None, "echo", "demo")
    names = {tool["name"] for tool in snap.visible_for(alice)}
    assert names >= {"demo__echo", "time__get_current_time", "every__echo"}
    assert snap.version == config_version()


def test_a_holder_told_to_look_again_looks_however_long_ago_the_machine_started(db, settings):
    """Monotonic time counts from boot: a holder that checks once a day (longer than this machine has been up)
    still reads the new version when asked for a newer one."""
    import anyio

    from handoff.snapshot import SnapshotHolder
    from policy.services import agent_create

    settings.GATEWAY_SNAPSHOT_CHECK_SECONDS = 86_400 * 365 * 100

    async def scenario() -> tuple[int, int, bool]:
        holder = SnapshotHolder()
        first = await holder.get()
        issued = await sync_to_async(agent_create)(name="late-comer")
        later = await holder.at_least(await sync_to_async(config_version)())
        return first.version, later.version, issued.agent.id in later.agents

    first, later, known = anyio.run(scenario)
    assert later > first and known


def _tools(upstream: Upstream, *names: str, approved: bool = True) -> None:
    """Tool rows as a catalog sync leaves them (no server is asked); not approved: changed since approval."""
    for name in names:
        definition = {"name": name, "description": f"The {name} tool.", "inputSchema": {"type": "object"}}
        digest, now = f"sha-{name}", timezone.now()
        pin = digest if approved else "sha-before"
        Tool.objects.create(
            upstream=upstream, name=name, definition=definition, definition_sha256=digest, approved_sha256=pin,
            last_seen_at=now,
        )  # fmt: skip


def test_a_snapshot_compiled_from_rows_decides_each_call_as_they_say(db):
    vault = ServerGroup.objects.create(name="snap-vault", isolation="strict")
    closed = ServerGroup.objects.create(name="snap-closed", enabled=False)
    files = Upstream.objects.create(slug="snap-files", transport="stdio", command="x", group=vault, calls_per_minute=7)
    shut = Upstream.objects.create(slug="snap-shut", transport="stdio", command="x", group=closed)
    hidden = Upstream.objects.create(slug="snap-spec", transport="streamable_http", url="http://x/", handoff_only=True)
    try:
        _tools(files, "read", "write")
        _tools(files, "changed", approved=False)
        _tools(shut, "read")
        _tools(hidden, "secret")
        with agent("snap-on") as (on, on_key), agent("snap-off", enabled=False) as (off, off_key):
            Rule.objects.create(effect="allow", agent=on, upstream=files)
            Rule.objects.create(effect="deny", agent=on, upstream=files, tool_pattern="wr*")
            snap, on_id, off_id, vault_id = snapshot_compile(), on.id, off.id, vault.id
    finally:
        for row in (files, shut, hidden, vault, closed):
            row.delete()

    assert snap.key_holder(on_key).agent_name == "snap-on" and snap.key_holder(off_key) is None
    assert on_id in snap.agents and off_id not in snap.agents
    denial, read, slug = snap.decide(on_id, "snap-files__read")
    assert (denial, read.route.tool, read.route.upstream_slug, slug) == (None, "read", "snap-files", "snap-files")
    assert (read.route.limits.strict_group, read.route.limits.calls_per_minute) == (vault_id, 7)
    assert read.route.limits.max_concurrent == settings.GATEWAY_UPSTREAM_MAX_CONCURRENT
    codes = {name: snap.decide(on_id, f"snap-files__{name}")[0] for name in ("write", "changed", "nope")}
    assert {name: denial.code for name, denial in codes.items()} == {
        "write": "POLICY_DENIED",
        "changed": "TOOL_PENDING_APPROVAL",
        "nope": "TOOL_NOT_FOUND",
    }
    assert snap.decide(on_id, "snap-shut__read")[0].code == "UPSTREAM_DISABLED"
    denial, entry, slug = snap.decide(on_id, "snap-spec__secret")  # a handoff target's tools are not exposed
    assert (denial.code, entry, slug) == ("TOOL_NOT_FOUND", None, "snap-spec")
    assert snap.decide(off_id, "snap-files__read")[0].code == "AGENT_DISABLED"
    visible = {tool["name"] for tool in snap.visible_for(on_id)}
    assert {name for name in visible if name.startswith("snap-")} == {"snap-files__read"}


def test_the_snapshot_knows_each_enabled_agents_team_by_slug(db):
    team = Team.objects.create(slug="payments", name="Payments")
    try:
        with agent("teamed", team=team) as (teamed, _), agent("plain") as (plain, _):
            snap = snapshot_compile()
            assert (snap.agent_teams[teamed.id], snap.agent_teams[plain.id]) == ("payments", "default")
    finally:
        team.delete()


def test_an_agent_reaches_its_teams_upstreams_and_those_shared_with_it_or_with_all(db):
    payments, ops = Team.objects.create(slug="payments", name="Payments"), Team.objects.create(slug="ops", name="Ops")
    ledger = Upstream.objects.create(slug="snap-ledger", transport="stdio", command="x", team=payments)
    try:
        _tools(ledger, "read")
        with agent("payer", team=payments) as (payer, _), agent("operator", team=ops) as (operator, _):
            alone = snapshot_compile()
            ledger.shared_with.add(ops)
            shared = snapshot_compile()
            ledger.shared_with.clear()
            Upstream.objects.filter(pk=ledger.pk).update(shared_with_all=True)
            everyone = snapshot_compile()
            ids = payer.id, operator.id
    finally:
        ledger.delete()
        payments.delete()
        ops.delete()

    def reach(snap, agent_id: int) -> tuple[str | None, bool]:
        denial = snap.decide(agent_id, "snap-ledger__read")[0]
        return denial and denial.code, "snap-ledger__read" in {tool["name"] for tool in snap.visible_for(agent_id)}

    assert [reach(snap, agent_id) for snap in (alone, shared, everyone) for agent_id in ids] == [
        (None, True),
        ("TOOL_NOT_FOUND", False),
        (None, True),
        (None, True),
        (None, True),
        (None, True),
    ]


def test_sharing_an_upstream_moves_the_version(db):
    payments, ops = Team.objects.create(slug="payments", name="Payments"), Team.objects.create(slug="ops", name="Ops")
    ledger = Upstream.objects.create(slug="snap-shared", transport="stdio", command="x", team=payments)
    try:
        before = config_version()
        ledger.shared_with.add(ops)
        shared = config_version()
        ledger.shared_with.remove(ops)
        assert before < shared < config_version()
    finally:
        ledger.delete()
        payments.delete()
        ops.delete()


def test_a_person_calls_through_a_teams_agent_only_as_a_member_once_the_team_asks(db):
    payments = Team.objects.create(slug="payments", name="Payments")
    upstream = Upstream.objects.create(slug="snap-member", transport="stdio", command="x", shared_with_all=True)
    try:
        _tools(upstream, "read")
        with agent("pays", team=payments) as (pays, _), agent("defaults") as (defaults, _):
            TeamGroup.objects.create(group="payers", team=payments, role="member")
            TeamGroup.objects.create(group="payers-audit", team=payments, role="auditor")
            before = snapshot_compile()
            TeamGroup.objects.create(group="everyone", team=Team.objects.get(slug="default"), role="admin")
            after = snapshot_compile()
            ids = pays.id, defaults.id
    finally:
        upstream.delete()
        payments.delete()
        TeamGroup.objects.filter(group="everyone").delete()
    person = ("https://idp.example.com", "erin")

    def code(snap, agent_id: int, **who) -> str | None:
        denial = snap.decide(Who(agent_id, **who), "snap-member__read")[0]
        return denial and denial.code

    assert before.team_groups["payers"] == frozenset({"payments"}) and "payers-audit" not in before.team_groups
    refused = before.decide(Who(ids[0], person), "snap-member__read")[0]
    assert (refused.code, refused.jsonrpc_code, refused.message) == (
        "TEAM_MEMBERSHIP_REQUIRED",
        -32001,
        "You are not a member of team 'payments', which this agent belongs to, so you may call none of its tools: "
        "ask the team's admin to map one of your groups to it.",
    )
    assert [
        code(before, ids[0], person=person, teams=frozenset({"payments"})),
        code(before, ids[0]),  # an API key names nobody: its agent's rules decide
        code(before, ids[1], person=person),  # the default team, no group mapped to it: as before teams
        code(after, ids[1], person=person),
        code(after, ids[1], person=person, teams=frozenset({"default"})),
    ] == [None, None, None, "TEAM_MEMBERSHIP_REQUIRED", None]
    assert "snap-member__read" not in {tool["name"] for tool in before.visible_for(Who(ids[0], person))}


def test_each_agent_counts_against_its_teams_limits_and_each_upstream_knows_its_owning_team(db):
    with team("capped", calls_per_minute=7, max_concurrent=3, daily_calls=500) as capped:
        with agent("capped-bot", team=capped) as (bot, _), agent("plain") as (plain, _):
            upstream = Upstream.objects.create(slug="capped-files", transport="stdio", command="x", team=capped)
            snap, ids = snapshot_compile(), (bot.id, plain.id, capped.id)
    bot_id, plain_id, capped_id = ids
    assert snap.agents[bot_id].team == TeamLimits(capped_id, "capped", 7, 3, 500)
    default = snap.agents[plain_id].team
    assert (default.slug, default.calls_per_minute, default.max_concurrent, default.daily_calls) == (
        "default",
        settings.GATEWAY_TEAM_CALLS_PER_MINUTE,
        settings.GATEWAY_TEAM_MAX_CONCURRENT,
        settings.GATEWAY_TEAM_DAILY_CALLS,
    )
    assert snap.targets["capped-files"].limits.team == capped_id == upstream.team_id


def test_a_teams_handoff_route_is_offered_to_its_own_agents_only(db):
    payments = Team.objects.create(slug="payments", name="Payments")
    desk = Upstream.objects.create(slug="snap-desk", transport="streamable_http", url="http://x/", handoff_only=True)
    route = HandoffRoute.objects.create(domain="snap-desk", description="Invoices.", target=desk, team=payments)
    try:
        with agent("payer", team=payments) as (payer, _), agent("other") as (other, _):
            snap, ids = snapshot_compile(), (payer.id, other.id)
    finally:
        route.delete()
        desk.delete()
        payments.delete()
    name = "switchboard__handoff_to_snap_desk"
    denials = [snap.gateway_denial(agent_id, name) for agent_id in ids]
    assert [denial and denial.code for denial in denials] == [None, "TOOL_NOT_FOUND"]
    assert [name in {tool["name"] for tool in snap.visible_for(agent_id)} for agent_id in ids] == [True, False]


def test_a_teams_rules_govern_only_its_own_agents_calls(db):
    payments = Team.objects.create(slug="payments", name="Payments")
    common = Upstream.objects.create(slug="snap-common", transport="stdio", command="x", shared_with_all=True)
    try:
        _tools(common, "read")
        with agent("payer", team=payments) as (payer, _), agent("other") as (other, _):
            Rule.objects.create(effect="deny", team=payments, upstream=common, note="payments keeps off it")
            snap, ids = snapshot_compile(), (payer.id, other.id)
    finally:
        Rule.objects.filter(team=payments).delete()
        common.delete()
        payments.delete()
    denials = [snap.decide(agent_id, "snap-common__read")[0] for agent_id in ids]
    assert [denial and denial.code for denial in denials] == ["POLICY_DENIED", None]
