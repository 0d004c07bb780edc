"""The gateway's whole configuration as one JSON document (docs/import.md, "The whole configuration"): what
`export_config` writes and `import_config` applies. Secrets are never in it: upstream credentials are `${VAR}`
placeholders (as in `export_mcp_config`), agents' API keys are left out."""

import json
import re
from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import Group
from django.db.models import Model

from handoff.config_import import mcp_config_export, slug_for
from handoff.models import HandoffRoute
from policy.models import Agent, AgentGroup, Person, Rule, ServerGroup, Team
from registry.models import Upstream, VirtualServer
from registry.server_overrides import server_overrides_json

FORMAT = "switchboard-configuration"
VERSION = 1
SECRETS_NOTE = (
    "Upstream credentials are written as ${VAR} placeholders, never their values; agents' API keys are not "
    "written (an imported agent has none until one is issued); console accounts and people are not written."
)


@dataclass(frozen=True)
class Section:
    """One kind of object in the document: a JSON object of them by their natural key (a list, for rules)."""

    name: str
    model: type[Model]
    noun: str
    key: str  # the field that names an object ("" for rules, which have no name)
    fields: tuple[str, ...]


TEAMS = Section("teams", Team, "team", "slug", ("name", "calls_per_minute", "max_concurrent", "daily_calls"))
SERVER_GROUPS = Section("serverGroups", ServerGroup, "server group", "name", ("team", "isolation", "enabled"))
AGENTS = Section("agents", Agent, "agent", "name", ("team", "enabled", "calls_per_minute", "max_calls_per_session"))
AGENT_GROUPS = Section("agentGroups", AgentGroup, "agent group", "name", ("team", "idp_groups"))
ROUTES = Section(
    "handoffRoutes",
    HandoffRoute,
    "handoff route",
    "domain",
    ("team", "description", "target", "enabled", "connect_timeout", "max_sessions", "idle_timeout"),
)
VIRTUAL_SERVERS = Section(
    "virtualServers",
    VirtualServer,
    "virtual server",
    "name",
    ("team", "title", "instructions", "tools", "resources", "prompts", "enabled"),
)
RULES = Section(
    "rules",
    Rule,
    "rule",
    "",
    (
        "effect",
        "team",
        "agent",
        "agent_group",
        "person",
        "upstream",
        "server_group",
        "tool_pattern",
        "tool_class",
        "signers",
        "four_eyes",
        "sign_off_wait",
        "sign_off_valid",
        "sign_off_by_form",
        "enabled",
        "note",
    ),
)
# What an mcpServers entry cannot say about an upstream, written beside it in the same entry (with `handoffOnly`
# and UPSTREAM_SHARING).
UPSTREAM_FIELDS = (
    "team",
    "group",
    "enabled",
    "new_tools",
    "timeout",
    "calls_per_minute",
    "max_concurrent",
    "breaker_failures",
    "breaker_recovery",
)
UPSTREAM_SHARING = ("sharedWith", "sharedWithAll", "localPrefixes")
# The models a relation names, and the field that names them (people by issuer and subject).
NAMED_BY = {Team: "slug", ServerGroup: "name", Agent: "name", AgentGroup: "name", Upstream: "slug", Group: "name"}
NOUNS = {Team: "team", ServerGroup: "server group", Agent: "agent", AgentGroup: "agent group", Upstream: "upstream"}


def camel(name: str) -> str:
    return re.sub(r"_([a-z])", lambda match: match[1].upper(), name)


def natural_key(obj: Model) -> Any:
    if isinstance(obj, Person):
        return {"issuer": obj.issuer, "subject": obj.subject}
    return getattr(obj, NAMED_BY[type(obj)])


def field_value(obj: Model, name: str) -> Any:
    """A field as the document writes it: a relation by its object's natural key."""
    field = obj._meta.get_field(name)
    if field.is_relation:
        related = getattr(obj, name)
        return None if related is None else natural_key(related)
    return field.value_from_object(obj)


def object_export(obj: Model, fields: tuple[str, ...]) -> dict[str, Any]:
    """The object's fields in camelCase; a field with no value (null) is left out."""
    values = {camel(name): field_value(obj, name) for name in fields}
    # As JSON has them (a choice as its string): what the document holds, and so what the import compares.
    return json.loads(json.dumps({name: value for name, value in values.items() if value is not None}))


def rule_label(rule: dict[str, Any]) -> str:
    """A rule as the import's diff names it (rules have no name): effect, who, where, which tools, and its note."""
    who = rule.get("agent") or rule.get("agentGroup") or (rule.get("person") or {}).get("subject") or "any agent"
    where = rule.get("upstream") or rule.get("serverGroup") or "any service"
    note = f" ({rule['note']})" if rule.get("note") else ""
    return f"{rule.get('effect')} {who} → {where} / {rule.get('toolPattern', '*')}{note}"


def config_export() -> tuple[dict[str, Any], list[str]]:
    """The document, and the variables its placeholders name (which its import reads from its environment)."""
    upstreams = mcp_config_export(routes=False)
    document: dict[str, Any] = {"format": FORMAT, "version": VERSION}
    document["teams"] = _teams()
    document["serverGroups"] = _section(SERVER_GROUPS, ServerGroup.objects.select_related("team"))
    document["mcpServers"] = _upstreams(upstreams.config["mcpServers"])
    document["agents"] = _section(AGENTS, Agent.objects.select_related("team"))
    document["agentGroups"] = {
        group.name: object_export(group, AGENT_GROUPS.fields) | {"agents": sorted(a.name for a in group.agents.all())}
        for group in AgentGroup.objects.select_related("team").prefetch_related("agents")
    }
    document["handoffRoutes"] = _section(ROUTES, HandoffRoute.objects.select_related("team", "target"))
    document["virtualServers"] = servers_export()
    related = ("team", "agent", "agent_group", "person", "upstream", "server_group", "signers")
    rules = [object_export(rule, RULES.fields) for rule in Rule.objects.select_related(*related)]
    document["rules"] = sorted(rules, key=rule_order)
    return document, upstreams.variables


def rule_order(rule: dict[str, Any]) -> str:
    """Rules in a stable order that does not depend on their ids (a restore gives them new ones)."""
    return json.dumps(rule, sort_keys=True)


def _section(section: Section, objects: Any) -> dict[str, Any]:
    return {getattr(obj, section.key): object_export(obj, section.fields) for obj in objects}


def servers_export() -> dict[str, Any]:
    """Each virtual server, with its own tool overrides (`overrides`: `<upstream slug>/<tool>` -> override): the
    document's `virtualServers`, and export_mcp_config's beside its `mcpServers`."""
    servers = {}
    for server in VirtualServer.objects.select_related("team"):
        overrides = server_overrides_json(server=server)
        servers[server.name] = object_export(server, VIRTUAL_SERVERS.fields) | (
            {"overrides": overrides} if overrides else {}
        )
    return servers


def _teams() -> dict[str, Any]:
    teams = {}
    for team in Team.objects.prefetch_related("idp_groups"):
        groups = {mapping.group: mapping.role for mapping in team.idp_groups.all()}
        teams[team.slug] = object_export(team, TEAMS.fields) | ({"groups": groups} if groups else {})
    return teams


def _upstreams(entries: dict[str, Any]) -> dict[str, Any]:
    """Each mcpServers entry with what only the gateway knows of its upstream: team, group, limits, sharing."""
    upstreams = Upstream.objects.select_related("team", "group").prefetch_related("shared_with", "local_prefixes__team")
    by_slug = {upstream.slug: upstream for upstream in upstreams}
    exported = {}
    for name, entry in entries.items():
        upstream = by_slug[entry_slug(name, entry)]
        extra = object_export(upstream, UPSTREAM_FIELDS)
        shared = sorted(team.slug for team in upstream.shared_with.all())
        prefixes = {row.team.slug: row.prefix for row in upstream.local_prefixes.all()}
        extra |= {"sharedWith": shared} if shared else {}
        extra |= {"sharedWithAll": True} if upstream.shared_with_all else {}
        extra |= {"localPrefixes": prefixes} if prefixes else {}
        exported[name] = entry | extra
    return exported


def entry_slug(name: str, entry: dict[str, Any]) -> str:
    """The slug an mcpServers entry names (as the import reads it)."""
    namespace = entry.get("namespace")
    return namespace if isinstance(namespace, str) and namespace else slug_for(name)
