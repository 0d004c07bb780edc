"""How the REST API knows its caller: `Authorization: Bearer sba_<prefix>_<secret>`, an admin token acting as
its Django user, whose model permissions then decide (reading needs the view permission too)."""

from datetime import timedelta

from django.utils import timezone
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.permissions import DjangoModelPermissions

from policy.keys import ADMIN_TOKEN_PREFIX, KEY_PREFIX, key_matches, key_split
from policy.models import AdminToken, AgentKey

_TOUCH_EVERY = timedelta(minutes=1)  # last_used_at is for operators, not a write per request


class AdminTokenAuthentication(BaseAuthentication):
    def authenticate(self, request):
        scheme, _, token = get_authorization_header(request).decode("latin-1").partition(" ")
        if scheme.lower() != "bearer":
            return None
        parts = key_split(token.strip(), ADMIN_TOKEN_PREFIX)
        row = None
        if parts:
            row = AdminToken.objects.select_related("user").filter(prefix=parts[0], revoked=False).first()
        if not key_matches(row.digest if row else None, parts[1] if parts else "") or not row.user.is_active:
            raise AuthenticationFailed("Invalid or revoked admin token.")
        now = timezone.now()
        if row.last_used_at is None or now - row.last_used_at > _TOUCH_EVERY:
            AdminToken.objects.filter(pk=row.pk).update(last_used_at=now)
        return row.user, row

    def authenticate_header(self, request) -> str:
        return 'Bearer realm="switchboard-admin"'


class ModelPermissions(DjangoModelPermissions):
    """The user's permissions on the model, reads included."""

    perms_map = DjangoModelPermissions.perms_map | {
        "GET": ["%(app_label)s.view_%(model_name)s"],
        "HEAD": ["%(app_label)s.view_%(model_name)s"],
    }


class AdminTokenScheme(OpenApiAuthenticationExtension):
    """How the OpenAPI schema names the scheme: an HTTP bearer token."""

    target_class = AdminTokenAuthentication
    name = "adminToken"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer", "description": "An admin token, sba_<prefix>_<secret>"}


class PersonalKeyAuthentication(BaseAuthentication):
    """A person's own personal key (`sb_…`, made in My account) acting as its owner: for the endpoints that
    touch only the caller's own things (their connections), never the admin API."""

    def authenticate(self, request):
        scheme, _, token = get_authorization_header(request).decode("latin-1").partition(" ")
        parts = key_split(token.strip(), KEY_PREFIX) if scheme.lower() == "bearer" else None
        if parts is None:
            return None
        row = AgentKey.objects.select_related("owner").filter(prefix=parts[0], revoked=False).first()
        owner = row.owner if row else None
        if not key_matches(row.digest if row else None, parts[1]) or owner is None or not owner.is_active:
            raise AuthenticationFailed("Invalid, revoked or unowned personal key: make one in My account.")
        if row.expires_at and row.expires_at <= timezone.now():
            raise AuthenticationFailed("This personal key has expired: make a new one in My account.")
        return owner, row

    def authenticate_header(self, request) -> str:
        return 'Bearer realm="switchboard"'
