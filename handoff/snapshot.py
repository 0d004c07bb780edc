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
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import Error as DatabaseError
from mcp.shared.exceptions import MCPError

from audit.models import DEFAULT_TEAM
from gateway_project.lib.database import BoundedRead, database_async
from handoff.models import HandoffRoute
from handoff.snapshot_policy import (
    GatewayTool,
    RouteSettings,
    TriageEntry,
    builtins_compile,
    idp_groups_compile,
    policy_compile,
    route_settings,
    team_groups_compile,
    triage_compile,
)
from handoff.snapshot_tools import (
    ServerTool,
    ServerView,
    ToolEntry,
    local_names_compile,
    server_tools_compile,
    server_view,
    tools_compile,
    upstream_limits,
    upstream_teams,
)
from policy.authorization import builtin_compile
from policy.config_version import config_version
from policy.decisions import (
    READ_ONLY,
    RETRY_LATER,
    UNSAID,
    Denial,
    Explanation,
    Policy,
    SignOffTerms,
    Target,
    Who,
    policy_explain,
    reaches,
    who_of,
)
from policy.identity import Provider, people_disabled, providers_compile
from policy.keys import key_matches, key_split
from policy.limits.admission import AgentLimits, TeamLimits, UpstreamLimits
from policy.manifest import clean_text
from policy.models import Agent, AgentKey, Team, TeamGroup
from policy.patterns import name_matches
from registry.models import Upstream, VirtualServer
from registry.naming import split_exposed_name

logger = logging.getLogger(__name__)


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
class ServerEntry:
    """A virtual server (registry.models.VirtualServer), as its endpoint serves it."""

    name: str
    team: str
    title: str
    instructions: str  # cleaned like an upstream's
    tools: tuple[str, ...]  # exposed-name patterns it offers
    resources: tuple[str, ...] = ()  # exposed-URI patterns (resources and resource templates)
    prompts: tuple[str, ...] = ()  # exposed-name patterns
    overrides: dict[tuple[int, str], ServerTool] = field(default_factory=dict)  # its own, by (upstream id, tool)


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
    servers: dict[str, ServerEntry] = field(default_factory=dict)  # name -> enabled virtual server
    # Per-agent results, filled on first use; bounded by agents × known tools.
    _decisions: dict[tuple[Who, str], Explanation] = field(default_factory=dict, compare=False)
    _visible: dict[Who, tuple[dict[str, Any], ...]] = field(default_factory=dict, compare=False)
    memo: dict[str, Any] = field(default_factory=dict, compare=False)  # what others derive from it, once

    def offers(self, server: str, kind: str, exposed: str) -> bool:
        """Whether the virtual server (none: /mcp, which offers all) offers this resource or prompt (`kind`)."""
        if not server:
            return True
        entry = self.servers.get(server)
        return entry is not None and name_matches(exposed, getattr(entry, kind))

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
        the team's local prefix for it, if it gave one, and no longer under the upstream's own namespace; through a
        virtual server with overrides, under the names it gives them."""
        if (view := self.server_view(principal)) is not None:
            return view.tools.get(name)
        team = self.team_of(principal)
        if (entry := self.local.get(team, {}).get(name)) is not None:
            return entry
        return None if name in self.renamed.get(team, ()) else self.tools.get(name)

    def tools_for(self, principal: int | Who) -> dict[str, ToolEntry]:
        """Exposed name -> tool, as the agent's team (and virtual server) names them (see `tool`)."""
        if (view := self.server_view(principal)) is not None:
            return view.tools
        team = self.team_of(principal)
        if team not in self.local:
            return self.tools
        renamed = self.renamed[team]
        return {name: entry for name, entry in self.tools.items() if name not in renamed} | self.local[team]

    def server_view(self, principal: int | Who) -> ServerView | None:
        """The tools as the virtual server the caller came through presents them, when it overrides any (made once
        per team and server)."""
        who = who_of(principal)
        server = self.servers.get(who.server)
        if server is None or not server.overrides:
            return None
        key = ("server_view", self.team_of(who), who.server)
        if (view := self.memo.get(key)) is None:
            plain = self.tools_for(Who(who.agent_id))
            view = self.memo[key] = server_view(
                plain, server.overrides, lambda entry: self.namespace_for(who, self.targets[entry.route.upstream_slug])
            )
        return view

    def listed_name(self, principal: int | Who, name: str) -> str:
        """The name /mcp lists a tool under for the caller, that its virtual server shows as `name`: what the server's
        offers and an API key's patterns match."""
        view = self.server_view(principal)
        return view.listed.get(name, name) if view is not None else name

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


def _team_limits(team: Team) -> TeamLimits:
    return TeamLimits(
        id=team.id,
        slug=team.slug,
        calls_per_minute=team.calls_per_minute or settings.GATEWAY_TEAM_CALLS_PER_MINUTE,
        max_concurrent=team.max_concurrent or settings.GATEWAY_TEAM_MAX_CONCURRENT,
        daily_calls=team.daily_calls or settings.GATEWAY_TEAM_DAILY_CALLS,
    )


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
    limits = {upstream.id: upstream_limits(upstream) for upstream in upstreams.values()}
    teams = {a.team_id: _team_limits(a.team) for a in agents}
    routes = {}
    for route in HandoffRoute.objects.filter(enabled=True).select_related("target").order_by("id"):
        routes.setdefault(route.target.slug, route_settings(route))
    anonymous = settings.GATEWAY_ANONYMOUS_AGENT and agents.filter(name=settings.GATEWAY_ANONYMOUS_AGENT).first()
    tools = tools_compile(upstreams, limits)
    local = local_names_compile(upstreams, tools)
    return Snapshot(
        version=version,
        anonymous=KeyEntry("", anonymous.id, anonymous.name, ANONYMOUS_KEY) if anonymous else None,
        providers=providers_compile(),
        builtin=builtin_compile(),
        idp_groups=idp_groups_compile(),
        team_groups=team_groups_compile(),
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
        policy=policy_compile(),
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
                upstream_teams(u),
            )
            for u in upstreams.values()
        },
        routes=routes,
        triage=triage_compile(),
        builtins=builtins_compile(),
        instructions=tuple(
            (u.slug, clean_text(u.instructions, settings.GATEWAY_MAX_DESCRIPTION_CHARS))
            for u in sorted(upstreams.values(), key=lambda u: u.slug)
            if u.is_reachable and not u.handoff_only and u.instructions.strip()
        ),
        servers={s.name: _server_entry(s) for s in VirtualServer.objects.filter(enabled=True).select_related("team")},
    )


def _server_entry(server: VirtualServer) -> ServerEntry:
    instructions = clean_text(server.instructions, settings.GATEWAY_MAX_DESCRIPTION_CHARS)
    offered = (tuple(server.tools), tuple(server.resources), tuple(server.prompts))
    own = server_tools_compile(server)
    return ServerEntry(server.name, server.team.slug, server.title, instructions, *offered, own)


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
