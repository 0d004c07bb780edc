"""Personal credentials' sealed values in a HashiCorp Vault or OpenBao KV v2 mount (GATEWAY_SECRET_STORE=vault).

One KV secret per `secret_path` (`tenants/{tenant}/teams/{team}/users/{person}/{service}`) under
GATEWAY_VAULT_MOUNT, its fields the sealed values. KV v2 keeps versions: `delete` removes the metadata and every
version, so a disconnected credential leaves nothing behind to undelete.

hvac and requests are imported by the store's first use, not with this module: they would cost every process
0.05-0.08 s to start, and most never use Vault.
"""

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from django.conf import settings

if TYPE_CHECKING:
    import hvac
    from hvac.api.secrets_engines.kv_v2 import KvV2

# (connect, read) seconds: an executor waiting on Vault holds a person's tool call.
TIMEOUT = (5.0, 10.0)


class VaultStoreError(Exception):
    """Vault refused or could not be reached. The message names the path and the cause, never a value or the token."""


class VaultStore:
    def __init__(
        self,
        *,
        url: str | None = None,
        token: str | None = None,
        mount: str | None = None,
        timeout: tuple[float, float] = TIMEOUT,
    ) -> None:
        """The settings' Vault unless told another (the tests' OpenBao)."""
        self.url = settings.GATEWAY_VAULT_URL if url is None else url
        self.mount = settings.GATEWAY_VAULT_MOUNT if mount is None else mount
        self._token = settings.GATEWAY_VAULT_TOKEN if token is None else token
        self.timeout = timeout
        self._client: hvac.Client | None = None
        self._pid = 0

    def write(self, path: str, values: dict[str, str]) -> None:
        with self._errors("write", path):
            self._kv().create_or_update_secret(path=path, secret=values, mount_point=self.mount)

    def read(self, path: str) -> dict[str, str]:
        from hvac.exceptions import InvalidPath

        with self._errors("read", path):
            try:
                response = self._kv().read_secret_version(
                    path=path, mount_point=self.mount, raise_on_deleted_version=True
                )
            except InvalidPath as exc:
                if exc.errors:  # Vault's reasons (no such mount): a misconfiguration, not a missing secret
                    raise
                return {}  # never written, or its latest version deleted by hand
        return dict(response["data"]["data"])

    def delete(self, path: str) -> None:
        with self._errors("delete", path):
            self._kv().delete_metadata_and_all_versions(path=path, mount_point=self.mount)

    def _kv(self) -> "KvV2":
        import hvac

        # A client per process: one made before a fork would share its connections with the child.
        if self._client is None or self._pid != os.getpid():
            self._client = hvac.Client(url=self.url, token=self._token, timeout=self.timeout)
            self._pid = os.getpid()
        return self._client.secrets.kv.v2

    @contextmanager
    def _errors(self, verb: str, path: str) -> Iterator[None]:
        import requests
        from hvac.exceptions import VaultError

        try:
            yield
        except (VaultError, requests.RequestException) as exc:
            # `from None`: hvac's and requests' own messages stay out of tracebacks and logs.
            raise VaultStoreError(f"Vault could not {verb} {self.mount}/{path}: {self._cause(exc)}") from None

    def _cause(self, exc: Exception) -> str:
        import requests
        from hvac.exceptions import Forbidden, VaultError

        if isinstance(exc, Forbidden):
            return "permission denied (GATEWAY_VAULT_TOKEN is not valid, or its policy does not allow this)"
        if isinstance(exc, VaultError):
            return f"{type(exc).__name__}: {'; '.join(exc.errors or []) or 'no reason given'}"
        parts = urlsplit(self.url)
        where = f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"  # without any user:password@
        if isinstance(exc, requests.Timeout):
            connect, reply = self.timeout
            return f"no answer from {where} within {connect:g} s to connect or {reply:g} s to reply"
        return f"cannot reach {where} ({_root_reason(exc)})"


def _root_reason(exc: BaseException) -> str:
    """The innermost cause (`Connection refused`, a TLS failure), not urllib3's pool and retry wrappers."""
    while (inner := exc.__cause__ or exc.__context__) is not None:
        exc = inner
    return (exc.strerror if isinstance(exc, OSError) else None) or str(exc) or type(exc).__name__
