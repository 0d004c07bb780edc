"""Reads over upstreams and their catalog, returning plain data for async callers."""

from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db.models import Q

from policy.decisions import Target
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


def _find_tool(upstream: Upstream, name: str, tool_part: str) -> Tool | None:
    tool = upstream.tools.filter(name=tool_part).first()
    if tool is None and len(name) == settings.GATEWAY_MAX_TOOL_NAME:
        # A shortened name: it can only be one of this upstream's long tool names.
        tool = next((t for t in upstream.tools.all() if exposed_name(upstream.slug, t.name) == name), None)
    return tool


def tool_route(*, name: str) -> tuple[Target, Route | None]:
    """The decision's view of an exposed name, and the route to run it when there is one."""
    parts = split_exposed_name(name)
    upstream = Upstream.objects.select_related("group").filter(slug=parts[0]).first() if parts else None
    if parts is None or upstream is None:
        return Target(name, None, False, False), None
    tool = _find_tool(upstream, name, parts[1])
    target = Target(name, upstream.slug, upstream.is_reachable, tool is not None)
    if tool is None:
        return target, None
    return target, Route(upstream.id, upstream.slug, upstream.revision, upstream.timeout, tool.name)
