"""`import_config`: make the gateway's configuration what a document of `export_config` says (docs/import.md, "The
whole configuration"). Every object is checked and every reference resolved before anything is written; then
the changes are made in one transaction, each through the service the console and the REST API use, so each is
an audit row."""

import os
from collections import ChainMap, Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from django.contrib.auth.models import Group
from django.core.exceptions import NON_FIELD_ERRORS, ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Model

from audit.models import DEFAULT_TEAM
from handoff.config_document import (
    AGENT_GROUPS,
    AGENTS,
    FORMAT,
    NAMED_BY,
    NOUNS,
    ROUTES,
    RULES,
    SERVER_GROUPS,
    TEAMS,
    UPSTREAM_FIELDS,
    UPSTREAM_SHARING,
    VERSION,
    VIRTUAL_SERVERS,
    Section,
    camel,
    config_export,
    entry_slug,
    object_export,
    rule_label,
    rule_order,
    servers_export,
)
from handoff.config_import import EntryOutcome, entry_export, placeholder_for, upstream_fields
from policy.models import Agent, Person, Rule, Team, TeamGroup, TeamRole
from policy.services import policy_object_delete, policy_object_save, relations_record, rule_save, team_group_map
from registry.credentials import PREFIX, CredentialError, credential_open
from registry.models import LocalPrefix, Upstream
from registry.overrides import OverrideRefused, override_json, override_parse
from registry.server_overrides import server_overrides_apply, tool_by_key
from registry.services import local_prefix_set, upstream_delete, upstream_save, upstream_share

NAMED = (TEAMS, SERVER_GROUPS, AGENTS, AGENT_GROUPS, ROUTES, VIRTUAL_SERVERS)
SECRET_KINDS = {"env": "ENV", "headers": "HEADER", "query": "QUERY", "person_client": "CLIENT"}
PERSON_FIELDS = ("person_connect", "person_slot", "person_client", "person_scope", "exchange_url", "exchange_audience")
UPSTREAM_KEYS = {camel(name) for name in UPSTREAM_FIELDS} | {"handoffOnly", *UPSTREAM_SHARING}


class ConfigRefused(ValueError):
    """The document cannot be applied; the message names the object and what is wrong. Nothing was written."""


@dataclass
class Change:
    action: str  # created, changed, removed
    noun: str
    name: str
    fields: list[str] = field(default_factory=list)
    value: Any = None  # a removed rule as the export writes it (rules have no name to find them by)

    def line(self) -> str:
        changed = f": {', '.join(self.fields)}" if self.fields else ""
        return f"{self.action:<8} {self.noun} {self.name}{changed}"


@dataclass
class Desired:
    """The document checked: each section's objects as the export would write them, and each upstream's fields."""

    sections: dict[str, dict[str, Any]]
    upstreams: dict[str, tuple[str, dict[str, Any], dict[str, Any]]]  # slug -> (name, fields, extras)
    rules: list[dict[str, Any]]


def config_apply(
    *, document: Any, actor: str, dry_run: bool = False, environ: Mapping[str, str] = os.environ
) -> list[Change]:
    """The changes that make the gateway match the document, made unless `dry_run`; ConfigRefused otherwise."""
    desired = _desired(document, environ)
    current, _ = config_export()
    changes = _diff(current, desired)
    if changes and not dry_run:
        try:
            with transaction.atomic():
                _apply(desired, changes, actor)
        except (ValidationError, IntegrityError) as exc:
            raise ConfigRefused(_messages(exc)) from exc
    return changes


def servers_import(*, config: dict[str, Any], actor: str, dry_run: bool = False) -> list[EntryOutcome]:
    """The `virtualServers` an mcpServers file holds beside its entries (export_mcp_config writes them): each one
    created or updated as the configuration document's would be (overrides of tools the catalog has), none removed."""
    have, outcomes = servers_export(), []
    for name, entry in config.get("virtualServers", {}).items():
        where = f"virtual server {name!r}"
        try:
            value = _named(VIRTUAL_SERVERS, {name: entry})[name]
            if not Team.objects.filter(slug=value["team"]).exists():
                raise ConfigRefused(f"it names team {value['team']!r}, which this gateway does not have")
            if have.get(name) == value:
                outcomes.append(EntryOutcome(where, "skipped", why="already up to date"))
                continue
            action = "updated" if name in have else "created"
            if not dry_run:
                with transaction.atomic(), _about(where):
                    _named_save(VIRTUAL_SERVERS, name, value, actor)
            outcomes.append(EntryOutcome(where, f"would {action[:-1]}" if dry_run else action, where))
        except ConfigRefused as refused:
            why = str(refused).removeprefix(f"{where}: ").removeprefix(f"{where} ")
            outcomes.append(EntryOutcome(where, "rejected", why=why))
    return outcomes


def _messages(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        if hasattr(exc, "error_dict"):
            shown = ((f"{k}: " if k != NON_FIELD_ERRORS else "", v) for k, v in exc.message_dict.items())
            return "; ".join(f"{name}{' '.join(texts)}" for name, texts in shown)
        return " ".join(exc.messages)
    return str(exc)


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ConfigRefused(f"{where} must be a JSON object")
    if getattr(value, "repeated", None):
        raise ConfigRefused(f"{where} names {value.repeated[0]!r} twice")
    return value


def _desired(document: Any, environ: Mapping[str, str]) -> Desired:
    document = _object(document, "the document")
    if document.get("format") != FORMAT or not isinstance(document.get("version"), int):
        raise ConfigRefused(f'the document is not a configuration: it needs "format": "{FORMAT}" and a "version"')
    if document["version"] > VERSION:
        raise ConfigRefused(f"the document is version {document['version']}; this gateway reads up to {VERSION}")
    known = {"format", "version", "mcpServers", "rules", *(section.name for section in NAMED)}
    if unknown := sorted(set(document) - known):
        raise ConfigRefused(f"the document has no section {unknown[0]!r}")
    sections = {s.name: _named(s, _object(document.get(s.name, {}), s.name)) for s in NAMED}
    rules = document.get("rules", [])
    if not isinstance(rules, list):
        raise ConfigRefused("rules must be a JSON list")
    desired = Desired(sections, {}, [_canonical(RULES, rule, f"rule {n + 1}") for n, rule in enumerate(rules)])
    for name, entry in _object(document.get("mcpServers", {}), "mcpServers").items():
        slug, fields, extras = _upstream(name, _object(entry, f"upstream {name!r}"), environ)
        if slug in desired.upstreams:
            raise ConfigRefused(f"upstreams {desired.upstreams[slug][0]!r} and {name!r} both have the slug {slug!r}")
        desired.upstreams[slug] = (name, fields, extras)
    _references_check(desired)
    return desired


def _named(section: Section, objects: dict[str, Any]) -> dict[str, Any]:
    checked = {}
    for name, value in objects.items():
        where = f"{section.noun} {name!r}"
        value = dict(_object(value, where))  # a copy: the caller's document stays as it was
        groups = value.pop("groups", {}) if section is TEAMS else {}
        extra = {"groups": dict(groups)} if groups else {}
        if section is AGENT_GROUPS:
            extra = {"agents": sorted(_names(value.pop("agents", []), f"{where}: agents"))}
        if section is VIRTUAL_SERVERS and (overrides := _overrides(value.pop("overrides", {}), where)):
            extra = {"overrides": overrides}
        checked[name] = _canonical(section, value | {section.key: name}, where) | extra
        if not all(role in TeamRole.values for role in _object(groups, where).values()):
            raise ConfigRefused(f"{where}: a group's role is one of {', '.join(TeamRole.values)}")
    return checked


def _overrides(value: Any, where: str) -> dict[str, Any]:
    """A virtual server's overrides as the export writes them, each of a tool the gateway's catalog has (catalogs
    are not in the document: an upstream is synced before a server can override its tools)."""
    overrides = {}
    for key, data in _object(value, f"{where}: overrides").items():
        if tool_by_key(key) is None:
            raise ConfigRefused(f"{where} overrides {key!r}, which the gateway's catalog does not have (sync it first)")
        try:
            overrides[key] = override_json(override_parse(data))
        except OverrideRefused as refused:
            raise ConfigRefused(f"{where}: the override of {key!r}: {refused}") from None
    return overrides


def _names(value: Any, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ConfigRefused(f"{where} must be a list of names")
    return value


def _canonical(section: Section, value: Any, where: str, *, obj: Model | None = None) -> dict[str, Any]:
    """The object as the export would write it (defaults filled in, values as the model holds them), checked by
    the model's own validation; relations are checked later, against the whole document."""
    value = _object(value, where)
    allowed = {camel(name) for name in section.fields} | ({section.key} if section.key else set())
    if unknown := sorted(set(value) - allowed):
        raise ConfigRefused(f"{where}: unknown key {unknown[0]!r}")
    obj = obj or section.model()
    relations = {}
    for name in section.fields:
        model_field = obj._meta.get_field(name)
        given = value.get(camel(name))
        if model_field.is_relation:
            relations[camel(name)] = given if given is not None or name != "team" else DEFAULT_TEAM
            # A stand-in id, so that the model's clean() sees which relations are named.
            setattr(obj, model_field.attname, None if relations[camel(name)] is None else -1)
        elif camel(name) in value:
            setattr(obj, name, given)
    if section.key:
        setattr(obj, section.key, value[section.key])
    excluded = [f.name for f in obj._meta.get_fields() if f.is_relation]
    try:
        obj.full_clean(exclude=excluded, validate_unique=False, validate_constraints=False)
    except ValidationError as exc:
        raise ConfigRefused(f"{where}: {_messages(exc)}") from exc
    plain = object_export(obj, tuple(name for name in section.fields if camel(name) not in relations))
    return plain | {name: related for name, related in relations.items() if related is not None}


def _upstream(name: str, entry: dict[str, Any], environ: Mapping[str, str]) -> tuple[str, dict[str, Any], dict]:
    where = f"upstream {name!r}"
    if found := {"handoff", "disabled"} & set(entry):
        raise ConfigRefused(f"{where}: {found.pop()!r} is for mcpServers files; here use handoffOnly, enabled")
    slug = entry_slug(name, entry)
    stored = Upstream.objects.filter(slug=slug).first()
    try:
        connection = {key: value for key, value in entry.items() if key not in UPSTREAM_KEYS}
        slug, fields = upstream_fields(name, connection, environ=ChainMap(dict(environ), _kept(stored)))
    except ValueError as exc:
        raise ConfigRefused(f"{where}: {exc}") from exc
    # A shared upstream's entry says nothing of people: the fields take their defaults, as on a new upstream.
    fields = {name: Upstream._meta.get_field(name).get_default() for name in PERSON_FIELDS} | fields
    _kept_whole(fields, where)
    section = Section("mcpServers", Upstream, "upstream", "", UPSTREAM_FIELDS)
    probe = Upstream(slug=slug, name=name, **fields)
    extras = _canonical(
        section,
        {k: v for k, v in entry.items() if k in UPSTREAM_KEYS - set(UPSTREAM_SHARING) - {"handoffOnly"}},
        where,
        obj=probe,
    )
    if not isinstance(entry.get("handoffOnly", False), bool) or not isinstance(entry.get("sharedWithAll", False), bool):
        raise ConfigRefused(f"{where}: handoffOnly and sharedWithAll are true or false")
    fields["handoff_only"] = entry.get("handoffOnly", False)
    shared = sorted(_names(entry.get("sharedWith", []), f"{where}: sharedWith"))
    prefixes = dict(_object(entry.get("localPrefixes", {}), f"{where}: localPrefixes"))
    if not all(isinstance(prefix, str) for prefix in prefixes.values()):
        raise ConfigRefused(f"{where}: localPrefixes maps a team to its prefix")
    extras |= {"sharedWith": shared} if shared else {}
    extras |= {"sharedWithAll": True} if entry.get("sharedWithAll") else {}
    extras |= {"localPrefixes": prefixes} if prefixes else {}
    return slug, fields, extras


def _kept(stored: Upstream | None) -> dict[str, str]:
    """The exported placeholders of a stored upstream's credentials, standing for the sealed values it holds: a
    placeholder whose variable is not set keeps the credential (a document of placeholders restores into the same
    gateway without its secrets)."""
    if stored is None:
        return {}
    return {
        placeholder_for(stored.slug, kind, key): value
        for name, kind in SECRET_KINDS.items()
        for key, value in getattr(stored, name).items()
    }


def _kept_whole(fields: dict[str, Any], where: str) -> None:
    for name in SECRET_KINDS:
        for key, value in fields[name].items():
            if PREFIX in value and not value.startswith(PREFIX):
                raise ConfigRefused(f"{where}: {name} {key!r} uses a kept credential inside a longer value: set it")


def _references_check(desired: Desired) -> None:
    """Every name an object gives is defined: by the document (teams: or on the gateway; console groups: on the
    gateway)."""
    teams = set(desired.sections["teams"]) | set(Team.objects.values_list("slug", flat=True))
    defined = {
        "team": teams,
        "serverGroup": set(desired.sections["serverGroups"]),
        "group": set(desired.sections["serverGroups"]),
        "agent": set(desired.sections["agents"]),
        "agentGroup": set(desired.sections["agentGroups"]),
        "upstream": set(desired.upstreams),
        "target": set(desired.upstreams),
        "signers": set(Group.objects.values_list("name", flat=True)),
    }
    nouns = {"group": "server group", "target": "upstream", "signers": "console group"} | {
        camel(noun.replace(" ", "_")): noun for noun in NOUNS.values()
    }
    named: list[tuple[str, dict[str, Any]]] = [
        (f"{s.noun} {key!r}", value) for s in NAMED for key, value in desired.sections[s.name].items()
    ]
    named += [(f"rule {rule_label(rule)!r}", rule) for rule in desired.rules]
    named += [(f"upstream {name!r}", extras) for name, _, extras in desired.upstreams.values()]
    for where, value in named:
        for relation, names in defined.items():
            if relation in value and (not isinstance(value[relation], str) or value[relation] not in names):
                raise ConfigRefused(f"{where} names {nouns[relation]} {value[relation]!r}, which {_where(relation)}")
        for agent in value.get("agents", []):
            if agent not in defined["agent"]:
                raise ConfigRefused(f"{where} names agent {agent!r}, which the document does not define")
        for team in [*value.get("sharedWith", []), *value.get("localPrefixes", {})]:
            if team not in teams:
                raise ConfigRefused(f"{where} names team {team!r}, which {_where('team')}")
        if "person" in value and not _person_valid(value["person"]):
            raise ConfigRefused(f"{where}: person must be an object of issuer and subject")


def _where(relation: str) -> str:
    if relation == "team":
        return "neither the document nor the gateway defines"
    if relation == "signers":
        return "this gateway does not have"
    return "the document does not define"


def _person_valid(person: Any) -> bool:
    return (
        isinstance(person, dict)
        and set(person) == {"issuer", "subject"}
        and all(isinstance(value, str) and value for value in person.values())
    )


def _diff(current: dict[str, Any], desired: Desired) -> list[Change]:
    """What changes, in the document's order of sections; teams are never removed (they hold people's roles)."""
    kept_teams = {slug: team for slug, team in current["teams"].items() if slug in desired.sections["teams"]}
    changes = _named_diff(TEAMS.noun, kept_teams, desired.sections["teams"])
    changes += _named_diff(SERVER_GROUPS.noun, current["serverGroups"], desired.sections["serverGroups"])
    now = {entry_slug(name, entry): entry | {"name": name} for name, entry in current["mcpServers"].items()}
    wanted = {slug: _upstream_shown(slug, *found) for slug, found in desired.upstreams.items()}
    changes += _secrets_diff(_named_diff("upstream", now, wanted), desired)
    for section in (AGENTS, AGENT_GROUPS, ROUTES, VIRTUAL_SERVERS):
        changes += _named_diff(section.noun, current[section.name], desired.sections[section.name])
    return changes + _rules_diff(current["rules"], desired.rules)


def _named_diff(noun: str, now: dict[str, Any], wanted: dict[str, Any]) -> list[Change]:
    changes = [Change("created", noun, name) for name in wanted if name not in now]
    for name in (name for name in wanted if name in now and wanted[name] != now[name]):
        fields = sorted(
            key for key in now[name].keys() | wanted[name].keys() if now[name].get(key) != wanted[name].get(key)
        )
        changes.append(Change("changed", noun, name, fields))
    return changes + [Change("removed", noun, name) for name in now if name not in wanted]


def _upstream_shown(slug: str, name: str, fields: dict[str, Any], extras: dict[str, Any]) -> dict[str, Any]:
    """The upstream as the export will write it once imported (credentials as their placeholders)."""
    return entry_export(Upstream(slug=slug, name=name, **fields), name, {}, routes=False) | extras | {"name": name}


def _secrets_diff(changes: list[Change], desired: Desired) -> list[Change]:
    """The upstream changes with the credentials that change too: their placeholders look alike whatever they
    stand for."""
    by_slug = {change.name: change for change in changes}
    for upstream in Upstream.objects.filter(slug__in=desired.upstreams):
        fields = desired.upstreams[upstream.slug][1]
        secrets = [
            f"{name}.{key}"
            for name in SECRET_KINDS
            for key, value in fields[name].items()
            if key in getattr(upstream, name) and not _same(getattr(upstream, name)[key], value, key)
        ]
        change = by_slug.get(upstream.slug)
        if secrets and change is None:
            changes.append(Change("changed", "upstream", upstream.slug, secrets))
        elif secrets and change is not None:
            change.fields = sorted(set(change.fields) | set(secrets))
    return changes


def _same(stored: str, given: str, name: str) -> bool:
    """Whether a credential the document gives is the one stored. The importer holds the plaintext already (from
    its environment); where it holds the private keys too, opening the stored one only says whether it changed."""
    if stored == given:
        return True  # a placeholder whose variable is unset: kept
    try:
        return credential_open(stored, name=name) == given
    except CredentialError:
        return False  # only the public key here: sealed again, as a change


def _rules_diff(now: list[dict[str, Any]], wanted: list[dict[str, Any]]) -> list[Change]:
    """Rules have no name: one whose fields change is one removed and one created."""
    have, want = Counter(map(rule_order, now)), Counter(map(rule_order, wanted))
    by_order = {rule_order(rule): rule for rule in [*now, *wanted]}
    created = [
        Change("created", "rule", repr(rule_label(by_order[o])), value=by_order[o]) for o in (want - have).elements()
    ]
    removed = [
        Change("removed", "rule", repr(rule_label(by_order[o])), value=by_order[o]) for o in (have - want).elements()
    ]
    return created + removed


# Removals go first, those that depend on others before them (a rule before the agent it names).
REMOVAL_ORDER = ("rule", "virtual server", "handoff route", "agent group", "agent", "upstream", "server group")


def _apply(desired: Desired, changes: list[Change], actor: str) -> None:
    removed = sorted((c for c in changes if c.action == "removed"), key=lambda c: REMOVAL_ORDER.index(c.noun))
    for change in removed:
        _remove(change, actor)
    made = {(change.noun, change.name) for change in changes if change.action != "removed"}
    for section in (TEAMS, SERVER_GROUPS):
        for name, value in desired.sections[section.name].items():
            if (section.noun, name) in made:
                with _about(f"{section.noun} {name!r}"):
                    _named_save(section, name, value, actor)
    for slug, (name, fields, extras) in desired.upstreams.items():
        if ("upstream", slug) in made:
            with _about(f"upstream {name!r}"):
                _upstream_save(slug, name, fields, extras, actor)
    for slug, (name, _, extras) in desired.upstreams.items():
        with _about(f"upstream {name!r}"):
            _sharing_apply(Upstream.objects.get(slug=slug), extras, actor)
    for section in (AGENTS, AGENT_GROUPS, ROUTES, VIRTUAL_SERVERS):
        for name, value in desired.sections[section.name].items():
            if (section.noun, name) in made:
                with _about(f"{section.noun} {name!r}"):
                    _named_save(section, name, value, actor)
    for change in changes:
        if change.noun == "rule" and change.action == "created":
            with _about(f"rule {change.name}"):
                rule = Rule()
                _assign(rule, RULES.fields, change.value, actor)
                rule.full_clean()
                rule_save(rule=rule, actor=actor, created=True)


@contextmanager
def _about(where: str) -> Iterator[None]:
    """A change the model or a service refuses, named (the transaction around every change then rolls back)."""
    try:
        yield
    except ValidationError as exc:
        raise ConfigRefused(f"{where}: {_messages(exc)}") from exc


def _remove(change: Change, actor: str) -> None:
    if change.noun == "upstream":
        upstream_delete(upstream=Upstream.objects.get(slug=change.name), actor=actor)
        return
    if change.noun == "rule":
        related = ("team", "agent", "agent_group", "person", "upstream", "server_group", "signers")
        rules = Rule.objects.select_related(*related)
        found = next(
            rule for rule in rules if rule_order(object_export(rule, RULES.fields)) == rule_order(change.value)
        )
        policy_object_delete(obj=found, actor=actor)
        return
    section = next(section for section in NAMED if section.noun == change.noun)
    policy_object_delete(obj=section.model.objects.get(**{section.key: change.name}), actor=actor)


def _assign(obj: Model, fields: tuple[str, ...], value: dict[str, Any], actor: str) -> None:
    """Set the object's fields from the document's (checked) values, relations looked up by name."""
    for name in fields:
        model_field = obj._meta.get_field(name)
        given = value.get(camel(name))
        if not model_field.is_relation:
            setattr(obj, name, given if camel(name) in value else model_field.get_default())
        elif given is None:
            setattr(obj, name, None)
        elif model_field.related_model is Person:
            setattr(obj, name, _person(given, actor))
        else:
            related = model_field.related_model
            setattr(obj, name, related.objects.get(**{NAMED_BY[related]: given}))


def _person(named: dict[str, str], actor: str) -> Person:
    """A person a rule names: made beforehand, as an admin may, if they were never seen."""
    found = Person.objects.filter(**named).first()
    if found is None:
        found = Person(**named)
        policy_object_save(obj=found, actor=actor, created=True)
    return found


def _named_save(section: Section, name: str, value: dict[str, Any], actor: str) -> None:
    obj = section.model.objects.filter(**{section.key: name}).first()
    created = obj is None
    obj = obj or section.model(**{section.key: name})
    _assign(obj, section.fields, value, actor)
    obj.full_clean()
    policy_object_save(obj=obj, actor=actor, created=created)
    if section is TEAMS:
        _team_groups_apply(obj, value.get("groups", {}), actor)
    elif section is VIRTUAL_SERVERS:
        server_overrides_apply(server=obj, wanted=value.get("overrides", {}), actor=actor)
    elif section is AGENT_GROUPS and sorted(obj.agents.values_list("name", flat=True)) != value["agents"]:
        obj.agents.set(Agent.objects.filter(name__in=value["agents"]))
        relations_record(obj=obj, actor=actor, action="agentgroup_members", members=value["agents"])


def _team_groups_apply(team: Team, groups: dict[str, str], actor: str) -> None:
    for mapping in TeamGroup.objects.filter(team=team).exclude(group__in=groups):
        policy_object_delete(obj=mapping, actor=actor)
    have = dict(TeamGroup.objects.filter(team=team).values_list("group", "role"))
    for group, role in groups.items():
        if have.get(group) != role:
            team_group_map(group=group, team=team.slug, role=role, actor=actor)


def _upstream_save(slug: str, name: str, fields: dict[str, Any], extras: dict[str, Any], actor: str) -> None:
    upstream = Upstream.objects.filter(slug=slug).first()
    created = upstream is None
    upstream = upstream or Upstream(slug=slug)
    upstream.name = name
    for key, value in fields.items():
        setattr(upstream, key, value)
    _assign(upstream, UPSTREAM_FIELDS, extras, actor)
    upstream.full_clean()
    upstream_save(upstream=upstream, actor=actor, created=created)


def _sharing_apply(upstream: Upstream, extras: dict[str, Any], actor: str) -> None:
    """Share the upstream and give its local prefixes as the document says, where they differ (each audited)."""
    shared = sorted(extras.get("sharedWith", []))
    shared_with_all = extras.get("sharedWithAll", False)
    if (
        sorted(upstream.shared_with.values_list("slug", flat=True)) != shared
        or upstream.shared_with_all != shared_with_all
    ):
        teams = list(Team.objects.filter(slug__in=shared))
        upstream_share(upstream=upstream, teams=teams, shared_with_all=shared_with_all, actor=actor)
    prefixes = extras.get("localPrefixes", {})
    have = dict(LocalPrefix.objects.filter(upstream=upstream).values_list("team__slug", "prefix"))
    for team in sorted(have.keys() | prefixes.keys()):
        if have.get(team) != prefixes.get(team):
            prefix = prefixes.get(team, "")
            local_prefix_set(upstream=upstream, team=Team.objects.get(slug=team), prefix=prefix, actor=actor)
