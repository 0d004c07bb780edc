"""A virtual server's own overrides of the tools it offers (docs/curation.md, "Overrides per virtual server"):
written against the tool as /mcp shows it (the upstream's override applied), stacked on that override for the
server's sessions only, held by registry.models.ServerToolOverride; every change an audit row."""

from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction

from audit.services import audit_record
from policy.config_version import config_changed
from policy.models import Team
from policy.patterns import name_matches
from registry.models import ServerToolOverride, Tool, VirtualServer
from registry.naming import exposed_name
from registry.overrides import Override, OverrideRefused, override_check, override_json, override_parse, override_stored
from registry.selectors import namespace_of, upstreams_seen
from registry.services import rename_collision


def server_override_check(*, server: VirtualServer, tool: Tool, data: Any) -> Override:
    """The override `data` describes, if the server offers the tool, it fits the tool as /mcp shows it, and its
    name is one no other tool has in the server or at /mcp; else ValidationError naming why."""
    try:
        override = override_parse(data)
        override_check(override, tool.shown_definition())
    except OverrideRefused as refused:
        raise ValidationError({"override": str(refused)}) from None
    upstream, namespace = tool.upstream, namespace_of(upstream=tool.upstream, team=server.team)
    listed = exposed_name(namespace, tool.own_name)
    seen = upstreams_seen(team=server.team).filter(pk=upstream.pk).exists()
    if not seen or not name_matches(listed, server.tools):
        message = f"The virtual server {server.name!r} does not offer {listed!r}: list it in its tools to override it."
        raise ValidationError({"override": message})
    own = override.name or tool.own_name
    exposed = exposed_name(namespace, own)
    for other, other_exposed in _presented(server, exclude=tool):
        if other_exposed == exposed:
            message = f"Tools {tool.name!r} and {other.name!r} would both be exposed as {exposed!r}."
            raise ValidationError({"override": f"{message[:-1]} in virtual server {server.name!r}."})
    if own != tool.own_name and (collision := rename_collision(upstream=upstream, name=own)):
        raise ValidationError({"override": f"Tool {tool.name!r} cannot be renamed {own!r}: {collision}."})
    return override


def _presented(server: VirtualServer, exclude: Tool) -> list[tuple[Tool, str]]:
    """The tools of `exclude`'s upstream and those the server overrides, under the names the server shows them."""
    own = {row.tool_id: row.name for row in server.overrides.all()}
    tools = Tool.objects.filter(upstream=exclude.upstream) | Tool.objects.filter(server_overrides__server=server)
    presented = []
    for tool in tools.exclude(pk=exclude.pk).distinct().select_related("upstream", "override"):
        namespace = namespace_of(upstream=tool.upstream, team=server.team)
        presented.append((tool, exposed_name(namespace, own.get(tool.pk) or tool.own_name)))
    return presented


def server_override_set(*, server: VirtualServer, tool: Tool, data: Any, actor: str) -> ServerToolOverride:
    """Present the tool to the server's sessions as `data` says (refused with ValidationError,
    `server_override_check`). An audit row names the override's digest before and after."""
    override = server_override_check(server=server, tool=tool, data=data)
    with transaction.atomic():
        row = ServerToolOverride.objects.filter(server=server, tool=tool).first()
        before = row.value().digest if row else ""
        stored = override_stored(override) | {"updated_by": actor}
        row, _ = ServerToolOverride.objects.update_or_create(server=server, tool=tool, defaults=stored)
        _override_event(server, tool, before, override.digest, actor)
    return row


def server_override_clear(*, server: VirtualServer, tool: Tool, actor: str) -> None:
    """The server's sessions see the tool as /mcp shows it again."""
    with transaction.atomic():
        row = ServerToolOverride.objects.filter(server=server, tool=tool).first()
        if row is None:
            return
        before = row.value().digest
        row.delete()
        _override_event(server, tool, before, "", actor)


def _override_event(server: VirtualServer, tool: Tool, before: str, after: str, actor: str) -> None:
    config_changed()
    action = "server_override_set" if after else "server_override_cleared"
    detail = {"action": action, "before": before, "after": after}
    audit_record(
        kind="admin_change", actor=actor, upstream=tool.upstream.slug, team=server.team.slug, tool=tool.name,
        server=server.name, detail=detail,
    )  # fmt: skip


def server_overrides_json(*, server: VirtualServer) -> dict[str, Any]:
    """`<upstream slug>/<tool>` -> the override as JSON, for each tool the server overrides (what the REST API and
    the configuration document show)."""
    rows = server.overrides.select_related("tool__upstream").order_by("tool__upstream__slug", "tool__name")
    return {tool_key(row.tool): override_json(row.value()) for row in rows}


def tool_key(tool: Tool) -> str:
    return f"{tool.upstream.slug}/{tool.name}"


def tool_by_key(key: str, seen_by: Team | None = None) -> Tool | None:
    """The catalog's tool a `<upstream slug>/<tool>` key names, if it has it (and `seen_by`'s agents reach it)."""
    slug, _, name = key.partition("/")
    tools = Tool.objects.select_related("upstream", "override").filter(upstream__slug=slug, name=name)
    return (tools.filter(upstream__in=upstreams_seen(team=seen_by)) if seen_by else tools).first()


def server_overrides_apply(*, server: VirtualServer, wanted: dict[str, Any], actor: str) -> None:
    """Make the server's overrides `wanted` (by tool key, as `server_overrides_json`), each change audited."""
    have = server_overrides_json(server=server)
    for key in sorted(have.keys() - wanted.keys()):
        server_override_clear(server=server, tool=tool_by_key(key), actor=actor)
    for key, data in sorted(wanted.items()):
        if have.get(key) != data:
            tool = tool_by_key(key)
            if tool is None:
                raise ValidationError({"overrides": f"The gateway's catalog has no tool {key!r} (sync its upstream)."})
            server_override_set(server=server, tool=tool, data=data, actor=actor)
