"""Console sign-in with the organisation's IdP (mozilla-django-oidc does the OIDC): its endpoints come from
the issuer's discovery document, and each sign-in sets the operator's role from their IdP groups: admin,
auditor (reads everything, argument payloads included) or reader (reads everything else). Someone in none of
the groups is not let into the console; they may sign in to their own account's pages (My account, Connections),
as any person may, and nowhere else."""

import time
from urllib.parse import urlsplit

import requests
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from mozilla_django_oidc.auth import OIDCAuthenticationBackend
from mozilla_django_oidc.utils import import_from_settings
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView

from audit.selectors import AUDITOR_GROUP
from policy.models import Person

READER_GROUP = "Reader"  # every view permission, nothing else
ACCOUNT_PAGES = "/account/"  # where someone without a console role may sign in to
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


def role_of(claims: dict) -> str:
    """admin, auditor or reader, by the person's IdP groups (the first that matches wins), or ""."""
    groups = set(claims.get(settings.GATEWAY_CONSOLE_GROUPS_CLAIM) or [])
    for role, names in (
        ("admin", settings.GATEWAY_CONSOLE_ADMIN_GROUPS),
        ("auditor", settings.GATEWAY_CONSOLE_AUDITOR_GROUPS),
        ("reader", settings.GATEWAY_CONSOLE_READER_GROUPS),
    ):
        if groups & set(names):
            return role
    return ""


def _reader_group() -> Group:
    group, _ = Group.objects.get_or_create(name=READER_GROUP)
    group.permissions.set(Permission.objects.filter(codename__startswith="view_"))
    return group


class ConsoleBackend(OIDCAuthenticationBackend):
    """Operators as the IdP names them: one account per issuer and subject, its role set at every sign-in."""

    get_settings = staticmethod(_setting)

    @staticmethod
    def username(claims: dict) -> str:
        return f"{claims['sub']}@{urlsplit(settings.GATEWAY_OIDC_ISSUER).hostname}"[:150]

    def verify_claims(self, claims: dict) -> bool:
        if not claims.get("sub"):
            return False
        going = str(self.request.session.get("oidc_login_next") or "")
        return bool(role_of(claims)) or going.startswith(ACCOUNT_PAGES)

    def filter_users_by_claims(self, claims: dict):
        return get_user_model().objects.filter(username=self.username(claims))

    def create_user(self, claims: dict):
        user = get_user_model().objects.create_user(self.username(claims))
        user.set_unusable_password()  # signs in through the IdP only
        return self.update_user(user, claims)

    def update_user(self, user, claims: dict):
        role = role_of(claims)
        name = str(claims.get("name") or "")
        user.first_name, _, user.last_name = (claims.get("given_name") or name).partition(" ")
        user.last_name = claims.get("family_name") or user.last_name
        user.email = str(claims.get("email") or "")
        user.is_staff, user.is_superuser = bool(role), role == "admin"
        user.save()
        # The person the IdP's tokens name is this account: what its Connections act as (registry/connection_views.py).
        person, _ = Person.objects.get_or_create(
            issuer=settings.GATEWAY_OIDC_ISSUER, subject=claims["sub"], defaults={"name": name or claims["sub"]}
        )
        if person.user_id != user.pk:
            Person.objects.filter(pk=person.pk).update(user=user)
        roles = {"auditor": [AUDITOR_GROUP, READER_GROUP], "reader": [READER_GROUP]}.get(role, [])
        user.groups.set([_reader_group() if n == READER_GROUP else Group.objects.get(name=n) for n in roles])
        return user


class ConsoleSignIn(OIDCAuthenticationRequestView):
    get_settings = staticmethod(_setting)


class ConsoleCallback(OIDCAuthenticationCallbackView):
    get_settings = staticmethod(_setting)
