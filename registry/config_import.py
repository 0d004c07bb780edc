"""Import of the `mcpServers` JSON that Claude Desktop, Cursor and other clients use."""

import re
from dataclasses import dataclass, field
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction

from handoff.models import HandoffRoute
from policy.services import policy_object_save
from registry.models import Upstream, query_split
from registry.services import upstream_save

HTTP_TYPES = {
    "http": "streamable_http",
    "streamable-http": "streamable_http",
    "streamableHttp": "streamable_http",
    "sse": "sse",
}


@dataclass
class ImportReport:
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    rejected: list[tuple[str, str]] = field(default_factory=list)


def slug_for(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:32].strip("-")


def _fields(entry: dict[str, Any]) -> dict[str, Any]:
    """Upstream fields for one entry; ValueError says what is wrong with it."""
    if "command" in entry:
        return {
            "transport": "stdio",
            "command": entry["command"],
            "args": entry.get("args", []),
            "env": entry.get("env", {}),
            "cwd": entry.get("cwd", ""),
            "url": "",
            "headers": {},
            "query": {},
        }
    if "url" in entry:
        kind = entry.get("type") or entry.get("transport") or "http"
        if kind not in HTTP_TYPES:
            raise ValueError(f"unknown transport type {kind!r}")
        url, query = query_split(entry["url"]) if isinstance(entry["url"], str) else (entry["url"], {})
        return {
            "transport": HTTP_TYPES[kind],
            "url": url,
            "query": query,
            "headers": entry.get("headers", {}),
            "command": "",
            "args": [],
            "env": {},
            "cwd": "",
        }
    raise ValueError("an entry needs either 'command' (stdio) or 'url' (HTTP)")


def mcp_config_import(*, config: Any, actor: str = "", internal: bool = False) -> ImportReport:
    """Create or update an upstream per entry; `internal` lets HTTP entries reach private addresses."""
    report = ImportReport()
    servers = config.get("mcpServers") if isinstance(config, dict) else None
    if not isinstance(servers, dict):
        raise ValueError("The file must be a JSON object with an 'mcpServers' object.")
    for name, entry in servers.items():
        if not isinstance(entry, dict):
            report.rejected.append((name, "the entry is not a JSON object"))
            continue
        if entry.get("disabled"):
            report.skipped.append((name, "marked disabled in the file"))
            continue
        _import_one(name, entry, actor, report, internal)
    return report


def _up_to_date(upstream: Upstream, fields: dict[str, Any]) -> bool:
    """Sealed credentials cannot be compared here (only the executor opens them): an entry that carries
    any is imported again."""
    credentials = Upstream.SECRET_MAPS
    if any(fields[name] or getattr(upstream, name) for name in credentials):
        return False
    return all(getattr(upstream, key) == value for key, value in fields.items() if key not in credentials)


def _handoff(entry: dict[str, Any]) -> str | None:
    """The handoff description of a specialist entry (`"handoff": {"description": ...}`), or None."""
    if "handoff" not in entry:
        return None
    handoff = entry["handoff"]
    if not isinstance(handoff, dict) or not isinstance(handoff.get("description"), str) or not handoff["description"]:
        raise ValueError("'handoff' must be an object with a 'description' saying when to hand off here")
    return handoff["description"]


def _namespace(name: str, entry: dict[str, Any]) -> tuple[str, bool]:
    """(slug, prefixed): `"namespace": ""` exposes the upstream's names unprefixed, any other string is the
    prefix (and so the slug); without one the slug comes from the entry's name."""
    if "namespace" not in entry:
        return slug_for(name), True
    namespace = entry["namespace"]
    if not isinstance(namespace, str):
        raise ValueError("'namespace' must be a string: the prefix, or \"\" for the upstream's own names")
    return (namespace, True) if namespace else (slug_for(name), False)


def _import_one(name: str, entry: dict[str, Any], actor: str, report: ImportReport, internal: bool) -> None:
    try:
        slug, prefixed = _namespace(name, entry)
        handoff = _handoff(entry)
        fields = _fields(entry) | {
            "internal": internal and "url" in entry,
            "handoff_only": handoff is not None,
            "prefixed": prefixed,
        }
    except ValueError as exc:
        report.rejected.append((name, str(exc)))
        return
    upstream = Upstream.objects.filter(slug=slug).first()
    created = upstream is None
    if created:
        upstream = Upstream(slug=slug, name=name)
    elif handoff is None and _up_to_date(upstream, fields):
        report.skipped.append((name, f"upstream {slug!r} is already up to date"))
        return
    for key, value in fields.items():
        setattr(upstream, key, value)
    try:
        upstream.full_clean()
    except ValidationError as exc:
        report.rejected.append((name, "; ".join(f"{k}: {' '.join(v)}" for k, v in exc.message_dict.items())))
        return
    with transaction.atomic():
        upstream_save(upstream=upstream, actor=actor, created=created)
        if handoff is not None:
            # A specialist: reachable only through a handoff, by the route made for it here.
            route = HandoffRoute.objects.filter(domain=slug).first() or HandoffRoute(domain=slug)
            new_route = route.pk is None
            route.description, route.target = handoff, upstream
            policy_object_save(obj=route, actor=actor, created=new_route)
    (report.created if created else report.updated).append(slug)
