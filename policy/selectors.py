"""Reads for more than one model: the OAuth clients a person allowed (django-oauth-toolkit's tokens), the
team roles a person's groups give them."""

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Q, QuerySet
from django.utils import timezone
from oauth2_provider.models import get_access_token_model, get_application_model, get_refresh_token_model

from policy.models import ROLE_ORDER, Person, Team, TeamGroup, TeamMember, TeamRole


@dataclass(frozen=True)
class AllowedClient:
    client_id: str
    name: str
    allowed_at: datetime  # its first token for this person: when they allowed it (rotations keep the chain)
    latest_at: datetime  # its newest token: when it last signed in or refreshed


def oauth_clients_allowed(*, user: AbstractBaseUser) -> list[AllowedClient]:
    """The clients holding a token of `user` that still works (an access token not expired, a refresh token
    not revoked), newest first."""
    tokens = [
        *get_access_token_model().objects.filter(user=user).values_list("application_id", "created", "expires"),
        *get_refresh_token_model().objects.filter(user=user).values_list("application_id", "created", "revoked"),
    ]
    now, spans, live = timezone.now(), {}, set()
    for application_id, created, ends in tokens:
        first, last = spans.get(application_id, (created, created))
        spans[application_id] = (min(first, created), max(last, created))
        # An access token's `ends` is its expiry (always set), a refresh token's its revocation (None: live).
        if ends is None or ends > now:
            live.add(application_id)
    names = get_application_model().objects.filter(pk__in=live).values_list("pk", "client_id", "name")
    clients = [AllowedClient(client_id, name, *spans[pk]) for pk, client_id, name in names]
    return sorted(clients, key=lambda client: client.latest_at, reverse=True)


def _strongest(held: Iterable[tuple[str, str]]) -> dict[str, str]:
    """(team slug, role) pairs as one role per team: the strongest (ROLE_ORDER) where several give one."""
    roles: dict[str, str] = {}
    for team, role in held:
        if team not in roles or ROLE_ORDER.index(role) < ROLE_ORDER.index(roles[team]):
            roles[team] = role
    return roles


def team_roles_list(*, groups: Iterable[str]) -> dict[str, str]:
    """The role in each team that a person in `groups` has by the team group mappings, by team slug; where
    several of their groups map to one team, the strongest role (ROLE_ORDER) wins."""
    return _strongest(TeamGroup.objects.filter(group__in=set(groups)).values_list("team__slug", "role"))


def user_team_roles(*, user: AbstractBaseUser) -> dict[str, str]:
    """A console account's role in each team, by team slug: its own memberships (TeamMember) and what its console
    groups and its IdP groups at its last console sign-in (Person.signed_in_groups) give by the team group
    mappings, the strongest winning. A gateway admin (superuser) needs none."""
    groups = {*user.groups.values_list("name", flat=True)}
    for signed_in in Person.objects.filter(user=user).values_list("signed_in_groups", flat=True):
        groups.update(str(group) for group in signed_in or ())
    mapped = TeamGroup.objects.filter(group__in=groups).values_list("team__slug", "role")
    return _strongest([*mapped, *TeamMember.objects.filter(user=user).values_list("team__slug", "role")])


def teams_of(*, user: AbstractBaseUser, roles: Iterable[str]) -> frozenset[str] | None:
    """The slugs of the teams where the account has one of `roles`; None for a gateway admin (every team)."""
    if user.is_superuser:
        return None
    wanted = set(roles)
    return frozenset(team for team, role in user_team_roles(user=user).items() if role in wanted)


def auditing_teams(*, user: AbstractBaseUser) -> frozenset[str] | None:
    """The teams whose audit rows the account reads: where it is `auditor` or `admin` (None: a gateway admin)."""
    return teams_of(user=user, roles=[TeamRole.AUDITOR, TeamRole.ADMIN])


def admin_teams(request: Any) -> frozenset[str] | None:
    """The slugs of the teams whose objects the account of a console or REST API request manages (where it is
    `admin`), once per request; None for a gateway admin (every team)."""
    if not request.user.is_authenticated:
        return frozenset()  # the sign-in page asks what the (anonymous) visitor may open
    if not hasattr(request, "_admin_teams"):
        request._admin_teams = teams_of(user=request.user, roles=[TeamRole.ADMIN])
    return request._admin_teams


def in_teams(rows: QuerySet, teams: frozenset[str] | None, path: str = "team") -> QuerySet:
    """Only the rows owned (through `path`) by those teams; all of them for None."""
    return rows if teams is None else rows.filter(**{f"{path}__slug__in": teams})


def team_choices(model: Any, teams: frozenset[str] | None, queryset: QuerySet) -> QuerySet:
    """`queryset` of `model` cut to what teams `teams` may pick: their own objects (a team, an owned object,
    an upstream of theirs or shared with them); unchanged for a gateway admin or what no team owns."""
    if teams is None:
        return queryset
    if model is Team:
        return queryset.filter(slug__in=teams)
    if model._meta.label == "registry.Upstream":
        shared = Q(team__slug__in=teams) | Q(shared_with__slug__in=teams) | Q(shared_with_all=True)
        return queryset.filter(pk__in=model.objects.filter(shared).values("pk"))
    if any(f.name == "team" for f in model._meta.fields):
        return in_teams(queryset, teams)
    return queryset
