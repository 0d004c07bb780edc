"""Credential key pairs (X25519) in the text form GATEWAY_CREDENTIAL_KEYS takes: settings make one for the
embedded default, registry/credentials.py seals and opens with them."""

import base64

from cryptography.hazmat.primitives import serialization
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
