"""Import and export of the `mcpServers` JSON that Claude Desktop, Cursor and other clients use."""

import json
import os
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from django.core.exceptions import ValidationError
from django.db import transaction

from handoff.models import HandoffRoute
from policy.services import policy_object_save
from registry.models import Upstream, query_split
from registry.services import upstream_save
from registry.upstreams.egress import url_problem

HTTP_TYPES = {
    "http": "streamable_http",
    "streamable-http": "streamable_http",
    "streamableHttp": "streamable_http",
    "sse": "sse",
}


# `${NAME}` in an env, header or query value or a URL: replaced by that environment variable at import.
PLACEHOLDER = re.compile(r"\$\{([A-Za-z0-9_]+)\}")
INTERNAL_HINT = 'Pass --internal, or set "internal": true on the entry, to allow it.'


class JsonObject(dict):
    """A parsed JSON object that remembers the names it met more than once (json.loads keeps the last one
    silently)."""

    def __init__(self, pairs: list[tuple[str, Any]]) -> None:
        super().__init__(pairs)
        self.repeated = [name for name, count in Counter(name for name, _ in pairs).items() if count > 1]


def config_parse(*, text: str) -> Any:
    """The file's JSON with every object a `JsonObject`; ValueError if it is not JSON."""
    return json.loads(text, object_pairs_hook=JsonObject)


def _repeated(value: Any) -> list[str]:
    return value.repeated if isinstance(value, JsonObject) else []


@dataclass
class EntryOutcome:
    name: str
    action: str  # created, updated, skipped, rejected; "would create" and "would update" in a dry run
    slug: str = ""
    why: str = ""
    handoff_target: bool = False

    def line(self) -> str:
        if self.why:
            return f"{self.action:<8} {self.name}: {self.why}"
        return f"{self.action:<8} {self.slug}{' (handoff target)' if self.handoff_target else ''}"


@dataclass
class ImportReport:
    entries: list[EntryOutcome] = field(default_factory=list)  # in the file's order

    @property
    def rejected(self) -> list[EntryOutcome]:
        return [entry for entry in self.entries if entry.action == "rejected"]

    @property
    def imported(self) -> list[EntryOutcome]:
        return [entry for entry in self.entries if entry.action in ("created", "updated")]


def slug_for(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:32].strip("-")


def _resolved(value: Any, where: str, environ: Mapping[str, str]) -> Any:
    """`value` with each `${NAME}` replaced from the environment (what is not a string is left to validation)."""

    def variable(match: re.Match[str]) -> str:
        if match[1] not in environ:
            raise ValueError(f"{where}: the environment variable {match[1]} is not set")
        return environ[match[1]]

    return PLACEHOLDER.sub(variable, value) if isinstance(value, str) else value


def _resolved_map(values: Any, where: str, environ: Mapping[str, str]) -> Any:
    if not isinstance(values, dict):
        return values
    return {name: _resolved(value, f"{where}.{name}", environ) for name, value in values.items()}


# What an entry of another kind than `rest` sets its REST fields to (an upstream may change kind on import).
NOT_REST = {"openapi_url": "", "openapi_document": "", "rest_operations": [], "rest_select": {}, "read_only": False}


def _fields(entry: dict[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    """Upstream fields for one entry, placeholders resolved; ValueError says what is wrong with it."""
    if entry.get("type") == "rest" or "openapi" in entry or "openapiDocument" in entry:
        return _rest_fields(entry, environ)
    return _mcp_fields(entry, environ) | NOT_REST


def _rest_fields(entry: dict[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    """A REST service (docs/rest-upstreams.md): `openapi`, its document's URL, or `openapiDocument`, the
    document itself, or `operations` declared by hand; `url` the base calls go to (with a document: optional)."""
    read_only = entry.get("readOnly", False)
    if not isinstance(read_only, bool):
        raise ValueError("'readOnly' must be true or false")
    return _http_fields(entry, environ) | {
        "transport": "rest",
        "openapi_url": _resolved(entry.get("openapi", ""), "openapi", environ),
        "openapi_document": entry.get("openapiDocument", ""),
        "rest_operations": entry.get("operations", []),
        "rest_select": entry.get("select", {}),
        "read_only": read_only,
    }


def _http_fields(entry: dict[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    """An HTTP entry's URL, its query and headers, and no stdio fields. The query is split off before the
    placeholders are filled, so a value from the environment is never read as URL syntax."""
    raw = entry.get("url", "")
    url, query = query_split(raw) if isinstance(raw, str) else (raw, {})
    return {
        "url": _resolved(url, "url", environ),
        "query": _resolved_map(query, "url's query", environ),
        "headers": _resolved_map(entry.get("headers", {}), "headers", environ),
        "command": "",
        "args": [],
        "env": {},
        "cwd": "",
        "sandbox": {},
    }


def _mcp_fields(entry: dict[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    if "command" in entry:
        return {
            "transport": "stdio",
            "command": entry["command"],
            "args": entry.get("args", []),
            "env": _resolved_map(entry.get("env", {}), "env", environ),
            "cwd": entry.get("cwd", ""),
            "sandbox": entry.get("sandbox", {}),
            "url": "",
            "headers": {},
            "query": {},
        }
    if "url" in entry:
        kind = entry.get("type") or entry.get("transport") or "http"
        if kind not in HTTP_TYPES:
            raise ValueError(f"unknown transport type {kind!r}")
        return _http_fields(entry, environ) | {"transport": HTTP_TYPES[kind]}
    raise ValueError("an entry needs either 'command' (stdio) or 'url' (HTTP)")


def mcp_config_import(
    *,
    config: Any,
    actor: str = "",
    internal: bool = False,
    dry_run: bool = False,
    environ: Mapping[str, str] = os.environ,
) -> ImportReport:
    """Create or update an upstream per entry, in the file's order; `internal` lets HTTP entries reach
    private addresses; `dry_run` validates and says what would change, writing nothing."""
    servers = config.get("mcpServers") if isinstance(config, dict) else None
    if not isinstance(servers, dict):
        raise ValueError("The file must be a JSON object with an 'mcpServers' object.")
    if "mcpServers" in _repeated(config):
        raise ValueError("'mcpServers' appears twice; which one is meant is unclear.")
    if not isinstance(config.get("virtualServers", {}), dict):  # handoff/config_apply.py reads them
        raise ValueError("'virtualServers' must be a JSON object of virtual servers by name.")
    shared = _shared_slugs(servers)
    report = ImportReport()
    for name, entry in servers.items():
        try:
            outcome = _entry_check(name, entry, servers, shared)
            outcome = outcome or _import_one(name, entry, actor, internal, dry_run, environ)
        except ValueError as exc:
            outcome = EntryOutcome(name, "rejected", why=str(exc))
        report.entries.append(outcome)
    return report


def _entry_check(name: str, entry: Any, servers: dict[str, Any], shared: dict[str, list[str]]) -> EntryOutcome | None:
    """Why the entry is skipped (an outcome) or refused (ValueError) before its fields are read; None if not."""
    if name in _repeated(servers):
        raise ValueError(f"two entries are named {name!r} in 'mcpServers'; neither is imported")
    if not isinstance(entry, dict):
        raise ValueError("the entry is not a JSON object")
    if where := _repeated_within(entry, "the entry"):
        raise ValueError(f"{where}; the entry is not imported")
    if entry.get("disabled"):
        return EntryOutcome(name, "skipped", why="marked disabled in the file")
    if others := [other for other in shared.get(name, []) if other != name]:
        slug = _namespace(name, entry)[0]
        names = " and ".join(repr(each) for each in [name, *others])
        raise ValueError(f"{names} map to the same slug {slug!r}; none is imported (rename one, or set its namespace)")
    return None


def _repeated_within(value: Any, where: str) -> str:
    """Where a JSON object inside `value` names a key twice, or ""."""
    if names := _repeated(value):
        return f"{where} names {names[0]!r} twice"
    children = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else []
    for key, child in children:
        if found := _repeated_within(child, f"{key!r}" if where == "the entry" else f"{where}[{key!r}]"):
            return found
    return ""


def _shared_slugs(servers: dict[str, Any]) -> dict[str, list[str]]:
    """Entry name -> every entry name mapping to its slug, for the entries that would be imported."""
    names_of: dict[str, list[str]] = {}
    for name, entry in servers.items():
        if isinstance(entry, dict) and not entry.get("disabled"):
            try:
                names_of.setdefault(_namespace(name, entry)[0], []).append(name)
            except ValueError:
                continue  # refused with its own reason when its turn comes
    return {name: names for names in names_of.values() for name in names}


def _up_to_date(upstream: Upstream, fields: dict[str, Any]) -> bool:
    """Sealed credentials cannot be compared here (only the executor opens them): an entry that carries
    any is imported again."""
    credentials = Upstream.SECRET_MAPS
    if any(fields.get(name) or getattr(upstream, name) for name in credentials):
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


PER_PERSON_KEYS = {"connect", "slot", "scope", "exchangeUrl", "audience", "client"}


def _per_person(entry: dict[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    """`"perPerson": {"connect": "token" | "oauth" | "exchange", "slot": ..., "scope": ..., "exchangeUrl": ...,
    "audience": ..., "client": {"client_id": ..., "client_secret": ...}}`: each person reaches the upstream with
    their own credential (docs/identity.md); without it, the upstream is shared."""
    person = entry.get("perPerson")
    if person is None:
        return {"per_person": False}
    if not isinstance(person, dict) or not set(person) <= PER_PERSON_KEYS:
        raise ValueError(f"'perPerson' must be an object of {', '.join(sorted(PER_PERSON_KEYS))}")
    connect = person.get("connect", "token")
    if connect not in Upstream.PersonConnect.values:
        raise ValueError(f"'perPerson.connect' must be one of {', '.join(Upstream.PersonConnect.values)}")
    default_slot = "" if "command" in entry else "bearer"
    return {
        "per_person": True,
        "person_connect": connect,
        "person_slot": str(person.get("slot", default_slot)),
        "person_scope": str(person.get("scope", "")),
        "exchange_url": str(person.get("exchangeUrl", "")),
        "exchange_audience": str(person.get("audience", "")),
        "person_client": _resolved_map(person.get("client", {}), "perPerson.client", environ),
    }


def _internal(entry: dict[str, Any], internal: bool) -> bool:
    if not isinstance(entry.get("internal", False), bool):
        raise ValueError("'internal' must be true or false")
    return (internal or entry.get("internal", False)) and ("url" in entry or "openapi" in entry)


def upstream_fields(
    name: str, entry: dict[str, Any], *, internal: bool = False, environ: Mapping[str, str] = os.environ
) -> tuple[str, dict[str, Any]]:
    """The slug and the upstream fields one entry says, placeholders resolved; ValueError says what is wrong."""
    slug, prefixed = _namespace(name, entry)
    fields = (
        _fields(entry, environ)
        | _per_person(entry, environ)
        | {
            "internal": _internal(entry, internal),
            "handoff_only": "handoff" in entry,
            "prefixed": prefixed,
        }
    )
    for key in ("url", "openapi_url"):
        if fields[key] and not fields["internal"] and (problem := url_problem(fields[key])):
            raise ValueError(f"{'openapi' if key == 'openapi_url' else key}: {problem}. {INTERNAL_HINT}")
    return slug, fields


def _import_one(
    name: str, entry: dict[str, Any], actor: str, internal: bool, dry_run: bool, environ: Mapping[str, str]
) -> EntryOutcome:
    handoff = _handoff(entry)
    slug, fields = upstream_fields(name, entry, internal=internal, environ=environ)
    upstream = Upstream.objects.filter(slug=slug).first()
    created = upstream is None
    if created:
        upstream = Upstream(slug=slug, name=name)
    elif handoff is None and _up_to_date(upstream, fields):
        return EntryOutcome(name, "skipped", why=f"upstream {slug!r} is already up to date")
    for key, value in fields.items():
        setattr(upstream, key, value)
    try:
        upstream.full_clean()
    except ValidationError as exc:
        raise ValueError("; ".join(f"{k}: {' '.join(v)}" for k, v in exc.message_dict.items())) from exc
    action = "created" if created else "updated"
    if not dry_run:
        _save(upstream, created, handoff, actor)
    return EntryOutcome(name, f"would {action[:-1]}" if dry_run else action, slug, handoff_target=handoff is not None)


def _save(upstream: Upstream, created: bool, handoff: str | None, actor: str) -> None:
    with transaction.atomic():
        upstream_save(upstream=upstream, actor=actor, created=created)
        if handoff is not None:
            # A specialist: reachable only through a handoff, by the route made for it here.
            route = HandoffRoute.objects.filter(domain=upstream.slug).first() or HandoffRoute(domain=upstream.slug)
            new_route = route.pk is None
            route.description, route.target = handoff, upstream
            policy_object_save(obj=route, actor=actor, created=new_route)


@dataclass
class ConfigExport:
    config: dict[str, Any]
    variables: list[str]  # what the import will read from its environment, in the file's order


def placeholder_for(slug: str, kind: str, name: str) -> str:
    """The variable an exported credential becomes: slug, kind (ENV, HEADER, QUERY) and name, upper-cased,
    anything but letters and digits made "_" (`remote-docs`'s header `X-Api-Key`: REMOTE_DOCS_HEADER_X_API_KEY)."""
    return re.sub(r"[^A-Z0-9]+", "_", f"{slug}_{kind}_{name}".upper()).strip("_")


def mcp_config_export(*, routes: bool = True) -> ConfigExport:
    """Every upstream as an `mcpServers` entry the import reads back into the same upstream. Credentials are
    `${VAR}` placeholders: only the executor can open them, and a file of them is safe to keep. Without `routes`
    a handoff target says `"handoffOnly": true` (the full configuration lists its routes apart)."""
    config: dict[str, Any] = {}
    slugs: dict[str, str] = {}  # entry name -> the upstream's slug, to refuse a name standing for two
    variables: dict[str, str] = {}  # variable -> what it stands for, to refuse one standing for two
    for upstream in Upstream.objects.prefetch_related("handoff_routes"):
        name = _entry_name(upstream)
        if slugs.setdefault(name, upstream.slug) != upstream.slug:
            raise ValueError(
                f"upstreams {slugs[name]!r} and {upstream.slug!r} would both be named {name!r}: rename one"
            )
        config[name] = entry_export(upstream, name, variables, routes)
    return ConfigExport(config={"mcpServers": config}, variables=list(variables))


def _entry_name(upstream: Upstream) -> str:
    """The upstream's own name where the import keeps its slug with it (with `namespace` if prefixed), else the
    slug."""
    if upstream.name and (upstream.prefixed or slug_for(upstream.name) == upstream.slug):
        return upstream.name
    return upstream.slug


def _placeholders(upstream: Upstream, kind: str, values: dict[str, str], taken: dict[str, str]) -> dict[str, str]:
    placeholders = {}
    for name in values:
        variable = placeholder_for(upstream.slug, kind, name)
        where = f"{upstream.slug} {kind.lower()} {name!r}"
        if taken.setdefault(variable, where) != where:
            raise ValueError(f"{taken[variable]} and {where} would share the variable {variable}: rename one")
        placeholders[name] = f"${{{variable}}}"
    return placeholders


def entry_export(upstream: Upstream, name: str, taken: dict[str, str], routes: bool) -> dict[str, Any]:
    if upstream.transport == Upstream.Transport.STDIO:
        entry: dict[str, Any] = {"command": upstream.command, "args": upstream.args}
        entry |= {"env": _placeholders(upstream, "ENV", upstream.env, taken)} if upstream.env else {}
        entry |= {"cwd": upstream.cwd} if upstream.cwd else {}
        entry |= {"sandbox": upstream.sandbox} if upstream.sandbox else {}
    else:
        query = urlencode(_placeholders(upstream, "QUERY", upstream.query, taken), safe="${}")
        entry = _http_export(upstream)
        entry |= {"url": f"{upstream.url}?{query}" if query else upstream.url} if upstream.url else {}
        entry |= {"headers": _placeholders(upstream, "HEADER", upstream.headers, taken)} if upstream.headers else {}
        entry |= {"internal": True} if upstream.internal else {}
    if upstream.per_person:
        entry["perPerson"] = _per_person_export(upstream, taken)
    if not upstream.prefixed:
        entry["namespace"] = ""
    elif slug_for(name) != upstream.slug:
        entry["namespace"] = upstream.slug
    if upstream.handoff_only:
        entry |= {"handoff": {"description": _handoff_description(upstream)}} if routes else {"handoffOnly": True}
    return entry


def _http_export(upstream: Upstream) -> dict[str, Any]:
    if upstream.transport != Upstream.Transport.REST:
        return {"type": "sse" if upstream.transport == Upstream.Transport.SSE else "http"}
    entry: dict[str, Any] = {"type": "rest"}
    entry |= {"openapi": upstream.openapi_url} if upstream.openapi_url else {}
    entry |= {"openapiDocument": upstream.openapi_document} if upstream.openapi_document else {}
    entry |= {"operations": upstream.rest_operations} if upstream.rest_operations else {}
    entry |= {"select": upstream.rest_select} if upstream.rest_select else {}
    return entry | ({"readOnly": True} if upstream.read_only else {})


def _per_person_export(upstream: Upstream, taken: dict[str, str]) -> dict[str, Any]:
    person: dict[str, Any] = {"connect": upstream.person_connect, "slot": upstream.person_slot}
    optional = {
        "scope": upstream.person_scope,
        "exchangeUrl": upstream.exchange_url,
        "audience": upstream.exchange_audience,
    }
    person |= {key: value for key, value in optional.items() if value}
    if upstream.person_client:
        person["client"] = _placeholders(upstream, "CLIENT", upstream.person_client, taken)
    return person


def _handoff_description(upstream: Upstream) -> str:
    routes = sorted(upstream.handoff_routes.all(), key=lambda route: route.domain != upstream.slug)
    if not routes:
        raise ValueError(f"{upstream.slug!r} is a handoff target with no handoff route, which the file cannot say")
    return routes[0].description
