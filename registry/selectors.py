"""Reads over upstreams, their tools and teams: the names each team's agents see (issue 36, names across teams).

A team sees its own upstreams, those shared with it and those shared with all; each under the upstream's
namespace, or under the team's local prefix for it (`LocalPrefix`). Two upstreams a team sees may not expose
one name to it: sharing, a local prefix and catalog sync are refused when they would.
"""

from collections.abc import Iterable

from django.db.models import Q, QuerySet

from policy.models import Team
from registry.models import LocalPrefix, Tool, Upstream
from registry.naming import exposed_name


def upstreams_seen(*, team: Team) -> QuerySet[Upstream]:
    """The upstreams whose tools the team's agents reach: its own, shared with it, shared with all."""
    seen = Q(team=team) | Q(shared_with=team) | Q(shared_with_all=True)
    return Upstream.objects.filter(seen).distinct()


def teams_seeing(*, upstream: Upstream) -> list[Team]:
    """The teams whose agents reach the upstream: its own and its borrowers (every team when shared with all)."""
    if upstream.shared_with_all:
        return list(Team.objects.order_by("slug"))
    return [upstream.team, *upstream.shared_with.order_by("slug")]


def namespace_of(*, upstream: Upstream, team: Team) -> str:
    """What the upstream's names start with for the team: its local prefix for a borrowed upstream, if it gave one."""
    if upstream.team_id != team.id:
        local = LocalPrefix.objects.filter(upstream=upstream, team=team).values_list("prefix", flat=True).first()
        if local:
            return local
    return upstream.namespace


def team_names(*, team: Team, leave_out: Upstream | None = None) -> dict[str, str]:
    """Exposed name -> the slug of the upstream it leads to, for the team's agents (`leave_out`'s tools aside)."""
    prefixes = dict(LocalPrefix.objects.filter(team=team).values_list("upstream_id", "prefix"))
    seen = upstreams_seen(team=team).filter(handoff_only=False)
    if leave_out is not None:
        seen = seen.exclude(pk=leave_out.pk)
    names = {}
    for tool in Tool.objects.filter(upstream__in=seen).select_related("upstream", "override"):
        upstream = tool.upstream
        own = upstream.team_id == team.id
        namespace = upstream.namespace if own else prefixes.get(upstream.id) or upstream.namespace
        names.setdefault(exposed_name(namespace, tool.own_name), upstream.slug)
    return names


def name_collisions(*, upstream: Upstream, team: Team, namespace: str, tools: Iterable[str] | None = None) -> list[str]:
    """The upstream's exposed names under `namespace` that the team's agents already see from another upstream.
    `tools`: the upstream's tool names (default: its catalog, as its overrides name it)."""
    if upstream.handoff_only:
        return []
    names = tools if tools is not None else [tool.own_name for tool in upstream.tools.select_related("override")]
    taken = team_names(team=team, leave_out=upstream)
    return sorted({exposed_name(namespace, name) for name in names} & set(taken))


def share_collisions(*, upstream: Upstream, teams: Iterable[Team]) -> dict[str, list[str]]:
    """Team slug -> the names it already uses that sharing the upstream with it would expose again."""
    found = {}
    for team in teams:
        if team.id == upstream.team_id:
            continue
        if names := name_collisions(upstream=upstream, team=team, namespace=namespace_of(upstream=upstream, team=team)):
            found[team.slug] = names
    return found
