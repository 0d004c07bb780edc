"""Every key a process holds, made in the text form its variable takes: the settings make each once in var/ on
the embedded default, `manage.py keys_make` makes a complete set for an operator to store, and
registry/credentials.py seals and opens with the credential key pairs (X25519)."""

import base64
import secrets

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

RAW = serialization.Encoding.Raw


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def key_generate() -> str:
    """A new private key, as GATEWAY_CREDENTIAL_KEYS takes it."""
    return b64(
        X25519PrivateKey.generate().private_bytes(RAW, serialization.PrivateFormat.Raw, serialization.NoEncryption())
    )


def secret_key_generate() -> str:
    """A new SECRET_KEY (Django's signing key)."""
    return secrets.token_urlsafe(50)


def key_ring_generate() -> str:
    """A new `kid:secret` ring of one key, as GATEWAY_DELEGATION_KEYS and GATEWAY_AUDIT_KEYS take it."""
    return f"k1:{secrets.token_urlsafe(32)}"


def task_key_generate() -> str:
    """A new GATEWAY_TASK_KEY (at least 32 characters)."""
    return secrets.token_urlsafe(32)


def auth_signing_key_generate() -> str:
    """A new RSA private key (PEM) for the built-in authorization server's ID tokens."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    return pem.decode()


# What `manage.py keys_make` writes: each variable, and the file it is kept in (the name var/ gives it, too).
KEY_FILES = {
    "SECRET_KEY": "secret_key",
    "GATEWAY_CREDENTIAL_KEYS": "credential_key",
    "GATEWAY_DELEGATION_KEYS": "delegation_keys",
    "GATEWAY_AUDIT_KEYS": "audit_keys",
    "GATEWAY_TASK_KEY": "task_key",
    "GATEWAY_AUTH_SIGNING_KEY": "auth_signing_key.pem",
}


def key_set_generate() -> dict[str, str]:
    """A complete set of new keys, by variable."""
    return {
        "SECRET_KEY": secret_key_generate(),
        "GATEWAY_CREDENTIAL_KEYS": key_generate(),
        "GATEWAY_DELEGATION_KEYS": key_ring_generate(),
        "GATEWAY_AUDIT_KEYS": key_ring_generate(),
        "GATEWAY_TASK_KEY": task_key_generate(),
        "GATEWAY_AUTH_SIGNING_KEY": auth_signing_key_generate(),
    }
