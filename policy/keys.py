"""Key format and checks: `sb_<prefix>_<secret>` for agents, `sba_<prefix>_<secret>` for operators' admin tokens;
only the secret's SHA-256 is stored. Keys are 256-bit random, so a fast hash is enough."""

import hashlib
import hmac

KEY_PREFIX = "sb_"
ADMIN_TOKEN_PREFIX = "sba_"
_NO_KEY = hashlib.sha256(b"").hexdigest()


def key_split(key: str, scheme: str = KEY_PREFIX) -> tuple[str, str] | None:
    """(lookup prefix, secret) of a well-formed key of the scheme, else None."""
    if not key.startswith(scheme):
        return None
    prefix, _, secret = key[len(scheme) :].partition("_")
    return (prefix, secret) if prefix and secret else None


def key_digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def key_matches(stored_digest: str | None, secret: str) -> bool:
    """Constant-time, and as slow for an unknown prefix as for a wrong secret."""
    return hmac.compare_digest(stored_digest or _NO_KEY, key_digest(secret)) and stored_digest is not None
