"""Upstream credentials (stdio env values, HTTP header values), sealed at rest.

Sealing is public-key encryption (X25519, HKDF-SHA256, AES-256-GCM): whoever writes a credential (the admin,
`import_mcp_config`) needs only the public key, and only the executor, which holds the private keys, can open
one. So a web process in Celery mode can be given the public key alone and never hold a usable secret.

Keys come from the environment: GATEWAY_CREDENTIAL_KEYS lists private keys, newest first (older ones still
open what they sealed, until `rotate_credentials` reseals everything with the newest);
GATEWAY_CREDENTIAL_PUBLIC_KEY is for processes that must only seal. With neither, a key is made once in
var/ (the embedded default). A sealed value is `sbx1:<key id>:<base64url(ephemeral public key, nonce,
ciphertext)>`, bound to the variable's name so that values cannot be swapped between names.
"""

import hashlib
import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings

from gateway_project.lib.keys import RAW, b64, unb64

PREFIX = "sbx1:"
INFO = b"switchboard credential v1"


class CredentialError(Exception):
    """A credential that cannot be opened here; the message names no secret."""


def public_key_of(private_key: str) -> str:
    return b64(
        X25519PrivateKey.from_private_bytes(unb64(private_key))
        .public_key()
        .public_bytes(RAW, serialization.PublicFormat.Raw)
    )


def _key_id(public: bytes) -> str:
    return hashlib.sha256(public).hexdigest()[:8]


def _aead_key(shared: bytes, ephemeral: bytes, recipient: bytes) -> AESGCM:
    derived = HKDF(hashes.SHA256(), 32, salt=ephemeral + recipient, info=INFO).derive(shared)
    return AESGCM(derived)


def _private_keys() -> dict[str, X25519PrivateKey]:
    keys = [X25519PrivateKey.from_private_bytes(unb64(k)) for k in settings.GATEWAY_CREDENTIAL_KEYS]
    return {_key_id(k.public_key().public_bytes(RAW, serialization.PublicFormat.Raw)): k for k in keys}


def _public_key() -> bytes:
    if settings.GATEWAY_CREDENTIAL_PUBLIC_KEY:
        return unb64(settings.GATEWAY_CREDENTIAL_PUBLIC_KEY)
    if not settings.GATEWAY_CREDENTIAL_KEYS:
        raise CredentialError("no credential key: set GATEWAY_CREDENTIAL_PUBLIC_KEY or GATEWAY_CREDENTIAL_KEYS")
    return unb64(public_key_of(settings.GATEWAY_CREDENTIAL_KEYS[0]))


def is_sealed(value: str) -> bool:
    return value.startswith(PREFIX)


def credential_seal(value: str, *, name: str) -> str:
    recipient = _public_key()
    ephemeral = X25519PrivateKey.generate()
    ephemeral_public = ephemeral.public_key().public_bytes(RAW, serialization.PublicFormat.Raw)
    shared = ephemeral.exchange(X25519PublicKey.from_public_bytes(recipient))
    nonce = os.urandom(12)
    sealed = _aead_key(shared, ephemeral_public, recipient).encrypt(nonce, value.encode(), name.encode())
    return f"{PREFIX}{_key_id(recipient)}:{b64(ephemeral_public + nonce + sealed)}"


def credential_open(value: str, *, name: str) -> str:
    """The plaintext; only the executor calls this."""
    if not is_sealed(value):
        raise CredentialError(f"the value of {name} is not sealed; save the upstream again to seal it")
    key_id, _, body = value[len(PREFIX) :].partition(":")
    private = _private_keys().get(key_id)
    if private is None:
        raise CredentialError(f"the value of {name} was sealed with key {key_id}, which this process does not hold")
    data = unb64(body)
    ephemeral_public, nonce, sealed = data[:32], data[32:44], data[44:]
    recipient = private.public_key().public_bytes(RAW, serialization.PublicFormat.Raw)
    shared = private.exchange(X25519PublicKey.from_public_bytes(ephemeral_public))
    try:
        return _aead_key(shared, ephemeral_public, recipient).decrypt(nonce, sealed, name.encode()).decode()
    except InvalidTag:
        raise CredentialError(f"the value of {name} does not open: altered, or moved from another name") from None


def credentials_seal(values: dict[str, str]) -> dict[str, str]:
    """Seal every value not sealed yet (values the admin kept masked arrive sealed already)."""
    return {name: value if is_sealed(value) else credential_seal(value, name=name) for name, value in values.items()}


def credentials_open(values: dict[str, str]) -> dict[str, str]:
    return {name: credential_open(value, name=name) for name, value in values.items()}


def credentials_reseal(values: dict[str, str]) -> dict[str, str]:
    """Open and seal again, with the newest key."""
    return {name: credential_seal(credential_open(value, name=name), name=name) for name, value in values.items()}
