"""Who a bearer token names: the OAuth 2.1 resource-server check of a JWT access token (RFC 9068) from a
configured issuer, the same for every transport. PyJWT does the cryptography; this module decides which
keys, algorithms, issuers, audiences and scopes it may accept, and caches what it has checked."""

import asyncio
import hashlib
import json
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass

import httpx2
import jwt
from django.conf import settings

logger = logging.getLogger(__name__)
# Asymmetric only: a symmetric algorithm would let anyone holding the issuer's public key sign (and `none`, nobody).
ALGORITHMS = frozenset({"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"})
CHECKED_TOKENS = 10_000  # how many verified tokens are remembered until they expire
MAX_DOCUMENT_BYTES = 256 * 1024  # a discovery document or JWK set larger than this is refused


@dataclass(frozen=True)
class Identity:
    """The person a token names, and the client that acts for them."""

    issuer: str
    subject: str
    name: str
    client_id: str
    scopes: frozenset[str]
    expires_at: float


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


class Verifier:
    """The gateway's check of bearer tokens: issuer, signature, audience, lifetime and scopes, and a memory of
    tokens already checked (until they expire) so a session's calls verify each token once."""

    def __init__(self) -> None:
        self._issuers: dict[str, Issuer] = {}
        self._checked: OrderedDict[str, Identity] = OrderedDict()

    @property
    def enabled(self) -> bool:
        return bool(settings.GATEWAY_OIDC_ISSUER)

    async def identity(self, token: str, audience: str) -> Identity:
        if len(token) > settings.GATEWAY_MAX_TOKEN_BYTES:
            raise TokenRefused(f"The token is over {settings.GATEWAY_MAX_TOKEN_BYTES} bytes")
        digest = hashlib.sha256(f"{audience}\n{token}".encode()).hexdigest()
        if (known := self._checked.get(digest)) is not None and known.expires_at > time.time():
            return known
        identity = await self._verify(token, audience)
        self._checked[digest] = identity
        while len(self._checked) > CHECKED_TOKENS:
            self._checked.popitem(last=False)
        return identity

    async def _verify(self, token: str, audience: str) -> Identity:
        try:
            header = jwt.get_unverified_header(token)
        except jwt.DecodeError:
            raise TokenRefused("The token is not a well-formed JWT") from None
        algorithm = header.get("alg")
        if algorithm not in ALGORITHMS:
            raise TokenRefused(f"The token's algorithm {algorithm!r} is not accepted (asymmetric signatures only)")
        issuer = self._issuer()
        key = await issuer.key(header.get("kid"))
        claims = self._decode(token, key, algorithm, audience)
        granted = frozenset(str(claims.get("scope", "")).split())
        missing = set(settings.GATEWAY_OIDC_SCOPES) - granted
        if missing:
            raise TokenRefused(
                f"The token lacks the scope {' '.join(sorted(missing))} that this gateway requires",
                error="insufficient_scope",
                status=403,
            )
        subject = str(claims.get(settings.GATEWAY_OIDC_SUBJECT_CLAIM) or "")
        if not subject:
            raise TokenRefused(f"The token has no {settings.GATEWAY_OIDC_SUBJECT_CLAIM!r} claim to name its holder")
        name = claims.get(settings.GATEWAY_OIDC_NAME_CLAIM) or claims.get("email") or subject
        return Identity(
            issuer=issuer.issuer,
            subject=subject,
            name=str(name)[:150],
            client_id=str(claims.get("client_id") or claims.get("azp") or ""),
            scopes=granted,
            expires_at=float(claims["exp"]),
        )

    def _issuer(self) -> Issuer:
        configured = settings.GATEWAY_OIDC_ISSUER.rstrip("/")
        if configured not in self._issuers:
            self._issuers[configured] = Issuer(configured)
        return self._issuers[configured]

    @staticmethod
    def _decode(token: str, key: jwt.PyJWK, algorithm: str, audience: str) -> dict:
        try:
            return jwt.decode(
                token,
                key,
                algorithms=[algorithm],
                audience=settings.GATEWAY_OIDC_AUDIENCE or audience,
                issuer=settings.GATEWAY_OIDC_ISSUER.rstrip("/"),
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
