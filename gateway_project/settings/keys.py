"""The keys every process holds. Each is given: from its variable, from the file NAME_FILE names (a Secret
mounted as files), or already in var/; a process without one stops, naming it. Only the embedded default
(GATEWAY_MAKE_KEYS: on without DATABASE_URL, where var/ holds the database too) makes a missing key, once, in
var/: a deployment's replicas must share their keys, and losing var/ would lose the trail's and the sealed
credentials' keys. A key in var/ is read whether or not keys are made, so that a checkout that ran the
embedded default keeps its keys on PostgreSQL. `manage.py keys_make` makes a complete set for an operator to
store (docs/deploy.md)."""

from collections.abc import Callable

from django.core.exceptions import ImproperlyConfigured
from django.utils.crypto import salted_hmac

from gateway_project.environment import env_bool, env_secret, env_str
from gateway_project.lib.keys import key_generate, key_ring_generate, secret_key_generate
from gateway_project.settings.stores import DATABASE_URL
from gateway_project.settings.var import VAR_DIR

GATEWAY_MAKE_KEYS = env_bool("GATEWAY_MAKE_KEYS", not DATABASE_URL)


def key_missing(name: str, alternative: str = "") -> ImproperlyConfigured:
    either = f" or {alternative}" if alternative else ""
    return ImproperlyConfigured(
        f"{name} is not set: give it{either} (or {name}_FILE, a file holding it). This process makes no keys "
        "(GATEWAY_MAKE_KEYS is off): make a set once with `manage.py keys_make` and give every process the same."
    )


def _kept(name: str, file_name: str, make: Callable[[], str], alternative: str = "") -> str:
    """The key kept in var/`file_name`; where there is none, one made there (readable by this user only from the
    start) on the embedded default, else the process stops naming the variable that gives it."""
    key_file = VAR_DIR / file_name
    if not key_file.exists():
        if not GATEWAY_MAKE_KEYS:
            raise key_missing(name, alternative)
        key_file.touch(mode=0o600)
        key_file.write_text(make())
    return key_file.read_text().strip()


def key_read(name: str, file_name: str, make: Callable[[], str]) -> str:
    """NAME (or NAME_FILE), else the key kept in var/`file_name` (made there on the embedded default)."""
    return env_secret(name) or _kept(name, file_name, make)


SECRET_KEY = key_read("SECRET_KEY", "secret_key", secret_key_generate)


def _credential_keys() -> list[str]:
    """Private keys that open upstream credentials (registry/credentials.py), newest first. A process given
    only GATEWAY_CREDENTIAL_PUBLIC_KEY holds none (it seals, never opens)."""
    keys = [k.strip() for k in env_secret("GATEWAY_CREDENTIAL_KEYS").split(",") if k.strip()]
    if keys or env_str("GATEWAY_CREDENTIAL_PUBLIC_KEY"):
        return keys
    alternative = "GATEWAY_CREDENTIAL_PUBLIC_KEY (a web process that only seals)"
    return [_kept("GATEWAY_CREDENTIAL_KEYS", "credential_key", key_generate, alternative)]


GATEWAY_CREDENTIAL_KEYS = _credential_keys()
GATEWAY_CREDENTIAL_PUBLIC_KEY = env_str("GATEWAY_CREDENTIAL_PUBLIC_KEY")
# `kid:secret,...`, newest first. Delegation keys sign handoff tokens (gateway_project/lib/signing.py), shared with
# the specialist servers that verify them; audit keys sign every audit row and checkpoint (audit/integrity.py):
# keep them out of the database's reach.
GATEWAY_DELEGATION_KEYS = key_read("GATEWAY_DELEGATION_KEYS", "delegation_keys", key_ring_generate)
GATEWAY_AUDIT_KEYS = key_read("GATEWAY_AUDIT_KEYS", "audit_keys", key_ring_generate)


def _task_key() -> str:
    """The key of the MACs on Celery tasks and their replies (gateway_project/lib/task_mac.py), the same in web
    processes and workers; where keys are made (or SECRET_KEY is kept in var/) without GATEWAY_TASK_KEY, one
    derived from SECRET_KEY under a salt of its own."""
    given = env_secret("GATEWAY_TASK_KEY")
    if given and len(given) < 32:
        raise ImproperlyConfigured("GATEWAY_TASK_KEY must be 32 characters or more")  # a secret: never echoed
    if given:
        return given
    if not (GATEWAY_MAKE_KEYS or (VAR_DIR / "secret_key").exists()):
        raise key_missing("GATEWAY_TASK_KEY")
    return salted_hmac("switchboard.task_key", "", secret=SECRET_KEY, algorithm="sha256").hexdigest()


GATEWAY_TASK_KEY = _task_key()
