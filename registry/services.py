"""Everything that writes upstreams and their catalog."""

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from channels.db import database_sync_to_async
from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from audit.changes import change_detail, object_state
from audit.services import audit_record, audit_record_per_team, canonical_sha256
from policy.config_version import config_changed
from policy.limits.stores import limit_store
from policy.manifest import schema_problem, tool_name_problem
from policy.models import Team, team_slug_of
from policy.services import TeamRefused
from registry.credentials import credentials_reseal, credentials_seal
from registry.executor import get_executor
from registry.models import LocalPrefix, Tool, ToolOverride, Upstream, query_split
from registry.naming import exposed_name, split_exposed_name
from registry.overrides import Override, OverrideRefused, override_check, override_parse, override_stored
from registry.package_pins import package_pin
from registry.pinned_items import approval, pinned_items_store
from registry.selectors import name_collisions, namespace_of, share_collisions, team_names, teams_seeing
from registry.upstreams.health import command_missing
from registry.upstreams.loop import pool_thread
from registry.upstreams.outcome import DOCUMENT_REFUSED

logger = logging.getLogger(__name__)


SYNC_ACTOR = "catalog sync"


@dataclass
class SyncReport:
    upstream: str
    ok: bool
    added: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    held: list[str] = field(default_factory=list)  # added or changed, waiting for an administrator's approval
    items_held: list[str] = field(default_factory=list)  # resources, prompts, instructions (pinned_items.py)
    rejected: list[str] = field(default_factory=list)  # "name: why"
    error: str = ""
    code: str = ""  # when it failed: the outcome's code
    cause: str = ""  # when it failed: why, for the operator (registry/upstreams/health.py)

    def summary(self) -> str:
        if not self.ok:
            cause = f" (cause: {self.cause})" if self.cause else ""
            return f"{self.upstream}: catalog sync failed: {self.error}{cause}"
        text = (
            f"{self.upstream}: {len(self.added)} added, {len(self.changed)} changed, "
            f"{len(self.removed)} removed, {len(self.rejected)} rejected"
        )
        held = f"; held for approval: {', '.join(self.held + self.items_held)}" if self.held or self.items_held else ""
        rejected = f"; rejected: {'; '.join(self.rejected)}" if self.rejected else ""
        return text + held + rejected


def _tool_fields(definition: dict[str, Any]) -> dict[str, Any]:
    return {
        "title": definition.get("title") or "",
        "description": definition.get("description") or "",
        "input_schema": definition.get("inputSchema") or {},
        "output_schema": definition.get("outputSchema"),
        "annotations": definition.get("annotations"),
        "definition": definition,
        "definition_sha256": canonical_sha256(definition),
    }


def upstream_catalog_sync(*, upstream: Upstream, actor: str = SYNC_ACTOR) -> SyncReport:
    """Fetch every page of the upstream's tools, with its resources, templates, prompts and instructions, through
    the executor, and store them with their pins (tools here, the rest in pinned_items.py) in one transaction."""
    report = SyncReport(upstream=upstream.slug, ok=False)
    if upstream.handoff_only:
        # Its tools are listed through each handoff's own tunnel; without a delegation it would refuse anyway.
        report.ok = True
        return report
    if problem := package_pin(upstream=upstream, actor=actor):
        report.error = report.cause = problem
        logger.warning("catalog sync of %s failed: %s", upstream.slug, problem)
        Upstream.objects.filter(pk=upstream.pk).update(last_sync_error=problem)
        upstream_health_record(upstream_id=upstream.pk, health=Upstream.Health.FAILING, cause=problem)
        return report
    outcome = get_executor().list_tools(upstream_id=upstream.id, revision=upstream.revision, timeout=upstream.timeout)
    if not outcome["ok"]:
        report.error, report.code = f"{outcome['code']}: {outcome['message']}", outcome["code"]
        report.cause = outcome.get("cause", "")
        logger.warning("catalog sync of %s failed: %s", upstream.slug, report.cause or outcome.get("detail"))
        Upstream.objects.filter(pk=upstream.pk).update(last_sync_error=report.error)
        return report
    listed = outcome["result"]
    with transaction.atomic():
        _catalog_store(upstream, listed["tools"], report, actor)
        report.items_held, rejected = pinned_items_store(upstream=upstream, listed=listed, actor=actor)
        report.rejected += rejected
    Upstream.objects.filter(pk=upstream.pk).update(protocol_version=listed["protocolVersion"][:16])
    report.ok = True
    return report


def upstream_register(*, upstream: Upstream, actor: str) -> SyncReport:
    """The first sync of a new upstream. A REST upstream whose OpenAPI document is refused (hostile, broken, or
    pointing at a private address) is removed again: such a document registers nothing. A stdio upstream whose
    command does not exist is switched off: trying again later would find it missing still."""
    report = upstream_catalog_sync(upstream=upstream)
    if report.code == DOCUMENT_REFUSED:
        upstream_delete(upstream=upstream, actor=actor)
    elif not report.ok and command_missing(report.cause):
        upstream_set_enabled(upstream=upstream, enabled=False, actor=actor)
        report.error = f"{report.cause}. It was saved disabled: install the command or correct it, then enable it."
        report.cause = ""
        Upstream.objects.filter(pk=upstream.pk).update(last_sync_error=report.error)
    return report


def upstream_health_record(*, upstream_id: int, health: str, cause: str) -> None:
    """Store what a sync, call or probe found of the upstream (the executor's pool calls this)."""
    Upstream.objects.filter(pk=upstream_id).update(health=health, health_cause=cause, health_checked_at=timezone.now())


# The pool's listeners (registry/upstreams/loop.py), registered by RegistryConfig.ready(). Not on the thread-sensitive
# thread: under Daphne a sync view (an admin save that syncs a catalog) holds that thread while it waits for
# this very pool, and the write would wait for the view: a deadlock.


async def upstream_changed_resync(upstream_id: int, kind: str) -> None:
    if kind in ("tools", "prompts", "resources"):  # its catalog is synced again (pins hold changed items back)
        await database_sync_to_async(upstream_resync, thread_sensitive=False)(upstream_id)


async def upstream_health_store(upstream_id: int, health: str, cause: str) -> None:
    await database_sync_to_async(upstream_health_record, thread_sensitive=False)(
        upstream_id=upstream_id, health=health, cause=cause
    )


def upstream_health_probe() -> int:
    """List every reachable upstream's tools, all at once, on this process's own pool (a worker's under Celery
    beat, the web process's in the embedded default), which stores the health it finds; the number probed.
    A handoff-only upstream (a specialist) refuses a connection without a delegation, which counts as its answer."""
    upstreams = [u for u in Upstream.objects.select_related("group").filter(enabled=True) if u.is_reachable]
    runner = pool_thread()
    probes = [runner.submit(runner.pool.probe(u.id, u.revision, specialist=u.handoff_only)) for u in upstreams]
    for probe in probes:
        probe.result()
    return len(probes)


def upstream_resync(upstream_id: int) -> SyncReport | None:
    """Sync again after the upstream said its tools changed (None if it is gone or switched off)."""
    upstream = Upstream.objects.select_related("group").filter(pk=upstream_id).first()
    if upstream is None or not upstream.is_reachable:
        return None
    return upstream_catalog_sync(upstream=upstream, actor=f"{SYNC_ACTOR} (the upstream announced a change)")


def _taken_names(upstream: Upstream) -> dict[str, str]:
    """Exposed name -> the other upstream that already exposes it. Only an unprefixed upstream can collide."""
    others = Tool.objects.filter(upstream__handoff_only=False).exclude(upstream=upstream)
    others = others.select_related("upstream", "override")
    return {exposed_name(tool.upstream.namespace, tool.own_name): tool.upstream.slug for tool in others}


@dataclass(frozen=True)
class TeamView:
    """What one team that sees the upstream calls it, and the names its agents see from other upstreams."""

    team: str
    namespace: str
    taken: dict[str, str]


def _team_views(upstream: Upstream) -> list[TeamView]:
    """Each team seeing the upstream, under the name it gives it: a team's local prefix for another upstream
    may already hold a name this upstream would expose to it."""
    return [
        TeamView(team.slug, namespace_of(upstream=upstream, team=team), team_names(team=team, leave_out=upstream))
        for team in teams_seeing(upstream=upstream)
    ]


def _collision(upstream: Upstream, name: str, taken: dict[str, str], views: list[TeamView]) -> str | None:
    exposed = exposed_name(upstream.namespace, name)
    if owner := taken.get(exposed):
        return f"its name {exposed!r} is already exposed by upstream {owner!r}"
    for view in views:
        seen = exposed_name(view.namespace, name)
        if owner := view.taken.get(seen):
            return f"team {view.team!r} already sees {seen!r} from upstream {owner!r}"
    if upstream.prefixed or (parts := split_exposed_name(name)) is None:
        return None
    # An unprefixed tool named `github__delete_repo` would pass for github's tool, out of reach of the rules
    # that name github (tool shadowing): a namespace belongs to its upstream, even for names it lacks.
    if parts[0] == settings.GATEWAY_NAME:
        return "it would take the gateway's own namespace"
    if Upstream.objects.exclude(pk=upstream.pk).filter(slug=parts[0]).exists():
        return f"it would take upstream {parts[0]!r}'s namespace"
    return None


def rename_collision(*, upstream: Upstream, name: str) -> str | None:
    """Why one of the upstream's tools may not be presented as `name` (a tool agents see has it), if it may not."""
    return _collision(upstream, name, _taken_names(upstream), _team_views(upstream))


def _refusal(definition: Any, seen: set[str]) -> str | None:
    if not isinstance(definition, dict):
        return "not a tool definition"
    name = definition.get("name")
    problem = tool_name_problem(name)
    if problem is None and name in seen:
        problem = "listed twice"
    return problem or schema_problem(definition)


@transaction.atomic
def _catalog_store(upstream: Upstream, definitions: list[Any], report: SyncReport, actor: str) -> None:
    """Store the listing. The first sync approves what the administrator registered; afterwards a new tool
    follows the upstream's `new_tools` setting and a changed definition is held until approved."""
    # One sync of an upstream at a time (an upstream's list_changed may start one while another runs): the
    # second waits, then reads what the first stored.
    Upstream.objects.select_for_update().filter(pk=upstream.pk).first()
    now = timezone.now()
    existing = {tool.name: tool for tool in upstream.tools.select_related("override")}
    # A new tool may not take the name another of its upstream's tools is presented under (its override's).
    presented = {tool.own_name: tool.name for tool in existing.values() if tool.own_name != tool.name}
    first_sync = upstream.last_synced_at is None and not existing
    seen: set[str] = set()
    taken, views, collisions, colliding = _taken_names(upstream), _team_views(upstream), [], set()
    for definition in definitions:
        if problem := _refusal(definition, seen):
            name = definition.get("name") if isinstance(definition, dict) else None
            report.rejected.append(f"{str(name)[:128]!r}: {problem}")
            continue
        name = definition["name"]
        seen.add(name)
        if (other := presented.get(name, name)) != name:
            collisions.append(f"{name!r}: tool {other!r} is presented under that name (its override)")
            colliding.add(name)
            continue
        if collision := _collision(upstream, name, taken, views):
            collisions.append(f"{name!r}: {collision}")
            colliding.add(name)
            continue
        fields = _tool_fields(definition)
        sha256 = fields["definition_sha256"]
        tool = existing.get(name)
        if tool is None:
            approved = first_sync or upstream.new_tools == Upstream.NewTools.APPROVE
            pin = approval(definition, sha256, actor) if approved else {}
            Tool.objects.create(upstream=upstream, name=name, last_seen_at=now, **fields, **pin)
            report.added.append(name)
            action = "tool_added"
        else:
            approved = tool.approved_sha256 == sha256
            Tool.objects.filter(pk=tool.pk).update(last_seen_at=now, **fields)
            action = "tool_changed" if tool.definition_sha256 != sha256 else ""
            if action:
                report.changed.append(name)
        if not approved:
            report.held.append(name)
        if action:
            _catalog_event(upstream, action, name, sha256, held=not approved, actor=actor)
    report.rejected += collisions
    # A refused collision leaves the tool out until the other upstream or this one changes: the admin shows why.
    report.removed = sorted(set(existing) - (seen - colliding))
    for name in report.removed:
        _catalog_event(upstream, "tool_removed", name, existing[name].definition_sha256, held=False, actor=actor)
    upstream.tools.filter(name__in=report.removed).delete()
    refused = f"Refused (name collisions): {'; '.join(collisions)}" if collisions else ""
    Upstream.objects.filter(pk=upstream.pk).update(last_synced_at=now, last_sync_error=refused)
    upstream.last_synced_at = now
    config_changed()


def _catalog_event(upstream: Upstream, action: str, tool: str, sha256: str, *, held: bool, actor: str) -> None:
    detail = {"action": action, "definition_sha256": sha256, "held_for_approval": held}
    audit_record(
        kind="admin_change", actor=actor, upstream=upstream.slug, team=team_slug_of(upstream), tool=tool, detail=detail
    )


def tool_approve(*, tool: Tool, actor: str) -> None:
    """Pin the tool's current definition: agents see it again."""
    with transaction.atomic():
        previous = tool.approved_sha256
        Tool.objects.filter(pk=tool.pk).update(**approval(tool.definition, tool.definition_sha256, actor))
        config_changed()
        audit_record(
            kind="admin_change",
            actor=actor,
            upstream=tool.upstream.slug,
            team=team_slug_of(tool.upstream),
            tool=tool.name,
            detail={
                "action": "tool_approved",
                "definition_sha256": tool.definition_sha256,
                "previous_sha256": previous,
            },
        )
    tool.approved_sha256 = tool.definition_sha256


def upstream_set_enabled(*, upstream: Upstream, enabled: bool, actor: str = "") -> None:
    with transaction.atomic():
        Upstream.objects.filter(pk=upstream.pk).update(enabled=enabled, updated_at=timezone.now())
        config_changed()
        audit_record(
            kind="admin_change",
            actor=actor,
            upstream=upstream.slug,
            team=team_slug_of(upstream),
            detail={"action": "upstream_enabled" if enabled else "upstream_disabled"},
        )
    upstream.enabled = enabled


def upstream_save(*, upstream: Upstream, actor: str = "", created: bool = False) -> None:
    """Save an upstream, its credentials sealed (a query typed into the URL among them); a change in how to
    reach it bumps its revision so executors reconnect."""
    upstream.url, typed = query_split(upstream.url)
    upstream.query = upstream.query | typed
    for name in Upstream.SECRET_MAPS:
        setattr(upstream, name, credentials_seal(getattr(upstream, name)))
    with transaction.atomic():
        stored = None if created else Upstream.objects.filter(pk=upstream.pk).first()
        if stored and any(getattr(stored, f) != getattr(upstream, f) for f in Upstream.CONNECTION_FIELDS):
            upstream.revision += 1
        upstream.save()
        detail = {"action": "upstream_created" if created else "upstream_saved", "revision": upstream.revision}
        before = _upstream_state(stored) if stored else None
        audit_record(
            kind="admin_change",
            actor=actor,
            upstream=upstream.slug,
            team=team_slug_of(upstream),
            detail=detail | change_detail(before, _upstream_state(upstream)),
        )


def upstream_delete(*, upstream: Upstream, actor: str) -> None:
    """Remove an upstream and its catalog; agents lose its tools at once."""
    with transaction.atomic():
        detail = {"action": "upstream_deleted"} | change_detail(_upstream_state(upstream), None)
        team = team_slug_of(upstream)
        upstream.delete()
        audit_record(kind="admin_change", actor=actor, upstream=upstream.slug, team=team, detail=detail)


def _upstream_state(upstream: Upstream) -> dict:
    # env values, headers and query values may hold credentials, and so may a URL's user part.
    return object_state(upstream, secret_maps=Upstream.SECRET_MAPS, urls=("url",))


def upstream_breaker_reset(*, upstream: Upstream, actor: str) -> None:
    """Close the upstream's circuit by hand (after fixing what made it fail)."""
    limit_store().breaker_reset(upstream.id)
    detail = {"action": "breaker_reset"}
    audit_record(kind="admin_change", actor=actor, upstream=upstream.slug, team=team_slug_of(upstream), detail=detail)


def upstream_credentials_reseal(*, actor: str) -> int:
    """Seal every stored credential again with the newest key (after a rotation); the number of upstreams.
    Opens each value, so it runs where the private keys are, like the executor."""
    per_team: Counter[str] = Counter()
    with transaction.atomic():
        sealed = Upstream.objects.select_for_update(of=("self",)).select_related("team")
        for upstream in sealed.exclude(env={}, headers={}, query={}):
            resealed = {name: credentials_reseal(getattr(upstream, name)) for name in Upstream.SECRET_MAPS}
            # Same plaintext, same connection: no revision bump, no reconnect.
            Upstream.objects.filter(pk=upstream.pk).update(**resealed)
            per_team[upstream.team.slug] += 1
        details = {team: {"action": "credentials_resealed", "upstreams": n} for team, n in per_team.items()}
        gateway_wide = {"action": "credentials_resealed", "upstreams": 0}
        audit_record_per_team(kind="admin_change", actor=actor, details=details, gateway_wide=gateway_wide)
    return per_team.total()


# What a team owns, by relation (policy.models.team_field): a team that owns any of it is not deleted.
TEAM_OWNS = ("upstreams", "server_groups", "agents", "agent_groups", "rules", "handoff_routes")


def team_delete(*, team: Team, actor: str) -> None:
    """Delete a team with its members and group mappings. Refused while it shares an upstream (the borrowers
    would lose it without being told), naming them; then while it owns anything, naming what."""
    shared = team.upstreams.filter(Q(shared_with_all=True) | Q(shared_with__isnull=False)).distinct()
    if slugs := sorted(shared.values_list("slug", flat=True)):
        raise TeamRefused(
            "TEAM_SHARES_UPSTREAMS",
            f"Team {team.slug!r} still shares {', '.join(slugs)} with other teams: stop sharing "
            f"{'it' if len(slugs) == 1 else 'them'} before deleting the team.",
        )
    owned = {name: sorted(str(obj) for obj in getattr(team, name).all()) for name in TEAM_OWNS}
    if owned := {name.replace("_", " "): objs for name, objs in owned.items() if objs}:
        listed = "; ".join(f"{name} {', '.join(objs)}" for name, objs in owned.items())
        raise TeamRefused(
            "TEAM_NOT_EMPTY", f"Team {team.slug!r} still owns {listed}: move them to another team or delete them first."
        )
    with transaction.atomic():
        detail = {"action": "team_deleted", "name": team.name}
        team.delete()
        audit_record(kind="admin_change", actor=actor, team=team.slug, detail=detail)


def share_refusal(*, upstream: Upstream, teams: list[Team], shared_with_all: bool) -> str:
    """Why sharing the upstream with `teams` (or with all) is refused, or "": a borrower already uses one of the
    names it would expose (its own upstreams' or another borrowed one's), unless a local prefix of its tells
    them apart."""
    borrowers = list(Team.objects.exclude(pk=upstream.team_id).order_by("slug")) if shared_with_all else teams
    found = share_collisions(upstream=upstream, teams=borrowers)
    return " ".join(
        f"Team {team!r} already uses {', '.join(names)}: sharing {upstream.slug!r} with it would expose "
        f"{'it' if len(names) == 1 else 'them'} twice. Its admin can give {upstream.slug!r} a local prefix "
        "first, then share it again."
        for team, names in found.items()
    )


def upstream_share(*, upstream: Upstream, teams: list[Team], shared_with_all: bool, actor: str) -> None:
    """Share the upstream with exactly `teams` (and with all, or not): refused (ValidationError) when a borrower
    would see a name twice. Audited; every process sees it with the configuration version."""
    if upstream.team in teams:
        raise ValidationError({"shared_with": f"Team {upstream.team.slug!r} owns this upstream: share it with others."})
    if problem := share_refusal(upstream=upstream, teams=teams, shared_with_all=shared_with_all):
        raise ValidationError({"shared_with": problem})
    with transaction.atomic():
        before = {"shared_with": sorted(upstream.shared_with.values_list("slug", flat=True))}
        before["shared_with_all"] = upstream.shared_with_all
        Upstream.objects.filter(pk=upstream.pk).update(shared_with_all=shared_with_all, updated_at=timezone.now())
        upstream.shared_with_all = shared_with_all
        upstream.shared_with.set(teams)
        after = {"shared_with": sorted(team.slug for team in teams), "shared_with_all": shared_with_all}
        config_changed()
        detail = {"action": "upstream_shared", "before": before, "after": after}
        audit_record(
            kind="admin_change", actor=actor, upstream=upstream.slug, team=team_slug_of(upstream), detail=detail
        )


def local_prefix_check(*, upstream: Upstream, team: Team, prefix: str) -> LocalPrefix:
    """The team's local prefix row for the upstream as it would be saved, or ValidationError: a
    prefix taken by another of the team's upstreams, or one (or the upstream's own namespace, for "") that would
    make a name the team already sees from another upstream."""
    row = LocalPrefix.objects.filter(upstream=upstream, team=team).first()
    candidate = row or LocalPrefix(upstream=upstream, team=team)
    candidate.prefix = prefix
    if prefix:
        candidate.full_clean(validate_constraints=False)
        if LocalPrefix.objects.filter(team=team, prefix=prefix).exclude(upstream=upstream).exists():
            raise ValidationError({"prefix": f"Team {team.slug!r} already gives {prefix!r} to another upstream."})
    if names := name_collisions(upstream=upstream, team=team, namespace=prefix or upstream.namespace):
        raise ValidationError(
            {"prefix": f"Team {team.slug!r} already uses {', '.join(names)}: choose another local prefix."}
        )
    return candidate


def local_prefix_set(*, upstream: Upstream, team: Team, prefix: str, actor: str) -> LocalPrefix | None:
    """Give the borrowed upstream a local prefix for the team's agents ("" takes it away: its own namespace again).
    The team's exposed names change, so it is refused (ValidationError, `local_prefix_check`) if one would be a name
    the team already sees from another upstream, and it is an audit row of the team's naming both prefixes."""
    row = LocalPrefix.objects.filter(upstream=upstream, team=team).first()
    before = row.prefix if row else ""
    candidate = local_prefix_check(upstream=upstream, team=team, prefix=prefix)
    with transaction.atomic():
        if prefix:
            candidate.save()
        elif row:
            row.delete()
        config_changed()
        detail = {"action": "local_prefix_set", "team": team.slug, "before": before, "after": prefix}
        audit_record(kind="admin_change", actor=actor, upstream=upstream.slug, team=team.slug, detail=detail)
    return candidate if prefix else None


def tool_override_check(*, tool: Tool, data: Any) -> Override:
    """The override `data` describes (registry/overrides.py), if it fits the tool's definition and its name is one
    agents do not see already; else ValidationError naming why."""
    try:
        override = override_parse(data)
        override_check(override, tool.definition)
    except OverrideRefused as refused:
        raise ValidationError({"override": str(refused)}) from None
    upstream, own = tool.upstream, override.name or tool.name
    exposed = exposed_name(upstream.namespace, own)
    for other in upstream.tools.exclude(pk=tool.pk).select_related("override"):
        if exposed_name(upstream.namespace, other.own_name) == exposed:
            message = f"Tools {tool.name!r} and {other.name!r} would both be exposed as {exposed!r}."
            raise ValidationError({"override": message})
    if own != tool.own_name and (collision := rename_collision(upstream=upstream, name=own)):
        raise ValidationError({"override": f"Tool {tool.name!r} cannot be renamed {own!r}: {collision}."})
    return override


def tool_override_set(*, tool: Tool, data: Any, actor: str) -> ToolOverride:
    """Present the tool to agents as `data` says (refused with ValidationError, `tool_override_check`); its pin goes
    on comparing the upstream's definition. An audit row names the override's digest before and after."""
    override = tool_override_check(tool=tool, data=data)
    with transaction.atomic():
        row = ToolOverride.objects.filter(tool=tool).first()
        before = row.value().digest if row else ""
        row, _ = ToolOverride.objects.update_or_create(
            tool=tool, defaults=override_stored(override) | {"updated_by": actor}
        )
        _override_event(tool, before, override.digest, actor)
    tool.override = row
    return row


def tool_override_clear(*, tool: Tool, actor: str) -> None:
    """Agents see the tool as the upstream lists it again."""
    with transaction.atomic():
        row = ToolOverride.objects.filter(tool=tool).first()
        if row is None:
            return
        before = row.value().digest
        row.delete()
        _override_event(tool, before, "", actor)


def _override_event(tool: Tool, before: str, after: str, actor: str) -> None:
    config_changed()
    detail = {"action": "tool_override_set" if after else "tool_override_cleared", "before": before, "after": after}
    upstream = tool.upstream
    audit_record(
        kind="admin_change", actor=actor, upstream=upstream.slug, team=team_slug_of(upstream), tool=tool.name,
        detail=detail,
    )  # fmt: skip
