"""Exposed tool names: `<upstream slug><separator><tool name>`, shortened deterministically when too long."""

import hashlib

from django.conf import settings

from policy.manifest import TOOL_NAME

HASH_CHARS = 8
URI_MARK = "+"  # between a prefixed upstream's slug and its own resource URI: `time+file:///x`


def exposed_name(namespace: str, tool: str) -> str:
    """Unique by construction: namespaces (slugs) are unique and never contain the separator, tool names are
    unique per upstream, and a shortened name ends in a hash of the full tool name. An unprefixed upstream
    (namespace "") keeps its own names: catalog sync refuses those that collide."""
    if not namespace:
        return tool
    name = f"{namespace}{settings.GATEWAY_TOOL_SEPARATOR}{tool}"
    limit = settings.GATEWAY_MAX_TOOL_NAME
    if len(name) <= limit:
        return name
    digest = hashlib.sha256(tool.encode("utf-8", "surrogatepass")).hexdigest()[:HASH_CHARS]
    return f"{name[: limit - HASH_CHARS - 1]}_{digest}"


def split_exposed_name(name: str) -> tuple[str, str] | None:
    """(slug, tool part) of an exposed name, or None when it carries no namespace or cannot be a tool name."""
    if not TOOL_NAME.fullmatch(name):
        return None
    slug, sep, rest = name.partition(settings.GATEWAY_TOOL_SEPARATOR)
    return (slug, rest) if sep and slug and rest else None


def gateway_tool_name(name: str) -> str:
    """A tool of the gateway itself (triage, return_to_triage): namespaced by GATEWAY_NAME, which no
    upstream may take as its slug."""
    return exposed_name(settings.GATEWAY_NAME, name)


def exposed_uri(namespace: str, uri: str) -> str:
    """A resource URI (or URI template) as agents see it: still a URI, since a scheme may hold `+`, and
    reversible, since slugs hold none. An unprefixed upstream's URIs stay as they are."""
    return f"{namespace}{URI_MARK}{uri}" if namespace else uri
