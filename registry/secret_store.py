"""Where personal credentials' values live: one interface, two backends, chosen by GATEWAY_SECRET_STORE.

- `database` (the default): the values in the gateway's own database (registry.SealedSecret).
- `vault`: a HashiCorp Vault or OpenBao KV v2 mount (registry/vault_store.py).

Either way the values are sealed (registry/credentials.py) before they reach the store, bound to their path and
field: whoever reads the store, or copies an entry to another person's path, still holds nothing usable. Only
the executor opens them. Paths follow `tenants/{tenant}/teams/{team}/users/{person}/{service}`, the team the
upstream belonged to when the values were stored (`PersonalCredential.secret_team`); a credential stored before
teams keeps `tenants/{tenant}/users/{person}/{service}` until `manage.py move_credentials` moves it.
"""

from functools import cache
from typing import Protocol

from django.conf import settings

from registry.credentials import credential_open, credential_seal
from registry.models import SealedSecret
from registry.vault_store import VaultStore, VaultStoreError

# What a store that cannot be reached raises (the message names the path and the cause, never a value).
SecretStoreUnavailable = VaultStoreError


class SecretStore(Protocol):
    def write(self, path: str, values: dict[str, str]) -> None:
        """Store sealed `values` at `path`, replacing what was there."""

    def read(self, path: str) -> dict[str, str]:
        """The sealed values at `path`; {} when there are none."""

    def delete(self, path: str) -> None:
        """Forget `path` (nothing happens if it holds nothing)."""


class DatabaseStore:
    def write(self, path: str, values: dict[str, str]) -> None:
        SealedSecret.objects.update_or_create(path=path, defaults={"values": values})

    def read(self, path: str) -> dict[str, str]:
        found = SealedSecret.objects.filter(path=path).values_list("values", flat=True).first()
        return dict(found or {})

    def delete(self, path: str) -> None:
        SealedSecret.objects.filter(path=path).delete()


@cache
def secret_store() -> SecretStore:
    if settings.GATEWAY_SECRET_STORE == "vault":
        return VaultStore()
    return DatabaseStore()


def secret_path(*, team: str, person: str, service: str) -> str:
    """The path of one person's (their digest's) credential for one service (an upstream's slug) of a team ("":
    where a credential stored before teams is)."""
    under = f"tenants/{settings.GATEWAY_SECRET_TENANT}/" + (f"teams/{team}/" if team else "")
    return f"{under}users/{person}/{service}"


def secrets_seal(path: str, values: dict[str, str]) -> dict[str, str]:
    """Seal each value bound to its path and field, so that it opens nowhere else."""
    return {field: credential_seal(value, name=f"{path}#{field}") for field, value in values.items()}


def secrets_open(path: str, values: dict[str, str]) -> dict[str, str]:
    """The plaintext; only the executor calls this."""
    return {field: credential_open(value, name=f"{path}#{field}") for field, value in values.items()}
