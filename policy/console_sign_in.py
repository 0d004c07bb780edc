"""Console sign-in with the organisation's IdP (mozilla-django-oidc does the OIDC): its endpoints come from
the issuer's discovery document, and each sign-in sets the operator's role from their IdP groups: admin,
auditor (reads everything, argument payloads included) or reader (reads everything else). The same groups are
kept on the account's person (Person.signed_in_groups, replaced at each sign-in) and give it team roles through
the team group mappings (docs/teams.md): someone with no console role who is a team's `admin` or `auditor` is let
in, scoped to their teams, with the permissions of the Team admin or Team auditor group. Someone with neither is
not let into the console; they may sign in to their own account's pages (My account, Connections), as any person
may, and nowhere else."""

import time
from urllib.parse import urlsplit

import requests
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from mozilla_django_oidc.auth import OIDCAuthenticationBackend
from mozilla_django_oidc.utils import import_from_settings
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView

from audit.selectors import AUDITOR_GROUP
from policy.console_groups import READER_GROUP, TEAM_GROUPS, reader_group, team_role_group
from policy.models import Person, TeamMember
from policy.selectors import team_roles_list

ACCOUNT_PAGES = "/account/"  # where someone without a console role may sign in to
CONSOLE_TEAM_ROLES = set(TEAM_GROUPS)
ENDPOINTS = {
    "OIDC_OP_AUTHORIZATION_ENDPOINT": "authorization_endpoint",
    "OIDC_OP_TOKEN_ENDPOINT": "token_endpoint",
    "OIDC_OP_USER_ENDPOINT": "userinfo_endpoint",
    "OIDC_OP_JWKS_ENDPOINT": "jwks_uri",
}
DISCOVERY_SECONDS = 3600.0
_discovery: dict = {"document": None, "at": 0.0}


def _discovered() -> dict:
    """The issuer's discovery document, fetched again after an hour."""
    if _discovery["document"] is None or time.monotonic() - _discovery["at"] > DISCOVERY_SECONDS:
        issuer = settings.GATEWAY_OIDC_ISSUER.rstrip("/")
        reply = requests.get(f"{issuer}/.well-known/openid-configuration", timeout=settings.GATEWAY_OIDC_FETCH_TIMEOUT)
        reply.raise_for_status()
        _discovery.update(document=reply.json(), at=time.monotonic())
    return _discovery["document"]


def _setting(attr: str, *default):
    if attr in ENDPOINTS:
        return _discovered()[ENDPOINTS[attr]]
    return import_from_settings(attr, *default)


def groups_of(claims: dict) -> list[str]:
    """The person's IdP groups, as the claim names them (a single group may come as a string)."""
    groups = claims.get(settings.GATEWAY_CONSOLE_GROUPS_CLAIM) or []
    return sorted({str(group) for group in ([groups] if isinstance(groups, str) else groups)})


def role_of(claims: dict) -> str:
    """admin, auditor or reader, by the person's IdP groups (the first that matches wins), or ""."""
    groups = set(groups_of(claims))
    for role, names in (
        ("admin", settings.GATEWAY_CONSOLE_ADMIN_GROUPS),
        ("auditor", settings.GATEWAY_CONSOLE_AUDITOR_GROUPS),
        ("reader", settings.GATEWAY_CONSOLE_READER_GROUPS),
    ):
        if groups & set(names):
            return role
    return ""


def console_team_roles(*, claims: dict, username: str) -> set[str]:
    """The team roles that open the console (admin, auditor) the account has in any team: by its IdP groups now
    through the team group mappings, or by its memberships."""
    held = {*team_roles_list(groups=groups_of(claims)).values()}
    held.update(TeamMember.objects.filter(user__username=username).values_list("role", flat=True))
    return held & CONSOLE_TEAM_ROLES


class ConsoleBackend(OIDCAuthenticationBackend):
    """Operators as the IdP names them: one account per issuer and subject, its role set at every sign-in."""

    get_settings = staticmethod(_setting)

    @staticmethod
    def username(claims: dict) -> str:
        return f"{claims['sub']}@{urlsplit(settings.GATEWAY_OIDC_ISSUER).hostname}"[:150]

    def verify_claims(self, claims: dict) -> bool:
        if not claims.get("sub"):
            return False
        # The IdP's word on their groups counts even when it lets them in nowhere: a team role it took away is
        # gone from their account (and its REST API tokens) now, not at a sign-in that may never succeed again.
        people = Person.objects.filter(issuer=settings.GATEWAY_OIDC_ISSUER, subject=claims["sub"])
        people.update(signed_in_groups=groups_of(claims))
        going = str(self.request.session.get("oidc_login_next") or "")
        if role_of(claims) or console_team_roles(claims=claims, username=self.username(claims)):
            return True
        return going.startswith(ACCOUNT_PAGES)

    def filter_users_by_claims(self, claims: dict):
        return get_user_model().objects.filter(username=self.username(claims))

    def create_user(self, claims: dict):
        user = get_user_model().objects.create_user(self.username(claims))
        user.set_unusable_password()  # signs in through the IdP only
        return self.update_user(user, claims)

    def update_user(self, user, claims: dict):
        role = role_of(claims)
        team_roles = console_team_roles(claims=claims, username=user.get_username())
        name = str(claims.get("name") or "")
        user.first_name, _, user.last_name = (claims.get("given_name") or name).partition(" ")
        user.last_name = claims.get("family_name") or user.last_name
        user.email = str(claims.get("email") or "")
        user.is_staff, user.is_superuser = bool(role or team_roles), role == "admin"
        user.save()
        # The person the IdP's tokens name is this account: what its Connections act as (registry/connection_views.py).
        person, _ = Person.objects.get_or_create(
            issuer=settings.GATEWAY_OIDC_ISSUER, subject=claims["sub"], defaults={"name": name or claims["sub"]}
        )
        # Replaced at every sign-in, so a group removed at the IdP gives no team role from the next one on.
        Person.objects.filter(pk=person.pk).update(user=user, signed_in_groups=groups_of(claims))
        roles = {"auditor": [AUDITOR_GROUP, READER_GROUP], "reader": [READER_GROUP]}.get(role, [])
        groups = [reader_group() if n == READER_GROUP else Group.objects.get(name=n) for n in roles]
        if role != "admin":  # a gateway admin needs no team's permissions
            groups += [team_role_group(team_role) for team_role in sorted(team_roles)]
        user.groups.set(groups)
        return user


class ConsoleSignIn(OIDCAuthenticationRequestView):
    get_settings = staticmethod(_setting)


class ConsoleCallback(OIDCAuthenticationCallbackView):
    get_settings = staticmethod(_setting)
