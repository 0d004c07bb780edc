"""The routing snapshot: what the hot path reads (agent keys, exposed tool names, the tools/list payload),
compiled once per configuration version instead of queried on every request.

Any change bumps `ConfigVersion` in its own transaction (`config_changed`). Each process looks at the
version at most every GATEWAY_SNAPSHOT_CHECK_SECONDS and recompiles when it moved, so an admin's change
reaches every process within that time.
"""

import asyncio
import logging
import math
import time
from dataclasses import dataclass, field, replace
from typing import Any

from django.conf import settings
from django.db import Error as DatabaseError
from mcp.shared.exceptions import MCPError

from audit.models import DEFAULT_TEAM
from audit.outcomes import EXECUTOR_GRACE_SECONDS
from gateway_project.lib.database import BoundedRead, database_async
from handoff.codemode.tools import EXECUTE, SEARCH_TOOLS, execute_definition, search_tools_definition
from handoff.models import HandoffRoute
from handoff.triage import TriageTool, triage_tools
from policy.authorization import builtin_compile
from policy.config_version import config_version
from policy.decisions import (
    READ_ONLY,
    RETRY_LATER,
    UNSAID,
    CompiledRule,
    Denial,
    Explanation,
    Policy,
    SignOffTerms,
    Target,
    Who,
    policy_explain,
    reaches,
    tool_classes,
    who_of,
)
from policy.identity import Provider, people_disabled, providers_compile
from policy.keys import key_matches, key_split
from policy.limits.admission import AgentLimits, TeamLimits, UpstreamLimits
from policy.manifest import clean_text, manifest_sanitize
from policy.models import Agent, AgentGroup, AgentKey, Rule, ServerGroup, Team, TeamGroup, TeamRole
from registry.models import LocalPrefix, Tool, Upstream
from registry.naming import exposed_name, gateway_tool_name, split_exposed_name

logger = logging.getLogger(__name__)

HANDOFF_INPUT_SCHEMA = {
    "type": "object",
    "properties": {
        "reason": {"type": "string", "description": "Why this request belongs to the specialist"},
        "context": {"type": "object", "description": "What the specialist needs to know to carry on"},
    },
    "required": ["reason"],
}


@dataclass(frozen=True)
class Route:
    """Where an exposed tool name leads, and the limits that apply on the way."""

    upstream_id: int
    upstream_slug: str
    revision: int
    timeout: float
    tool: str
    limits: UpstreamLimits
    per_person: str = ""  # a per-person upstream's: how people connect (registry.models.Upstream.PersonConnect)


ANONYMOUS_KEY = "anonymous"  # what stands for the key of requests without credentials (GATEWAY_ANONYMOUS_AGENT)


@dataclass(frozen=True)
class KeyEntry:
    digest: str
    agent_id: int
    agent_name: str
    prefix: str
    revoked: bool = False
    expires_at: float = 0.0  # epoch seconds; 0: never
    tools: tuple[str, ...] = ()  # exposed-name patterns it may call; empty: all its agent may
    owner_id: int | None = None  # the console account of a personal key
    owner_name: str = ""


@dataclass(frozen=True)
class ToolEntry:
    route: Route
    target: Target
    definition: dict[str, Any]  # sanitised, under its exposed name
    sha256: str = ""  # of the upstream's definition: what derived texts (TypeScript) are cached by


@dataclass(frozen=True)
class UpstreamInfo:
    """What a handoff needs to know of a possible target."""

    id: int
    slug: str
    url: str
    reachable: bool
    group_id: int | None
    revision: int
    timeout: float
    limits: UpstreamLimits
    namespace: str  # "" for an unprefixed upstream
    handoff_only: bool
    per_person: str = ""  # as Route.per_person
    teams: frozenset[str] | None = None  # as Target.teams


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


@dataclass(frozen=True)
class Snapshot:
    version: int
    keys: dict[str, KeyEntry] = field(default_factory=dict)  # key prefix -> key of an enabled agent
    agents: dict[int, AgentLimits] = field(default_factory=dict)  # enabled agents
    agent_teams: dict[int, str] = field(default_factory=dict)  # enabled agent -> its team's slug
    tools: dict[str, ToolEntry] = field(default_factory=dict)  # exposed name -> every upstream's tools
    # A team's local prefixes for upstreams shared with it: its agents see those tools under local names instead.
    local: dict[str, dict[str, ToolEntry]] = field(default_factory=dict)  # team -> local name -> tool
    renamed: dict[str, frozenset[str]] = field(default_factory=dict)  # team -> exposed names it sees renamed
    prefixes: dict[str, dict[str, str]] = field(default_factory=dict)  # team -> local prefix -> upstream slug
    upstreams: dict[str, bool] = field(default_factory=dict)  # slug -> reachable
    policy: Policy = Policy()
    targets: dict[str, UpstreamInfo] = field(default_factory=dict)  # slug -> every upstream, as handoff target
    routes: dict[str, RouteSettings] = field(default_factory=dict)  # target slug -> its (first) route
    triage: dict[str, TriageEntry] = field(default_factory=dict)  # exposed name -> triage tool
    builtins: dict[str, GatewayTool] = field(default_factory=dict)  # exposed name -> code mode's tools
    anonymous: KeyEntry | None = None  # GATEWAY_ANONYMOUS_AGENT, while that agent exists and is enabled
    providers: dict[str, Provider] = field(default_factory=dict)  # identity providers by issuer
    builtin: Provider | None = None  # the built-in authorization server, while it is offered
    idp_groups: dict[str, frozenset[int]] = field(default_factory=dict)  # a person's group: agent groups it counts in
    team_groups: dict[str, frozenset[str]] = field(default_factory=dict)  # a group: teams it makes admin or member of
    mapped_teams: frozenset[str] = frozenset()  # teams any group is mapped to
    people_disabled: frozenset[tuple[str, str]] = frozenset()  # (issuer, subject) of people refused
    instructions: tuple[tuple[str, str], ...] = ()  # (slug, cleaned text) of upstreams that give instructions
    # Per-agent results, filled on first use; bounded by agents × known tools.
    _decisions: dict[tuple[Who, str], Explanation] = field(default_factory=dict, compare=False)
    _visible: dict[Who, tuple[dict[str, Any], ...]] = field(default_factory=dict, compare=False)
    memo: dict[str, Any] = field(default_factory=dict, compare=False)  # what others derive from it, once

    @property
    def signs_in(self) -> bool:
        """Whether people may sign in here (with an identity provider's token or the built-in server's)."""
        return bool(self.providers) or self.builtin is not None

    def key_holder(self, key: str) -> KeyEntry | None:
        """The enabled agent holding this API key, or None; constant-time (policy/keys.py)."""
        entry = self.key_entry(key)
        return entry if entry is not None and not entry.revoked else None

    def key_entry(self, key: str) -> KeyEntry | None:
        """This API key's entry, revoked or not, or None for a key never issued (or a wrong secret)."""
        parts = key_split(key)
        entry = self.keys.get(parts[0]) if parts else None
        return entry if parts and key_matches(entry.digest if entry else None, parts[1]) else None

    def decide(self, principal: int | Who, name: str) -> tuple[Denial | None, ToolEntry | None, str]:
        """The static decision for this agent (or person) and exposed name (policy/decisions.py), the tool
        when the name is known, and the upstream the name points at (for the audit)."""
        who = who_of(principal)
        entry = self.tool(who, name)
        if entry is None:
            target = self._unknown(name)
            return self._explain(who, target).denial, None, target.upstream_slug or ""
        return self._explained(who, entry).denial, entry, entry.route.upstream_slug

    def sign_off(self, principal: int | Who, entry: ToolEntry) -> SignOffTerms | None:
        """What a sign-off rule asks of a call to this tool (as `decide` found it) before it runs, if any."""
        grounds = self._explained(who_of(principal), entry).grounds
        return grounds.sign_off if grounds else None

    def _explained(self, who: Who, entry: ToolEntry) -> Explanation:
        key = (who, entry.target.exposed_name)
        if key not in self._decisions:
            self._decisions[key] = self._explain(who, entry.target)
        return self._decisions[key]

    def visible_for(self, principal: int | Who) -> tuple[dict[str, Any], ...]:
        """The tools/list payload for this agent (or person): only what it may call (in
        GATEWAY_CODE_MODE=only, code mode's tools instead of the upstreams'), and the gateway's own tools."""
        who = who_of(principal)
        if who not in self._visible:
            upstream_tools = () if settings.GATEWAY_CODE_MODE == "only" else self.allowed_tools(who)
            own = {**self.builtins, **self.triage}
            self._visible[who] = tuple(entry.definition for entry in upstream_tools) + tuple(
                entry.definition for name, entry in own.items() if not self.gateway_denial(who, name)
            )
        return self._visible[who]

    def allowed_tools(self, principal: int | Who) -> tuple[ToolEntry, ...]:
        tools = self.tools_for(principal)
        return tuple(entry for name, entry in tools.items() if self.decide(principal, name)[0] is None)

    def team_of(self, principal: int | Who) -> str:
        return self.agent_teams.get(who_of(principal).agent_id, "")

    def tool(self, principal: int | Who, name: str) -> ToolEntry | None:
        """The upstream tool this exposed name leads to for the agent's team: a borrowed upstream's tools under
        the team's local prefix for it, if it gave one, and no longer under the upstream's own namespace."""
        team = self.team_of(principal)
        if (entry := self.local.get(team, {}).get(name)) is not None:
            return entry
        return None if name in self.renamed.get(team, ()) else self.tools.get(name)

    def tools_for(self, principal: int | Who) -> dict[str, ToolEntry]:
        """Exposed name -> tool, as the agent's team names them (see `tool`)."""
        team = self.team_of(principal)
        if team not in self.local:
            return self.tools
        renamed = self.renamed[team]
        return {name: entry for name, entry in self.tools.items() if name not in renamed} | self.local[team]

    def namespace_for(self, principal: int | Who, target: "UpstreamInfo") -> str:
        """What the upstream's resource URIs and prompt names start with for the agent's team."""
        for prefix, slug in self.prefixes.get(self.team_of(principal), {}).items():
            if slug == target.slug:
                return prefix
        return target.namespace

    def namespaces_of(self, target: "UpstreamInfo") -> list[str]:
        """Every name teams see the upstream's resources under: its own namespace, and each local prefix for it."""
        local = [prefix for named in self.prefixes.values() for prefix, slug in named.items() if slug == target.slug]
        return [target.namespace, *local]

    def target_named(self, principal: int | Who, namespace: str) -> "UpstreamInfo | None":
        """The prefixed upstream whose namespace (or the team's local prefix for it) this is, for the agent's team."""
        team = self.team_of(principal)
        if (slug := self.prefixes.get(team, {}).get(namespace)) is not None:
            return self.targets.get(slug)
        target = self.targets.get(namespace)
        renamed = target is not None and target.slug in self.prefixes.get(team, {}).values()
        return target if target is not None and target.namespace and not renamed else None

    def gateway_denial(self, principal: int | Who, name: str) -> Denial | None:
        """Rules apply to the gateway's own tools too: a route's by its target upstream (and the tool name
        `handoff_to_<domain>`), a Python triage tool's or code mode's by its name alone."""
        key = (who_of(principal), name)
        if key not in self._decisions:
            own = self.triage.get(name) or self.builtins[name]
            self._decisions[key] = self._explain(key[0], own.policy_target)
        return self._decisions[key].denial

    def permits(self, principal: int | Who, target: UpstreamInfo, name: str, tool: str) -> Denial | None:
        """The static decision for what no catalog holds: a resource (`tool` its URI) or a prompt (its name),
        read-only; a specialist's tool during a handoff (`permitted`). The same rules as for any tool."""
        return self.permitted(principal, target, name, tool, frozenset({READ_ONLY})).denial

    def permitted(
        self, principal: int | Who, target: UpstreamInfo, name: str, tool: str, classes: frozenset[str] = UNSAID
    ) -> Explanation:
        """`permits`, with what it rests on; a tool seen by name only is in the classes of one that says nothing."""
        found = Target(
            name, target.slug, target.reachable, True, target.id, target.group_id, tool, teams=target.teams,
            classes=classes,
        )  # fmt: skip
        return self._explain(who_of(principal), found)

    def reachable(self, principal: int | Who, slug: str) -> bool:
        """Whether the agent's team may reach the upstream at all (its own, shared with it or with all)."""
        target = self.targets.get(slug)
        return target is not None and reaches(self.agent_teams.get(who_of(principal).agent_id, ""), target.teams)

    def explain(self, principal: int | Who, name: str) -> Explanation:
        """The static decision on any exposed name (an upstream's tool or the gateway's own), with the rule or
        stance it rests on: uncached, for an operator's question rather than a call."""
        who = who_of(principal)
        own = self.triage.get(name) or self.builtins.get(name)
        entry = self.tool(who, name)
        target = own.policy_target if own else entry.target if entry else self._unknown(name)
        enabled, team = who.agent_id in self.agents, self.agent_teams.get(who.agent_id, "")
        member = self.member(who, team)
        return policy_explain(
            policy=self.policy, agent_id=who, agent_enabled=enabled, target=target, team=team, member=member
        )

    def member(self, who: Who, team: str) -> bool:
        """Whether the person (if any) may call as one of `team`: their groups map them to it as admin or member.
        Every team asks it but the default one while no group is mapped to it (as the teams' migration leaves it)."""
        asks = team != DEFAULT_TEAM or team in self.mapped_teams
        return who.person is None or not asks or team in who.teams

    def _explain(self, who: Who, target: Target) -> Explanation:
        enabled, team = who.agent_id in self.agents, self.agent_teams.get(who.agent_id, "")
        member = self.member(who, team)
        return policy_explain(
            policy=self.policy, agent_id=who, agent_enabled=enabled, target=target, team=team, member=member
        )

    def _unknown(self, name: str) -> Target:
        parts = split_exposed_name(name)
        slug = parts[0] if parts and parts[0] in self.upstreams else None
        return Target(name, slug, self.upstreams.get(slug or "", False), False)


def _upstream_limits(upstream: Upstream) -> UpstreamLimits:
    group = upstream.group
    return UpstreamLimits(
        id=upstream.id,
        slug=upstream.slug,
        strict_group=group.id if group and group.isolation == ServerGroup.Isolation.STRICT else None,
        group_name=group.name if group else "",
        calls_per_minute=upstream.calls_per_minute or settings.GATEWAY_UPSTREAM_CALLS_PER_MINUTE,
        max_concurrent=upstream.max_concurrent or settings.GATEWAY_UPSTREAM_MAX_CONCURRENT,
        breaker_failures=upstream.breaker_failures or settings.GATEWAY_BREAKER_FAILURES,
        breaker_recovery=upstream.breaker_recovery or settings.GATEWAY_BREAKER_RECOVERY_SECONDS,
        probe_seconds=upstream.call_timeout + settings.GATEWAY_CONNECT_TIMEOUT + EXECUTOR_GRACE_SECONDS,
        team=upstream.team_id,
    )


def _team_limits(team: Team) -> TeamLimits:
    return TeamLimits(
        id=team.id,
        slug=team.slug,
        calls_per_minute=team.calls_per_minute or settings.GATEWAY_TEAM_CALLS_PER_MINUTE,
        max_concurrent=team.max_concurrent or settings.GATEWAY_TEAM_MAX_CONCURRENT,
        daily_calls=team.daily_calls or settings.GATEWAY_TEAM_DAILY_CALLS,
    )


def _teams(upstream: Upstream) -> frozenset[str] | None:
    """The teams whose agents may reach an upstream: its own and those it is shared with; None when shared with all."""
    if upstream.shared_with_all:
        return None
    return frozenset({upstream.team.slug, *(team.slug for team in upstream.shared_with.all())})


def _tools(upstreams: dict[int, Upstream], limits: dict[int, UpstreamLimits]) -> dict[str, ToolEntry]:
    tools = {}
    for tool in Tool.objects.filter(upstream__handoff_only=False).order_by("upstream__slug", "name"):
        upstream = upstreams[tool.upstream_id]
        name = exposed_name(upstream.namespace, tool.name)
        if name in tools:  # an unprefixed collision sync has not caught up with yet: the first slug keeps it
            continue
        route = Route(
            upstream.id,
            upstream.slug,
            upstream.revision,
            upstream.call_timeout,
            tool.name,
            limits[upstream.id],
            upstream.person_connect if upstream.per_person else "",
        )
        target = Target(
            exposed_name=name,
            upstream_slug=upstream.slug,
            upstream_enabled=upstream.is_reachable,
            tool_known=True,
            upstream_id=upstream.id,
            server_group_id=upstream.group_id,
            tool=tool.name,
            approved=tool.is_approved,
            teams=_teams(upstream),
            classes=tool_classes(tool.annotations),
        )
        definition = manifest_sanitize(tool.definition) | {"name": name}
        tools[name] = ToolEntry(route, target, definition, tool.definition_sha256)
    return tools


@dataclass
class LocalNames:
    local: dict[str, dict[str, ToolEntry]] = field(default_factory=dict)
    renamed: dict[str, frozenset[str]] = field(default_factory=dict)
    prefixes: dict[str, dict[str, str]] = field(default_factory=dict)


def _local_names(upstreams: dict[int, Upstream], tools: dict[str, ToolEntry]) -> LocalNames:
    """Each team's local prefixes for the upstreams shared with it (registry.models.LocalPrefix), and its tools
    under them; a prefix for an upstream not shared with the team (or its own) does nothing."""
    by_upstream: dict[int, list[tuple[str, ToolEntry]]] = {}
    for name, entry in tools.items():
        by_upstream.setdefault(entry.route.upstream_id, []).append((name, entry))
    names = LocalNames()
    for row in LocalPrefix.objects.select_related("team").order_by("team__slug", "prefix"):
        upstream, team = upstreams[row.upstream_id], row.team.slug
        teams = _teams(upstream)
        if upstream.team_id == row.team_id or (teams is not None and team not in teams):
            continue
        names.prefixes.setdefault(team, {})[row.prefix] = upstream.slug
        local = names.local.setdefault(team, {})
        renamed = set(names.renamed.get(team, ()))
        for name, entry in by_upstream.get(upstream.id, ()):
            own = exposed_name(row.prefix, entry.route.tool)
            definition = entry.definition | {"name": own}
            local[own] = ToolEntry(entry.route, replace(entry.target, exposed_name=own), definition, entry.sha256)
            renamed.add(name)
        names.renamed[team] = frozenset(renamed)
    return names


def _policy() -> Policy:
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
                sign_off=_sign_off_terms(rule),
            )
        )
    return Policy(rules=tuple(rules), default_allow=settings.GATEWAY_POLICY_DEFAULT == "allow")


def _sign_off_terms(rule: Rule) -> SignOffTerms | None:
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


def _idp_groups() -> dict[str, frozenset[int]]:
    found: dict[str, set[int]] = {}
    for group_id, names in AgentGroup.objects.exclude(idp_groups="").values_list("id", "idp_groups"):
        for name in names.split():
            found.setdefault(name, set()).add(group_id)
    return {name: frozenset(ids) for name, ids in found.items()}


def _team_groups() -> dict[str, frozenset[str]]:
    """Each group's teams where it gives a role that calls (admin or member; an auditor only reads)."""
    found: dict[str, set[str]] = {}
    calling = TeamGroup.objects.filter(role__in=(TeamRole.ADMIN, TeamRole.MEMBER))
    for group, team in calling.values_list("group", "team__slug"):
        found.setdefault(group, set()).add(team)
    return {group: frozenset(teams) for group, teams in found.items()}


def _route_settings(route: HandoffRoute) -> RouteSettings:
    return RouteSettings(route.id, route.domain, route.connect_timeout, route.max_sessions, route.idle_timeout)


def _triage() -> dict[str, TriageEntry]:
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
        entries[definition["name"]] = TriageEntry(definition, found, _route_settings(route), target.slug)
    for tool in triage_tools().values():
        name = gateway_tool_name(tool.name)
        definition = {"name": name, "description": tool.description, "inputSchema": tool.input_schema}
        found = Target(name, settings.GATEWAY_NAME, True, True, tool=tool.name, teams=tool.teams)
        entries[name] = TriageEntry(manifest_sanitize(definition), found, tool=tool)
    return entries


GATEWAY_UPSTREAM_ID = 0  # what admission keys the gateway's own tools under: no upstream has this id


def _gateway_limits() -> UpstreamLimits:
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


def _builtins() -> dict[str, GatewayTool]:
    if settings.GATEWAY_CODE_MODE == "off":
        return {}
    tools, limits = {}, _gateway_limits()
    for tool, definition in ((SEARCH_TOOLS, search_tools_definition()), (EXECUTE, execute_definition())):
        name = definition["name"]
        target = Target(name, settings.GATEWAY_NAME, True, True, tool=tool)
        # The route names the exposed name as its tool, as the rows of approved calls do.
        route = Route(GATEWAY_UPSTREAM_ID, settings.GATEWAY_NAME, 0, settings.GATEWAY_SANDBOX_TIMEOUT, name, limits)
        tools[name] = GatewayTool(definition, target, route)
    return tools


def _key_entry(key: AgentKey) -> KeyEntry:
    owner = key.owner
    return KeyEntry(
        key.digest,
        key.agent_id,
        key.agent.name,
        key.prefix,
        revoked=key.revoked,
        expires_at=key.expires_at.timestamp() if key.expires_at else 0.0,
        tools=tuple(key.tools.split()),
        owner_id=owner.pk if owner and owner.is_active else None,
        owner_name=(owner.get_full_name() or owner.get_username()) if owner else "",
    )


def snapshot_compile() -> Snapshot:
    version = config_version()  # read first: a change racing the compile leaves the version behind, not ahead
    # Revoked keys too, so that their holders are told so (a key revoked is known, unlike a key made up).
    keys = AgentKey.objects.filter(agent__enabled=True).select_related("agent", "owner")
    agents = Agent.objects.filter(enabled=True).select_related("team")
    upstreams = {u.id: u for u in Upstream.objects.select_related("group", "team").prefetch_related("shared_with")}
    limits = {upstream.id: _upstream_limits(upstream) for upstream in upstreams.values()}
    teams = {a.team_id: _team_limits(a.team) for a in agents}
    routes = {}
    for route in HandoffRoute.objects.filter(enabled=True).select_related("target").order_by("id"):
        routes.setdefault(route.target.slug, _route_settings(route))
    anonymous = settings.GATEWAY_ANONYMOUS_AGENT and agents.filter(name=settings.GATEWAY_ANONYMOUS_AGENT).first()
    tools = _tools(upstreams, limits)
    local = _local_names(upstreams, tools)
    return Snapshot(
        version=version,
        anonymous=KeyEntry("", anonymous.id, anonymous.name, ANONYMOUS_KEY) if anonymous else None,
        providers=providers_compile(),
        builtin=builtin_compile(),
        idp_groups=_idp_groups(),
        team_groups=_team_groups(),
        mapped_teams=frozenset(TeamGroup.objects.values_list("team__slug", flat=True)),
        people_disabled=people_disabled(),
        keys={k.prefix: _key_entry(k) for k in keys},
        agents={
            a.id: AgentLimits(
                calls_per_minute=a.calls_per_minute or settings.GATEWAY_AGENT_CALLS_PER_MINUTE,
                max_calls_per_session=a.max_calls_per_session or settings.GATEWAY_SESSION_MAX_CALLS,
                team=teams[a.team_id],
            )
            for a in agents
        },
        agent_teams={a.id: a.team.slug for a in agents},
        tools=tools,
        local=local.local,
        renamed=local.renamed,
        prefixes=local.prefixes,
        upstreams={u.slug: u.is_reachable for u in upstreams.values()},
        policy=_policy(),
        targets={
            u.slug: UpstreamInfo(
                u.id,
                u.slug,
                u.url,
                u.is_reachable,
                u.group_id,
                u.revision,
                u.call_timeout,
                limits[u.id],
                u.namespace,
                u.handoff_only,
                u.person_connect if u.per_person else "",
                _teams(u),
            )
            for u in upstreams.values()
        },
        routes=routes,
        triage=_triage(),
        builtins=_builtins(),
        instructions=tuple(
            (u.slug, clean_text(u.instructions, settings.GATEWAY_MAX_DESCRIPTION_CHARS))
            for u in sorted(upstreams.values(), key=lambda u: u.slug)
            if u.is_reachable and not u.handoff_only and u.instructions.strip()
        ),
    )


# Monotonic time counts from boot: "checked at 0.0" would read as "just checked" for the first check interval
# after a machine starts, so "never checked" is minus infinity.
NEVER = -math.inf
VERSION_READ_SECONDS = 2.0


class ConfigurationUnavailable(MCPError):
    """No snapshot yet, and the database cannot be read to make one."""

    def __init__(self) -> None:
        message = "The gateway cannot read its configuration right now. Retry after 1 second."
        super().__init__(RETRY_LATER, message, {"code": "CONFIGURATION_UNAVAILABLE", "retryAfter": 1.0})


class SnapshotHolder:
    def __init__(self) -> None:
        self._snapshot: Snapshot | None = None
        self._checked_at = NEVER
        self._lock: asyncio.Lock | None = None
        # Requests wait behind this read: a database that does not answer one row quickly counts as down.
        self._version = BoundedRead(database_async(config_version), VERSION_READ_SECONDS)

    @property
    def latest(self) -> Snapshot | None:
        """The snapshot compiled last, for what must be read without waiting (it lags by at most a check)."""
        return self._snapshot

    def fresh_ms(self) -> int:
        """How long what this process serves from its snapshot stays its newest word: the milliseconds until it looks
        at the version again (a list's `ttlMs`: a client reusing it meanwhile lags no more than the gateway does)."""
        if self._checked_at == NEVER:  # a change was announced: look again before anything is reused
            return 0
        return max(0, int((self._checked_at + settings.GATEWAY_SNAPSHOT_CHECK_SECONDS - time.monotonic()) * 1000))

    def invalidate(self) -> None:
        """Look at the version on the next read (a change was announced that this process did not make)."""
        self._checked_at = NEVER

    async def at_least(self, version: int) -> Snapshot:
        """The snapshot, looked at again first if it is older than `version`: work sent by another process
        (an execution on a worker) is decided on what that process had already seen, not a second older."""
        if self._snapshot and self._snapshot.version < version:
            self.invalidate()
        return await self.get()

    async def get(self) -> Snapshot:
        if self._snapshot and time.monotonic() - self._checked_at < settings.GATEWAY_SNAPSHOT_CHECK_SECONDS:
            return self._snapshot
        self._lock = self._lock or asyncio.Lock()
        async with self._lock:
            if not self._snapshot or time.monotonic() - self._checked_at >= settings.GATEWAY_SNAPSHOT_CHECK_SECONDS:
                await self._refresh()
        assert self._snapshot is not None
        return self._snapshot

    async def _refresh(self) -> None:
        """Compile again if the version moved. While the database cannot be read (a restart, say), the last
        snapshot goes on serving, and the next check is a check interval later."""
        try:
            version = await self._version()
            if not self._snapshot or version != self._snapshot.version:
                self._snapshot = await database_async(snapshot_compile)()
        except (DatabaseError, TimeoutError) as exc:
            if self._snapshot is None:
                raise ConfigurationUnavailable() from exc
            logger.warning("configuration unreadable (%s): serving version %s meanwhile", exc, self._snapshot.version)
        self._checked_at = time.monotonic()


snapshot = SnapshotHolder()
