"""The snapshot's upstream tools: each exposed name's route, policy target and sanitised definition, and each
team's local names for the upstreams shared with it (handoff/snapshot.py compiles them into a `Snapshot`)."""

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from django.conf import settings

from audit.outcomes import EXECUTOR_GRACE_SECONDS
from policy.decisions import Target, tool_classes
from policy.limits.admission import UpstreamLimits
from policy.manifest import manifest_sanitize
from policy.models import ServerGroup
from registry.models import LocalPrefix, ServerToolOverride, Tool, Upstream, VirtualServer
from registry.naming import exposed_name
from registry.overrides import Override, override_stack


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


@dataclass(frozen=True)
class ToolEntry:
    route: Route
    target: Target
    definition: dict[str, Any]  # sanitised, under its exposed name, its owner's override applied
    sha256: str = ""  # of the upstream's definition: what a sign-off binds
    override: Override | None = None  # how the owner presents it (registry/overrides.py)

    @property
    def shape(self) -> str:
        """What derived texts (TypeScript, the search index) are cached by: the upstream's definition and override."""
        return f"{self.sha256}:{self.override.digest}" if self.override else self.sha256

    @property
    def own_name(self) -> str:
        """The name after the namespace: the override's, or the upstream's."""
        return (self.override and self.override.name) or self.route.tool


def upstream_limits(upstream: Upstream) -> UpstreamLimits:
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


def upstream_teams(upstream: Upstream) -> frozenset[str] | None:
    """The teams whose agents may reach an upstream: its own and those it is shared with; None when shared with all."""
    if upstream.shared_with_all:
        return None
    return frozenset({upstream.team.slug, *(team.slug for team in upstream.shared_with.all())})


def tools_compile(upstreams: dict[int, Upstream], limits: dict[int, UpstreamLimits]) -> dict[str, ToolEntry]:
    tools = {}
    listed = Tool.objects.filter(upstream__handoff_only=False).select_related("override")
    for tool in listed.order_by("upstream__slug", "name"):
        upstream = upstreams[tool.upstream_id]
        override = tool.override.value() if hasattr(tool, "override") else None
        shown = override.definition(tool.definition) if override else tool.definition
        name = exposed_name(upstream.namespace, (override and override.name) or tool.name)
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
            teams=upstream_teams(upstream),
            classes=tool_classes(shown.get("annotations")),  # the owner's word, where it overrides the upstream's
        )
        definition = manifest_sanitize(shown) | {"name": name}
        tools[name] = ToolEntry(route, target, definition, tool.definition_sha256, override)
    return tools


@dataclass
class LocalNames:
    local: dict[str, dict[str, ToolEntry]] = field(default_factory=dict)
    renamed: dict[str, frozenset[str]] = field(default_factory=dict)
    prefixes: dict[str, dict[str, str]] = field(default_factory=dict)


def local_names_compile(upstreams: dict[int, Upstream], tools: dict[str, ToolEntry]) -> LocalNames:
    """Each team's local prefixes for the upstreams shared with it (registry.models.LocalPrefix), and its tools
    under them; a prefix for an upstream not shared with the team (or its own) does nothing."""
    by_upstream: dict[int, list[tuple[str, ToolEntry]]] = {}
    for name, entry in tools.items():
        by_upstream.setdefault(entry.route.upstream_id, []).append((name, entry))
    names = LocalNames()
    for row in LocalPrefix.objects.select_related("team").order_by("team__slug", "prefix"):
        upstream, team = upstreams[row.upstream_id], row.team.slug
        teams = upstream_teams(upstream)
        if upstream.team_id == row.team_id or (teams is not None and team not in teams):
            continue
        names.prefixes.setdefault(team, {})[row.prefix] = upstream.slug
        local = names.local.setdefault(team, {})
        renamed = set(names.renamed.get(team, ()))
        for name, entry in by_upstream.get(upstream.id, ()):
            own = exposed_name(row.prefix, entry.own_name)
            local[own] = replace(
                entry, target=replace(entry.target, exposed_name=own), definition=entry.definition | {"name": own}
            )
            renamed.add(name)
        names.renamed[team] = frozenset(renamed)
    return names


@dataclass(frozen=True)
class ServerTool:
    """A tool as a virtual server's own override presents it (on the upstream's): the same under any name."""

    override: Override  # the two stacked (registry/overrides.py)
    definition: dict[str, Any]  # sanitised, before it is named
    classes: frozenset[str]


def server_tools_compile(server: VirtualServer) -> dict[tuple[int, str], ServerTool]:
    """(upstream id, the upstream's tool name) -> how the server presents that tool, for each it overrides."""
    rows = ServerToolOverride.objects.filter(server=server).select_related("tool__override")
    compiled = {}
    for row in rows:
        tool = row.tool
        stacked = override_stack(tool.override.value() if hasattr(tool, "override") else None, row.value())
        shown = stacked.definition(tool.definition)
        own = ServerTool(stacked, manifest_sanitize(shown), tool_classes(shown.get("annotations")))
        compiled[(tool.upstream_id, tool.name)] = own
    return compiled


@dataclass(frozen=True)
class ServerView:
    tools: dict[str, ToolEntry]  # exposed name -> tool, as the virtual server's sessions see them
    listed: dict[str, str]  # a name only the server shows -> the name /mcp lists the tool under (what offers match)


def server_view(
    tools: dict[str, ToolEntry], overrides: dict[tuple[int, str], ServerTool], namespace: Callable[[ToolEntry], str]
) -> ServerView:
    """The caller's tools (`tools`, as their team names them) with the server's overrides applied; a name the
    server gives that another tool has already (a collision its checks have not caught up with) stays that tool's."""
    shown, listed, renamed = {}, {}, []
    for name, entry in tools.items():
        own = overrides.get((entry.route.upstream_id, entry.route.tool))
        if own is None:
            shown[name] = entry
            continue
        new = exposed_name(namespace(entry), own.override.name or entry.route.tool)
        target = replace(entry.target, exposed_name=new, classes=own.classes)
        definition = own.definition | {"name": new}
        renamed.append((name, new, replace(entry, target=target, definition=definition, override=own.override)))
    for name, new, entry in renamed:
        if new not in shown:
            shown[new] = entry
            listed[new] = name
    return ServerView(shown, listed)
