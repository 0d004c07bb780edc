"""The routing snapshot: what the hot path reads (agent keys, exposed tool names, the tools/list payload),
compiled once per configuration version instead of queried on every request.

Any change bumps `ConfigVersion` in its own transaction (`config_changed`). Each process looks at the
version at most every GATEWAY_SNAPSHOT_CHECK_SECONDS and recompiles when it moved, so an admin's change
reaches every process within that time.
"""

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db.models import F

from handoff.db import database_async
from handoff.models import ConfigVersion
from policy.keys import key_matches, key_split
from policy.models import AgentKey
from registry.models import Tool, Upstream
from registry.naming import exposed_name


@dataclass(frozen=True)
class Route:
    """Where an exposed tool name leads."""

    upstream_id: int
    upstream_slug: str
    revision: int
    timeout: float
    tool: str


@dataclass(frozen=True)
class KeyEntry:
    digest: str
    agent_id: int
    agent_name: str


@dataclass(frozen=True)
class ToolEntry:
    route: Route
    reachable: bool


@dataclass(frozen=True)
class Snapshot:
    version: int
    keys: dict[str, KeyEntry] = field(default_factory=dict)  # key prefix -> key of an enabled agent
    enabled_agents: frozenset[int] = frozenset()
    tools: dict[str, ToolEntry] = field(default_factory=dict)  # exposed name -> every upstream's tools
    upstreams: dict[str, bool] = field(default_factory=dict)  # slug -> reachable
    visible: tuple[dict[str, Any], ...] = ()  # the tools/list payload

    def tool_for(self, name: str) -> ToolEntry | None:
        return self.tools.get(name)

    def key_holder(self, key: str) -> KeyEntry | None:
        """The enabled agent holding this API key, or None; constant-time (policy/keys.py)."""
        parts = key_split(key)
        entry = self.keys.get(parts[0]) if parts else None
        return entry if parts and key_matches(entry.digest if entry else None, parts[1]) else None


def config_changed() -> None:
    """Call inside the transaction that changes routing data: readers see both together."""
    if not ConfigVersion.objects.filter(pk=1).update(version=F("version") + 1):
        ConfigVersion.objects.get_or_create(pk=1, defaults={"version": 1})


def on_routing_row_changed(**kwargs: Any) -> None:
    """Receiver for post_save and post_delete of the models routing reads (connected in apps.py)."""
    config_changed()


def config_version() -> int:
    return ConfigVersion.objects.filter(pk=1).values_list("version", flat=True).first() or 0


def snapshot_compile() -> Snapshot:
    version = config_version()  # read first: a change racing the compile leaves the version behind, not ahead
    keys = AgentKey.objects.filter(revoked=False, agent__enabled=True).select_related("agent")
    upstreams = {u.id: u for u in Upstream.objects.select_related("group")}
    tools, visible = {}, []
    for tool in Tool.objects.order_by("upstream__slug", "name"):
        upstream = upstreams[tool.upstream_id]
        name = exposed_name(upstream.slug, tool.name)
        route = Route(upstream.id, upstream.slug, upstream.revision, upstream.timeout, tool.name)
        tools[name] = ToolEntry(route, upstream.is_reachable)
        if upstream.is_reachable:
            visible.append(tool.definition | {"name": name})
    return Snapshot(
        version=version,
        keys={k.prefix: KeyEntry(k.digest, k.agent_id, k.agent.name) for k in keys},
        enabled_agents=frozenset(k.agent_id for k in keys),
        tools=tools,
        upstreams={u.slug: u.is_reachable for u in upstreams.values()},
        visible=tuple(visible),
    )


class SnapshotHolder:
    def __init__(self) -> None:
        self._snapshot: Snapshot | None = None
        self._checked_at = 0.0
        self._lock: asyncio.Lock | None = None

    async def get(self) -> Snapshot:
        if self._snapshot and time.monotonic() - self._checked_at < settings.GATEWAY_SNAPSHOT_CHECK_SECONDS:
            return self._snapshot
        self._lock = self._lock or asyncio.Lock()
        async with self._lock:
            if not self._snapshot or time.monotonic() - self._checked_at >= settings.GATEWAY_SNAPSHOT_CHECK_SECONDS:
                version = await database_async(config_version)()
                if not self._snapshot or version != self._snapshot.version:
                    self._snapshot = await database_async(snapshot_compile)()
                self._checked_at = time.monotonic()
        return self._snapshot


snapshot = SnapshotHolder()
