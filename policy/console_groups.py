"""The console's groups that a sign-in (policy/console_sign_in.py) or the demo's setup (its team admins) gives an
account: Reader, and the Team admin and Team auditor groups of team roles. Apart from the IdP sign-in, which loads
requests and mozilla-django-oidc: the demo's start gives groups and signs no one in."""

from django.contrib import admin
from django.contrib.auth.models import Group, Permission
from django.contrib.contenttypes.models import ContentType

from policy.admin import TeamScopedMixin
from policy.models import TeamRole

READER_GROUP = "Reader"  # every view permission, nothing else
TEAM_GROUPS = {TeamRole.ADMIN: "Team admin", TeamRole.AUDITOR: "Team auditor"}  # console groups of team roles


def reader_group() -> Group:
    group, _ = Group.objects.get_or_create(name=READER_GROUP)
    group.permissions.set(Permission.objects.filter(codename__startswith="view_"))
    return group


def _team_scoped_models() -> list[type]:
    """The models of the console's pages scoped by team (TeamScopedMixin), with their inlines' (an agent's keys)."""
    admin.autodiscover()  # registered at their first use (audit/apps.py)
    scoped = [(model, page) for model, page in admin.site._registry.items() if isinstance(page, TeamScopedMixin)]
    return [model for model, page in scoped for model in (model, *(inline.model for inline in page.inlines))]


def team_role_group(role: str) -> Group:
    """Team admin: every permission on what teams own, and reading the audit trail; Team auditor: reading the
    trail. What a team role lets one see and change is cut to its teams by the console (TeamScopedMixin)."""
    group, _ = Group.objects.get_or_create(name=TEAM_GROUPS[role])
    audit = Permission.objects.filter(content_type__app_label="audit", codename="view_auditevent")
    if role == TeamRole.ADMIN:
        types = ContentType.objects.get_for_models(*_team_scoped_models()).values()
        audit = audit | Permission.objects.filter(content_type__in=types)
    group.permissions.set(audit)
    return group
