"""Agents, their API keys, server groups and rules: everything here that writes."""

import secrets
from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.db.models import Model
from django.utils import timezone
from oauth2_provider.models import (
    get_access_token_model,
    get_application_model,
    get_grant_model,
    get_id_token_model,
    get_refresh_token_model,
)

from audit.changes import change_detail, object_state
from audit.services import audit_record
from policy.config_version import config_changed
from policy.keys import ADMIN_TOKEN_PREFIX, KEY_PREFIX, key_digest
from policy.models import (
    AdminToken,
    Agent,
    AgentKey,
    Rule,
    ServerGroup,
    Team,
    TeamGroup,
    TeamRole,
    team_slug_of,
    visible_name,
)


@dataclass(frozen=True)
class IssuedKey:
    agent: Agent
    key: str


def _new_key() -> tuple[str, str]:
    return secrets.token_hex(6), secrets.token_urlsafe(32)


def agent_key_issue(*, agent: Agent, label: str = "", actor: str = "", **terms: Any) -> IssuedKey:
    """A new key for the agent (with `terms`: owner, tools, expires_at). The plain key exists only in the
    return value: show it once."""
    prefix, secret = _new_key()
    with transaction.atomic():
        AgentKey.objects.create(agent=agent, prefix=prefix, digest=key_digest(secret), label=label, **terms)
        audit_record(
            kind="admin_change",
            actor=actor,
            agent_name=agent.name,
            team=team_slug_of(agent),
            detail={"action": "agent_key_issued", "prefix": prefix} | _terms_shown(terms),
        )
    return IssuedKey(agent=agent, key=f"{KEY_PREFIX}{prefix}_{secret}")


def _terms_shown(terms: dict[str, Any]) -> dict[str, Any]:
    shown = {"owner": terms["owner"].get_username()} if terms.get("owner") else {}
    if terms.get("tools"):
        shown["tools"] = terms["tools"]
    if terms.get("expires_at"):
        shown["expires_at"] = terms["expires_at"].isoformat()
    return shown


def agent_create(*, name: str, actor: str = "", team: Team | None = None) -> IssuedKey:
    """A new agent (of `team`, else the default team) and its first key."""
    visible_name(name)
    with transaction.atomic():
        agent = Agent.objects.create(name=name, **({"team": team} if team else {}))
        audit_record(
            kind="admin_change",
            actor=actor,
            agent_id=agent.id,
            agent_name=name,
            team=team_slug_of(agent),
            detail={"action": "agent_created"},
        )
        return agent_key_issue(agent=agent, actor=actor)


def agent_set_enabled(*, agent: Agent, enabled: bool, actor: str = "") -> None:
    with transaction.atomic():
        Agent.objects.filter(pk=agent.pk).update(enabled=enabled)
        config_changed()
        audit_record(
            kind="admin_change",
            actor=actor,
            agent_id=agent.id,
            agent_name=agent.name,
            team=team_slug_of(agent),
            detail={"action": "agent_enabled" if enabled else "agent_disabled"},
        )
    agent.enabled = enabled


def key_used(prefix: str, address: str) -> None:
    """When and where a key was last used. An update, not a save: it changes nothing routing reads."""
    AgentKey.objects.filter(prefix=prefix).update(last_used_at=timezone.now(), last_used_from=address[:64])


def agent_key_revoke(*, prefix: str, actor: str = "") -> None:
    with transaction.atomic():
        AgentKey.objects.filter(prefix=prefix).update(revoked=True)
        config_changed()
        team = AgentKey.objects.filter(prefix=prefix).values_list("agent__team__slug", flat=True).first() or ""
        detail = {"action": "agent_key_revoked", "prefix": prefix}
        audit_record(kind="admin_change", actor=actor, team=team, detail=detail)


def group_set_enabled(*, group: ServerGroup, enabled: bool, actor: str = "") -> None:
    with transaction.atomic():
        ServerGroup.objects.filter(pk=group.pk).update(enabled=enabled)
        config_changed()
        audit_record(
            kind="admin_change",
            actor=actor,
            team=team_slug_of(group),
            detail={"action": "group_enabled" if enabled else "group_disabled", "group": group.name},
        )
    group.enabled = enabled


def _stored_state(obj: Model) -> dict | None:
    stored = type(obj).objects.filter(pk=obj.pk).first() if obj.pk else None
    return object_state(stored) if stored else None


def rule_save(*, rule: Rule, actor: str = "", created: bool = False) -> None:
    """Save a rule (its post_save moves the snapshot version) with an audit row of what changed."""
    with transaction.atomic():
        before = None if created else _stored_state(rule)
        rule.save()
        detail = {"action": "rule_created" if created else "rule_saved", "rule": rule.pk}
        changed = change_detail(before, object_state(rule))
        audit_record(kind="admin_change", actor=actor, team=team_slug_of(rule), detail=detail | changed)


def policy_object_save(*, obj: Model, actor: str, created: bool) -> None:
    """Save an agent, a group or a handoff route as the admin's form left it, with an audit row of what
    changed (none of their fields is secret: keys live in AgentKey, as hashes)."""
    with transaction.atomic():
        before = None if created else _stored_state(obj)
        obj.save()
        action = f"{obj._meta.model_name}_{'created' if created else 'saved'}"
        detail = {"action": action, "name": str(obj)} | change_detail(before, object_state(obj))
        audit_record(kind="admin_change", actor=actor, team=team_slug_of(obj), detail=detail)


def relations_record(*, obj: Model, actor: str, action: str, **relations: list[str]) -> None:
    """After the admin saved an object's many-to-many relations (a group's members, an operator's groups and
    permissions): what they are now."""
    detail = {"action": action, "name": str(obj)} | {name: sorted(values) for name, values in relations.items()}
    audit_record(kind="admin_change", actor=actor, team=team_slug_of(obj), detail=detail)


def admin_token_issue(*, user: Any, label: str = "", actor: str = "") -> str:
    """A new REST API token acting as `user`. The plain token exists only in the return value: show it once."""
    prefix, secret = _new_key()
    with transaction.atomic():
        AdminToken.objects.create(user=user, prefix=prefix, digest=key_digest(secret), label=label)
        detail = {"action": "admin_token_issued", "prefix": prefix, "user": user.get_username(), "label": label}
        audit_record(kind="admin_change", actor=actor, detail=detail)
    return f"{ADMIN_TOKEN_PREFIX}{prefix}_{secret}"


def admin_token_revoke(*, token: AdminToken, actor: str) -> None:
    with transaction.atomic():
        AdminToken.objects.filter(pk=token.pk).update(revoked=True)
        detail = {"action": "admin_token_revoked", "prefix": token.prefix, "user": token.user.get_username()}
        audit_record(kind="admin_change", actor=actor, detail=detail)


def policy_object_delete(*, obj: Model, actor: str) -> None:
    """Delete an agent, a group, a rule or a route, with an audit row of what it was."""
    with transaction.atomic():
        detail = {"action": f"{obj._meta.model_name}_deleted", "id": obj.pk, "name": str(obj)}
        detail |= change_detail(object_state(obj), None)
        team = team_slug_of(obj)
        obj.delete()
        audit_record(kind="admin_change", actor=actor, team=team, detail=detail)


def oauth_client_revoke(*, user: AbstractBaseUser, client_id: str, actor: str) -> int:
    """Take back what `user` allowed the client: every token and code it holds of theirs ends now (refresh
    tokens are kept, revoked, so a reuse is recognised); the number of tokens that still worked. The version
    moves so that every web process looks tokens up again (policy/authorization.py remembers them)."""
    application = get_application_model().objects.get(client_id=client_id)
    mine = {"user": user, "application": application}
    now = timezone.now()
    with transaction.atomic():
        refreshed = get_refresh_token_model().objects.filter(**mine, revoked__isnull=True).update(revoked=now)
        accessed = get_access_token_model().objects.filter(**mine, expires__gt=now).count()
        get_access_token_model().objects.filter(**mine).delete()
        get_id_token_model().objects.filter(**mine).delete()
        get_grant_model().objects.filter(**mine).delete()
        config_changed()
        detail = {"action": "oauth_client_revoked", "client_id": client_id, "client": application.name}
        audit_record(kind="admin_change", actor=actor, detail=detail | {"tokens": refreshed + accessed})
    return refreshed + accessed


class TeamRefused(Exception):
    """A change to teams that cannot be made: a stable code, and a message that says what to do instead."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


def team_group_map(*, group: str, team: str, role: str, actor: str = "") -> TeamGroup:
    """People in IdP group `group` have `role` in the team whose slug is `team` (changing the role if the
    group was mapped to that team already). A team that does not exist is refused, never made."""
    visible_name(group)
    if role not in TeamRole.values:
        raise TeamRefused("TEAM_ROLE_UNKNOWN", f"No role {role!r}: a team role is one of {', '.join(TeamRole.values)}.")
    found = Team.objects.filter(slug=team).first()
    if found is None:
        raise TeamRefused("TEAM_UNKNOWN", f"No team {team!r}: create the team first, then map {group!r} to it.")
    with transaction.atomic():
        mapping, _ = TeamGroup.objects.update_or_create(group=group, team=found, defaults={"role": role})
        detail = {"action": "team_group_mapped", "group": group, "team": found.slug, "role": role}
        audit_record(kind="admin_change", actor=actor, team=found.slug, detail=detail)
    return mapping
