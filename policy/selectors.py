"""Reads for more than one model: the OAuth clients a person allowed (django-oauth-toolkit's tokens), the
team roles a person's groups give them."""

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from django.contrib.auth.models import AbstractBaseUser
from django.utils import timezone
from oauth2_provider.models import get_access_token_model, get_application_model, get_refresh_token_model

from policy.models import ROLE_ORDER, TeamGroup, TeamMember


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
    groups give by the team group mappings, the strongest winning. A gateway admin (superuser) needs none."""
    groups = user.groups.values_list("name", flat=True)
    mapped = TeamGroup.objects.filter(group__in=groups).values_list("team__slug", "role")
    return _strongest([*mapped, *TeamMember.objects.filter(user=user).values_list("team__slug", "role")])


def teams_of(*, user: AbstractBaseUser, roles: Iterable[str]) -> frozenset[str] | None:
    """The slugs of the teams where the account has one of `roles`; None for a gateway admin (every team)."""
    if user.is_superuser:
        return None
    wanted = set(roles)
    return frozenset(team for team, role in user_team_roles(user=user).items() if role in wanted)
