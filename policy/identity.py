"""Who a bearer token names: the OAuth 2.1 resource-server check of a JWT access token (RFC 9068) from one of
the identity providers (rows, and GATEWAY_OIDC_* for one more), the same for every transport. PyJWT does the
cryptography; this module decides which keys, algorithms, issuers, audiences and scopes it may accept,
caches what it has checked, and records the people it meets."""

import asyncio
import hashlib
import json
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import httpx2
import jwt
from django.conf import settings
from django.utils import timezone

from policy.models import Agent, IdentityProvider, Person

logger = logging.getLogger(__name__)
# Asymmetric only: a symmetric algorithm would let anyone holding the issuer's public key sign (and `none`, nobody).
ALGORITHMS = frozenset({"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"})
CHECKED_TOKENS = 10_000  # how many verified tokens are remembered until they expire
MAX_DOCUMENT_BYTES = 256 * 1024  # a discovery document or JWK set larger than this is refused


@dataclass(frozen=True)
class Provider:
    """An issuer as the routing snapshot holds it. `agent_id` is None when its agent is gone or disabled."""

    issuer: str
    audience: str  # empty: the canonical resource URI
    scopes: frozenset[str]
    agent_id: int | None
    agent_name: str
    subject_claim: str = "sub"
    name_claim: str = "name"
    groups_claim: str = "groups"


def providers_compile() -> dict[str, Provider]:
    """The enabled identity providers by issuer, the settings' one included (a row for the same issuer wins)."""
    found: dict[str, Provider] = {}
    if settings.GATEWAY_OIDC_ISSUER:
        agent = Agent.objects.filter(name=settings.GATEWAY_OIDC_AGENT, enabled=True).first()
        found[settings.GATEWAY_OIDC_ISSUER] = Provider(
            issuer=settings.GATEWAY_OIDC_ISSUER,
            audience=settings.GATEWAY_OIDC_AUDIENCE,
            scopes=frozenset(settings.GATEWAY_OIDC_SCOPES),
            agent_id=agent.id if agent else None,
            agent_name=agent.name if agent else "",
            subject_claim=settings.GATEWAY_OIDC_SUBJECT_CLAIM,
            name_claim=settings.GATEWAY_OIDC_NAME_CLAIM,
            groups_claim=settings.GATEWAY_OIDC_GROUPS_CLAIM,
        )
    for row in IdentityProvider.objects.filter(enabled=True).select_related("agent"):
        found[row.issuer] = Provider(
            issuer=row.issuer,
            audience=row.audience,
            scopes=frozenset(row.scopes.split()),
            agent_id=row.agent_id if row.agent.enabled else None,
            agent_name=row.agent.name,
            subject_claim=row.subject_claim,
            name_claim=row.name_claim,
            groups_claim=row.groups_claim,
        )
    return found


def people_disabled() -> frozenset[tuple[str, str]]:
    return frozenset(Person.objects.filter(enabled=False).values_list("issuer", "subject"))


def person_digest(issuer: str, subject: str) -> str:
    """A person's short, stable name where their issuer and subject cannot go as they are (keys, paths)."""
    return hashlib.sha256(f"{issuer}\n{subject}".encode()).hexdigest()[:24]


def person_seen(issuer: str, subject: str, name: str) -> None:
    """Record a person on first sight, and when they were last seen, for the console's list of people. Neither
    changes what routing reads, so neither sends the signal that makes every process compile a new snapshot."""
    now = timezone.now()
    met = Person(issuer=issuer, subject=subject, name=name, first_seen=now, last_seen=now)
    Person.objects.bulk_create([met], ignore_conflicts=True)
    Person.objects.filter(issuer=issuer, subject=subject).update(last_seen=now, name=name)


@dataclass(frozen=True)
class Identity:
    """The person a token names, and the client that acts for them."""

    issuer: str
    subject: str
    name: str
    client_id: str
    scopes: frozenset[str]
    expires_at: float
    groups: tuple[str, ...] = ()  # the person's groups, as their IdP (or the console) names them


class TokenRefused(Exception):
    """Why a token is not accepted: `error` is RFC 6750's (invalid_token, insufficient_scope), `status` the HTTP
    status to answer with (401, 403, or 503 when the issuer's keys cannot be had)."""

    def __init__(self, message: str, error: str = "invalid_token", status: int = 401) -> None:
        super().__init__(message)
        self.message, self.error, self.status = message, error, status


def looks_like_jwt(credential: str) -> bool:
    return credential.count(".") == 2 and not credential.startswith("sb")


class Issuer:
    """One OIDC issuer's signing keys, found through its discovery document and fetched again when a token
    names a key not seen yet (at most once per GATEWAY_OIDC_JWKS_REFRESH_SECONDS). Keys already fetched keep
    working while the issuer is unreachable."""

    def __init__(self, issuer: str) -> None:
        self.issuer = issuer.rstrip("/")
        self._keys: dict[str, jwt.PyJWK] = {}
        self._fetched_at = float("-inf")
        self._lock = asyncio.Lock()

    async def key(self, kid: str | None) -> jwt.PyJWK:
        if (found := self._find(kid)) is not None:
            return found
        async with self._lock:
            if (
                self._find(kid) is None
                and time.monotonic() - self._fetched_at >= settings.GATEWAY_OIDC_JWKS_REFRESH_SECONDS
            ):
                await self._refresh()
        if (found := self._find(kid)) is not None:
            return found
        raise TokenRefused(f"The token is signed with a key ({kid!r}) that its issuer does not publish")

    def _find(self, kid: str | None) -> jwt.PyJWK | None:
        if kid is None and len(self._keys) == 1:
            return next(iter(self._keys.values()))
        return self._keys.get(kid or "")

    async def _refresh(self) -> None:
        self._fetched_at = time.monotonic()
        try:
            async with httpx2.AsyncClient(timeout=settings.GATEWAY_OIDC_FETCH_TIMEOUT) as http:
                discovery = await _document(http, f"{self.issuer}/.well-known/openid-configuration")
                if discovery.get("issuer", "").rstrip("/") != self.issuer:
                    raise ValueError(f"its discovery document names another issuer ({discovery.get('issuer')!r})")
                keys = jwt.PyJWKSet.from_dict(await _document(http, str(discovery["jwks_uri"])))
        except (httpx2.HTTPError, ValueError, KeyError, jwt.PyJWKSetError) as exc:
            logger.warning("could not fetch the signing keys of %s: %s", self.issuer, exc)
            if not self._keys:
                raise TokenRefused(
                    f"The gateway cannot reach the signing keys of {self.issuer} to check the token; try again shortly",
                    status=503,
                ) from None
            return
        self._keys = {key.key_id or "": key for key in keys.keys if key.public_key_use in (None, "sig")}


async def _document(http: httpx2.AsyncClient, url: str) -> dict:
    response = await http.get(url, headers={"accept": "application/json"})
    response.raise_for_status()
    if len(response.content) > MAX_DOCUMENT_BYTES:
        raise ValueError(f"{url} is over {MAX_DOCUMENT_BYTES} bytes")
    document = json.loads(response.content)
    if not isinstance(document, dict):
        raise ValueError(f"{url} is not a JSON object")
    return document


def _names(claim: object) -> tuple[str, ...]:
    """A groups claim as names: a list of strings (or one string); anything else names none."""
    if isinstance(claim, str):
        return (claim,)
    return tuple(str(name) for name in claim if isinstance(name, str | int)) if isinstance(claim, list) else ()


class CheckedTokens:
    """What was found for a bearer token, remembered until a time (a token's expiry, or a lookup's shelf life),
    for the newest `capacity` tokens. Keyed by a digest of the configuration version, the audience and the
    token, so a change to either forgets what was found under the old ones."""

    def __init__(self, capacity: int = CHECKED_TOKENS) -> None:
        self._found: OrderedDict[str, tuple[float, Any]] = OrderedDict()
        self._capacity = capacity

    @staticmethod
    def key(version: int, audience: str, token: str) -> str:
        return hashlib.sha256(f"{version}\n{audience}\n{token}".encode()).hexdigest()

    def get(self, key: str) -> tuple[bool, Any]:
        """(True, what was found) while it is remembered, else (False, None)."""
        found = self._found.get(key)
        return (True, found[1]) if found is not None and found[0] > time.time() else (False, None)

    def put(self, key: str, value: Any, until: float) -> None:
        self._found[key] = (until, value)
        self._found.move_to_end(key)
        while len(self._found) > self._capacity:
            self._found.popitem(last=False)


class Verifier:
    """The gateway's check of bearer tokens: issuer, signature, audience, lifetime and scopes, and a memory of
    tokens already checked (until they expire, or the configuration changes) so a session's calls verify each
    token once."""

    def __init__(self) -> None:
        self._issuers: dict[str, Issuer] = {}
        self._checked = CheckedTokens()

    async def identity(self, token: str, audience: str, providers: dict[str, Provider], version: int) -> Identity:
        """The person `token` names, checked against `providers`; `audience` is the canonical resource URI and
        `version` the configuration's (a change to a provider drops what was checked under the old one)."""
        if len(token) > settings.GATEWAY_MAX_TOKEN_BYTES:
            raise TokenRefused(f"The token is over {settings.GATEWAY_MAX_TOKEN_BYTES} bytes")
        key = CheckedTokens.key(version, audience, token)
        known, identity = self._checked.get(key)
        if known:
            return identity
        identity = await self._verify(token, audience, providers)
        self._checked.put(key, identity, identity.expires_at)
        return identity

    async def _verify(self, token: str, audience: str, providers: dict[str, Provider]) -> Identity:
        try:
            header = jwt.get_unverified_header(token)
            issuer_claim = jwt.decode(token, options={"verify_signature": False}).get("iss")
        except jwt.DecodeError:
            raise TokenRefused("The token is not a well-formed JWT") from None
        algorithm = header.get("alg")
        if algorithm not in ALGORITHMS:
            raise TokenRefused(f"The token's algorithm {algorithm!r} is not accepted (asymmetric signatures only)")
        provider = providers.get(issuer_claim) if isinstance(issuer_claim, str) else None
        if provider is None:
            raise TokenRefused("The token comes from an issuer this gateway does not trust")
        key = await self._issuer(provider.issuer).key(header.get("kid"))
        claims = self._decode(token, key, algorithm, provider, provider.audience or audience)
        granted = frozenset(str(claims.get("scope", "")).split())
        if missing := provider.scopes - granted:
            raise TokenRefused(
                f"The token lacks the scope {' '.join(sorted(missing))} that this gateway requires",
                error="insufficient_scope",
                status=403,
            )
        subject = str(claims.get(provider.subject_claim) or "")
        if not subject:
            raise TokenRefused(f"The token has no {provider.subject_claim!r} claim to name its holder")
        name = claims.get(provider.name_claim) or claims.get("email") or subject
        return Identity(
            issuer=provider.issuer,
            subject=subject,
            name=str(name)[:150],
            client_id=str(claims.get("client_id") or claims.get("azp") or ""),
            scopes=granted,
            expires_at=float(claims["exp"]),
            groups=_names(claims.get(provider.groups_claim)),
        )

    def _issuer(self, issuer: str) -> Issuer:
        if issuer not in self._issuers:
            self._issuers[issuer] = Issuer(issuer)
        return self._issuers[issuer]

    @staticmethod
    def _decode(token: str, key: jwt.PyJWK, algorithm: str, provider: Provider, audience: str) -> dict:
        try:
            return jwt.decode(
                token,
                key,
                algorithms=[algorithm],
                audience=audience,
                issuer=provider.issuer,
                leeway=settings.GATEWAY_OIDC_LEEWAY_SECONDS,
                options={"require": ["exp", "iss", "aud"]},
            )
        except jwt.ExpiredSignatureError:
            raise TokenRefused("The token has expired: sign in again") from None
        except jwt.ImmatureSignatureError:
            raise TokenRefused("The token is not valid yet (its nbf or iat is in the future)") from None
        except jwt.InvalidAudienceError:
            raise TokenRefused(f"The token is not meant for this gateway: its audience is not {audience}") from None
        except jwt.InvalidIssuerError:
            raise TokenRefused("The token comes from an issuer this gateway does not trust") from None
        except jwt.InvalidSignatureError:
            raise TokenRefused("The token's signature does not verify") from None
        except jwt.MissingRequiredClaimError as exc:
            raise TokenRefused(f"The token has no {exc.claim!r} claim") from None
        except jwt.InvalidTokenError as exc:
            raise TokenRefused(f"The token is not valid: {exc}") from None


verifier = Verifier()
