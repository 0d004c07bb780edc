"""The snapshot's policy and the gateway's own tools: compiled rules and sign-off terms, the groups an identity
provider's people map to, handoff routes and triage tools, and code mode's tools (handoff/snapshot.py)."""

from dataclasses import dataclass
from typing import Any

from django.conf import settings

from audit.outcomes import EXECUTOR_GRACE_SECONDS
from handoff.codemode.tools import EXECUTE, SEARCH_TOOLS, execute_definition, search_tools_definition
from handoff.models import HandoffRoute
from handoff.snapshot_tools import Route
from handoff.triage import TriageTool, triage_tools
from policy.decisions import CompiledRule, Policy, SignOffTerms, Target
from policy.limits.admission import UpstreamLimits
from policy.manifest import clean_text, manifest_sanitize
from policy.models import Agent, AgentGroup, Rule, TeamGroup, TeamRole
from registry.naming import gateway_tool_name

HANDOFF_INPUT_SCHEMA = {
    "type": "object",
    "properties": {
        "reason": {"type": "string", "description": "Why this request belongs to the specialist"},
        "context": {"type": "object", "description": "What the specialist needs to know to carry on"},
    },
    "required": ["reason"],
}


@dataclass(frozen=True)
class RouteSettings:
    """A handoff route's limits, or the deployment's defaults for a handoff no route names."""

    route_id: int | None
    domain: str
    connect_timeout: float
    max_sessions: int
    idle_timeout: float


@dataclass(frozen=True)
class TriageEntry:
    """A gateway tool that can hand the session over: an admin route, or a Python triage tool."""

    definition: dict[str, Any]
    policy_target: Target  # what rules match: the route's target upstream, or the gateway's own tool
    route: RouteSettings | None = None
    target: str = ""  # a route's target upstream slug
    tool: TriageTool | None = None


@dataclass(frozen=True)
class GatewayTool:
    """A tool of the gateway's own that no handoff hides (code mode's)."""

    definition: dict[str, Any]
    policy_target: Target  # rules match it by its name, under the gateway's namespace
    route: "Route"  # what admission counts it against: the agent's limits, and the gateway's own


def policy_compile() -> Policy:
    members: dict[int, set[int]] = {}
    for group_id, agent_id in AgentGroup.agents.through.objects.values_list("agentgroup_id", "agent_id"):
        members.setdefault(group_id, set()).add(agent_id)
    teams: dict[int, set[int]] = {}
    for team_id, agent_id in Agent.objects.values_list("team_id", "id"):
        teams.setdefault(team_id, set()).add(agent_id)
    rules = []
    for rule in Rule.objects.filter(enabled=True).select_related("person"):
        agents = None
        if rule.agent_id or rule.agent_group_id or rule.person_id:
            agents = frozenset(({rule.agent_id} if rule.agent_id else set()) | members.get(rule.agent_group_id, set()))
        rules.append(
            CompiledRule.build(
                allow=rule.effect != Rule.Effect.DENY,
                agents=agents,
                upstream_id=rule.upstream_id,
                server_group_id=rule.server_group_id,
                tool_pattern=rule.tool_pattern,
                groups=frozenset({rule.agent_group_id} if rule.agent_group_id else ()),
                people=frozenset({(rule.person.issuer, rule.person.subject)} if rule.person else ()),
                rule_id=rule.id,
                note=rule.note,
                team_agents=frozenset(teams.get(rule.team_id, ())),
                tool_class=rule.tool_class,
                sign_off=sign_off_terms(rule),
            )
        )
    return Policy(rules=tuple(rules), default_allow=settings.GATEWAY_POLICY_DEFAULT == "allow")


def sign_off_terms(rule: Rule) -> SignOffTerms | None:
    if rule.effect != Rule.Effect.SIGN_OFF:
        return None
    return SignOffTerms(
        rule_id=rule.id,
        rule_version=rule.version,
        signers=rule.signers_id,
        four_eyes=rule.four_eyes,
        wait=float(rule.sign_off_wait or settings.GATEWAY_SIGN_OFF_WAIT_SECONDS),
        valid=float(rule.sign_off_valid or settings.GATEWAY_SIGN_OFF_VALID_SECONDS),
        by_form=rule.sign_off_by_form,
    )


def idp_groups_compile() -> dict[str, frozenset[int]]:
    found: dict[str, set[int]] = {}
    for group_id, names in AgentGroup.objects.exclude(idp_groups="").values_list("id", "idp_groups"):
        for name in names.split():
            found.setdefault(name, set()).add(group_id)
    return {name: frozenset(ids) for name, ids in found.items()}


def team_groups_compile() -> dict[str, frozenset[str]]:
    """Each group's teams where it gives a role that calls (admin or member; an auditor only reads)."""
    found: dict[str, set[str]] = {}
    calling = TeamGroup.objects.filter(role__in=(TeamRole.ADMIN, TeamRole.MEMBER))
    for group, team in calling.values_list("group", "team__slug"):
        found.setdefault(group, set()).add(team)
    return {group: frozenset(teams) for group, teams in found.items()}


def route_settings(route: HandoffRoute) -> RouteSettings:
    return RouteSettings(route.id, route.domain, route.connect_timeout, route.max_sessions, route.idle_timeout)


def triage_compile() -> dict[str, TriageEntry]:
    """Admin routes, then Python triage tools, as gateway tools `<gateway><sep><name>`."""
    entries = {}
    for route in HandoffRoute.objects.filter(enabled=True).select_related("target__group", "team"):
        tool = f"handoff_to_{route.domain.replace('-', '_')}"
        definition = {
            "name": gateway_tool_name(tool),
            "title": f"Hand off to {route.domain}",
            "description": clean_text(route.description, settings.GATEWAY_MAX_DESCRIPTION_CHARS),
            "inputSchema": HANDOFF_INPUT_SCHEMA,
        }
        target = route.target
        # A team's route is offered to its own agents only.
        found = Target(
            definition["name"], target.slug, target.is_reachable, True, target.id, target.group_id, tool,
            teams=frozenset({route.team.slug}),
        )  # fmt: skip
        entries[definition["name"]] = TriageEntry(definition, found, route_settings(route), target.slug)
    for tool in triage_tools().values():
        name = gateway_tool_name(tool.name)
        definition = {"name": name, "description": tool.description, "inputSchema": tool.input_schema}
        found = Target(name, settings.GATEWAY_NAME, True, True, tool=tool.name, teams=tool.teams)
        entries[name] = TriageEntry(manifest_sanitize(definition), found, tool=tool)
    return entries


GATEWAY_UPSTREAM_ID = 0  # what admission keys the gateway's own tools under: no upstream has this id


def gateway_limits() -> UpstreamLimits:
    """Code mode's tools are counted like calls to an upstream with the default limits, besides the agent's
    own: so an agent's rate and session caps hold for executions too. No breaker opens on them, since
    their release reports no health."""
    return UpstreamLimits(
        id=GATEWAY_UPSTREAM_ID,
        slug=settings.GATEWAY_NAME,
        strict_group=None,
        group_name="",
        calls_per_minute=settings.GATEWAY_UPSTREAM_CALLS_PER_MINUTE,
        max_concurrent=settings.GATEWAY_UPSTREAM_MAX_CONCURRENT,
        breaker_failures=settings.GATEWAY_BREAKER_FAILURES,
        breaker_recovery=settings.GATEWAY_BREAKER_RECOVERY_SECONDS,
        probe_seconds=settings.GATEWAY_SANDBOX_TIMEOUT + EXECUTOR_GRACE_SECONDS,
    )


def builtins_compile() -> dict[str, GatewayTool]:
    if settings.GATEWAY_CODE_MODE == "off":
        return {}
    tools, limits = {}, gateway_limits()
    for tool, definition in ((SEARCH_TOOLS, search_tools_definition()), (EXECUTE, execute_definition())):
        name = definition["name"]
        target = Target(name, settings.GATEWAY_NAME, True, True, tool=tool)
        # The route names the exposed name as its tool, as the rows of approved calls do.
        route = Route(GATEWAY_UPSTREAM_ID, settings.GATEWAY_NAME, 0, settings.GATEWAY_SANDBOX_TIMEOUT, name, limits)
        tools[name] = GatewayTool(definition, target, route)
    return tools
