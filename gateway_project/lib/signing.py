"""Delegation tokens: what a specialist server receives instead of the agent's credentials.

A token is a JWT (made and checked by PyJWT): the header names the algorithm (always HS256), the type and the
key id; the payload holds `iss`, `sub` (the domain), `aud` (the target upstream), `typ`, `iat`, `exp`, `tid`
(the delegation's unique id), optionally `traceparent`, `reason`, and the carry-over `state` or, past 2 KB,
`state_ref` (a claim-check id). It is signed with HMAC-SHA256 under the key the `kid` selects. PyJWT checks
the form and the signature; the claims are checked here, against a clock the caller may give.

No Django here: specialist servers import this module (through handoff/clearance.py) on their own.
"""

import hmac
import json
import time
from dataclasses import dataclass
from typing import Any

import jwt
from jwt.utils import base64url_decode

ALGORITHM = "HS256"
TOKEN_TYPE = "switchboard-delegation"
TOKEN_HEADER = "x-switchboard-delegation"  # the request header a token travels in
DEFAULT_TTL_SECONDS = 60
MAX_CLOCK_SKEW_SECONDS = 30
MAX_TOKEN_BYTES = 8192  # inline state stays under 2 KB; anything far larger is not ours


class DelegationError(Exception):
    """A token refused, with a stable code and a message for whoever presented it."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


def _invalid(message: str) -> DelegationError:
    return DelegationError("INVALID_DELEGATION_TOKEN", message)


def expired(message: str) -> DelegationError:
    return DelegationError("EXPIRED_DELEGATION_TOKEN", message)


def canonical_json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


@dataclass(frozen=True)
class KeyRing:
    """Signing keys by id; the first signs, every one verifies (so keys rotate without a flag day)."""

    keys: tuple[tuple[str, bytes], ...]

    @classmethod
    def parse(cls, text: str) -> "KeyRing":
        """`kid:secret,kid2:secret2`, newest first. Secrets are at least 32 characters."""
        keys = []
        for item in (part.strip() for part in text.split(",")):
            if not item:
                continue
            kid, sep, secret = item.partition(":")
            if not sep or not kid or len(secret) < 32:
                raise ValueError("keys are 'kid:secret' pairs with secrets of 32 characters or more")
            keys.append((kid, secret.encode()))
        if not keys:
            raise ValueError("no key given")
        return cls(tuple(keys))

    @property
    def signing_kid(self) -> str:
        return self.keys[0][0]

    def secret(self, kid: str) -> bytes | None:
        return next((secret for known, secret in self.keys if hmac.compare_digest(known, kid)), None)


def token_mint(
    ring: KeyRing, claims: dict[str, Any], *, ttl: float = DEFAULT_TTL_SECONDS, now: float | None = None
) -> str:
    """A token over `claims` plus `typ`, `iat` and `exp`, signed with the ring's newest key."""
    issued = int(now if now is not None else time.time())
    payload = claims | {"typ": TOKEN_TYPE, "iat": issued, "exp": issued + int(ttl)}
    secret = ring.secret(ring.signing_kid)
    assert secret is not None
    return jwt.encode(payload, secret, algorithm=ALGORITHM, headers={"typ": TOKEN_TYPE, "kid": ring.signing_kid})


# The claims are checked below, against the caller's clock and skew: PyJWT checks form and signature only.
_SIGNATURE_ONLY = {"verify_exp": False, "verify_iat": False, "verify_nbf": False, "verify_aud": False}
_NO_KEY = b"\0" * 32  # verified against when the kid is unknown, so that case costs what a bad signature does


def _unreadable(token: str) -> DelegationError:
    """What PyJWT could not decode: a signature garbled past decoding is still a signature that does not
    verify; anything else is malformed."""
    parts = token.split(".")
    try:
        readable = len(parts) == 3 and all(isinstance(json.loads(base64url_decode(part)), dict) for part in parts[:2])
    except ValueError:
        readable = False
    return _invalid(
        "The delegation token's signature does not verify." if readable else "The delegation token is malformed."
    )


def _signed_claims(ring: KeyRing, token: str) -> dict[str, Any]:
    try:
        header = jwt.get_unverified_header(token)
    except jwt.DecodeError:
        raise _unreadable(token) from None
    if header.get("alg") != ALGORITHM or header.get("typ") != TOKEN_TYPE:
        raise _invalid(f"Only {ALGORITHM} tokens of type {TOKEN_TYPE} are accepted.")
    secret = ring.secret(str(header.get("kid", "")))
    try:
        claims = jwt.decode(token, secret or _NO_KEY, algorithms=[ALGORITHM], options=_SIGNATURE_ONLY)
    except jwt.InvalidSignatureError:
        raise _invalid("The delegation token's signature does not verify.") from None
    except jwt.InvalidTokenError:
        raise _unreadable(token) from None
    if secret is None:
        raise _invalid("The delegation token's signature does not verify.")
    return claims


def token_verify(
    ring: KeyRing, token: str, *, audience: str | None, now: float | None = None, skew: float = MAX_CLOCK_SKEW_SECONDS
) -> dict[str, Any]:
    """The claims of a token made for `audience` (None: for any, as the issuer itself checks), or
    DelegationError. The signature is checked, in constant time, before anything in the payload is believed."""
    if len(token) > MAX_TOKEN_BYTES:
        raise _invalid("The delegation token is too long.")
    claims = _signed_claims(ring, token)
    if claims.get("typ") != TOKEN_TYPE:
        raise _invalid(f"Only tokens of type {TOKEN_TYPE} are accepted.")
    if not isinstance(claims.get("aud"), str) or (
        audience is not None and not hmac.compare_digest(claims["aud"], audience)
    ):
        raise _invalid("The delegation token was issued for another server.")
    issued, expires = claims.get("iat"), claims.get("exp")
    if not isinstance(issued, int) or not isinstance(expires, int) or not isinstance(claims.get("tid"), str):
        raise _invalid("The delegation token lacks iat, exp or tid.")
    clock = now if now is not None else time.time()
    if issued > clock + skew:
        raise _invalid("The delegation token was issued in the future.")
    if expires + skew < clock:
        raise expired("The delegation token has expired; ask the gateway for a new handoff.")
    return claims
