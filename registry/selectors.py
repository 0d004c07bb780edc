"""Reads over upstreams and their catalog, returning plain data for async callers."""

from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db.models import Exists, Q

from policy.decisions import Target
from policy.models import Agent
from registry.models import Tool, Upstream
from registry.naming import exposed_name, split_exposed_name

REACHABLE = Q(upstream__enabled=True) & (Q(upstream__group__isnull=True) | Q(upstream__group__enabled=True))


@dataclass(frozen=True)
class Route:
    """Where an exposed tool name leads."""

    upstream_id: int
    upstream_slug: str
    revision: int
    timeout: float
    tool: str


def catalog_list_visible() -> list[dict[str, Any]]:
    """Every tool of every reachable upstream, as the agent sees it (exposed name, definition otherwise)."""
    rows = Tool.objects.filter(REACHABLE).select_related("upstream").order_by("upstream__slug", "name")
    return [row.definition | {"name": exposed_name(row.upstream.slug, row.name)} for row in rows]


def _shortened(upstream: Upstream, name: str) -> Tool | None:
    """A name cut to the maximum length can only be one of its upstream's long tool names."""
    if len(name) != settings.GATEWAY_MAX_TOOL_NAME:
        return None
    return next((t for t in upstream.tools.all() if exposed_name(upstream.slug, t.name) == name), None)


def tool_route(*, name: str, agent_id: int) -> tuple[Target, Route | None, bool]:
    """The decision's view of an exposed name, the route to run it when there is one, and whether the
    agent is still enabled: one query on the path every allowed call takes."""
    parts = split_exposed_name(name)
    if parts is None:
        return Target(name, None, False, False), None, _agent_enabled(agent_id)
    agent_enabled = Exists(Agent.objects.filter(pk=agent_id, enabled=True))
    tool = (Tool.objects.select_related("upstream__group").annotate(agent_enabled=agent_enabled)
            .filter(upstream__slug=parts[0], name=parts[1]).first())
    if tool is None:
        upstream = Upstream.objects.select_related("group").filter(slug=parts[0]).first()
        tool = _shortened(upstream, name) if upstream else None
        if tool is None:
            slug = upstream.slug if upstream else None
            target = Target(name, slug, bool(upstream and upstream.is_reachable), False)
            return target, None, _agent_enabled(agent_id)
        tool.agent_enabled = _agent_enabled(agent_id)
    upstream = tool.upstream
    target = Target(name, upstream.slug, upstream.is_reachable, True)
    route = Route(upstream.id, upstream.slug, upstream.revision, upstream.timeout, tool.name)
    return target, route, tool.agent_enabled


def _agent_enabled(agent_id: int) -> bool:
    return Agent.objects.filter(pk=agent_id, enabled=True).exists()
