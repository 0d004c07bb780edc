"""The built-in authorization server's own parts around django-oauth-toolkit (which does the OAuth): whom its
people act as, what one of its access tokens names (a lookup, remembered briefly), and how many clients one
address may register."""

import hashlib
import time

from django.conf import settings
from oauth2_provider.models import get_access_token_model

from gateway_project.lib.database import database_async
from policy.identity import CheckedTokens, Identity, Provider
from policy.models import Agent

SCOPE = "mcp"


def builtin_compile() -> Provider | None:
    """The built-in server as a provider, while it is on and its agent exists and is enabled."""
    if not settings.GATEWAY_AUTH_SERVER:
        return None
    agent = Agent.objects.filter(name=settings.GATEWAY_AUTH_SERVER_AGENT, enabled=True).first()
    if agent is None:
        return None
    return Provider(issuer="", audience="", scopes=frozenset({SCOPE}), agent_id=agent.id, agent_name=agent.name)


def token_lookup(token: str, resource: str) -> Identity | None:
    """Who a live access token of this server names, or None: unknown, expired, revoked, without the scope,
    for another resource (RFC 8707), or its account inactive. Its issuer is filled in by the caller."""
    checksum = hashlib.sha256(token.encode()).hexdigest()
    found = (
        get_access_token_model().objects.select_related("user", "application").filter(token_checksum=checksum).first()
    )
    if found is None or found.user is None or not found.user.is_active or found.is_expired():
        return None
    if not found.allow_scopes([SCOPE]) or (found.resource and resource not in found.resource):
        return None
    return Identity(
        issuer="",
        subject=str(found.user.pk),
        name=(found.user.get_full_name() or found.user.get_username())[:150],
        client_id=found.application.client_id if found.application else "",
        scopes=frozenset(found.scope.split()),
        expires_at=found.expires.timestamp(),
        groups=tuple(found.user.groups.values_list("name", flat=True)),
    )


class LocalTokens:
    """Lookups of this server's tokens, each remembered for GATEWAY_AUTH_LOOKUP_SECONDS (or until the token
    expires): a revoked token or a disabled account is refused at most that long after."""

    def __init__(self) -> None:
        self._known = CheckedTokens()

    async def identity(self, token: str, resource: str, version: int) -> Identity | None:
        key = CheckedTokens.key(version, resource, token)
        known, identity = self._known.get(key)
        if known:
            return identity
        identity = await database_async(token_lookup)(token, resource)
        until = time.time() + settings.GATEWAY_AUTH_LOOKUP_SECONDS
        self._known.put(key, identity, min(until, identity.expires_at) if identity else until)
        return identity


local_tokens = LocalTokens()
