"""The stores: the database (DATABASE_URL, else SQLite in var/), Redis (REDIS_URL) for the channel layer and
Celery's broker, and the executor that follows from them."""

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from gateway_project.environment import env_choice, env_float, env_int, env_str
from gateway_project.settings.var import VAR_DIR

# --- Databases -------------------------------------------------------------------------------
DATABASE_URL = env_str("DATABASE_URL")
if DATABASE_URL:
    # Under Daphne every request may run in a different thread: pooled connections, not persistent ones.
    try:
        _db = dj_database_url.parse(DATABASE_URL, conn_max_age=0)
    except ValueError as exc:  # its message names the scheme or port, never the password
        raise ImproperlyConfigured(f"DATABASE_URL must be a URL such as postgres://user@host/name: {exc}") from None
    if _db["ENGINE"] == "django.db.backends.postgresql":
        _pool_size = env_int("DATABASE_POOL_SIZE", 20, minimum=1, maximum=1000)
        _db["OPTIONS"] = {"pool": {"min_size": 1, "max_size": _pool_size, "timeout": 10}}
else:
    _db = {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": env_str("SQLITE_PATH", str(VAR_DIR / "switchboard.sqlite3")),
        "TEST": {"NAME": str(VAR_DIR / "test_switchboard.sqlite3")},
    }
if _db["ENGINE"] == "django.db.backends.sqlite3":  # SQLITE_PATH, or a DATABASE_URL of sqlite:///
    # Threads and processes write side by side (an upstream's change syncs its catalog while an import or a
    # request writes): WAL, and IMMEDIATE transactions, which take the write lock at BEGIN, so a writer waits
    # up to the timeout rather than failing at once as a read transaction that wants to write would.
    _db["OPTIONS"] = {
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        "transaction_mode": "IMMEDIATE",
        # How long a writer waits for another's lock; then an audit row is refused (AUDIT_UNAVAILABLE).
        "timeout": env_float("SQLITE_TIMEOUT_SECONDS", 20.0, minimum=0.1, maximum=600.0),
    }
DATABASES = {"default": _db}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Redis, channel layer, Celery ------------------------------------------------------------
REDIS_URL = env_str("REDIS_URL")
GATEWAY_EXECUTOR = env_choice("GATEWAY_EXECUTOR", "celery" if REDIS_URL else "inline", ("inline", "celery"))
if GATEWAY_EXECUTOR == "celery" and not REDIS_URL:
    raise ImproperlyConfigured("GATEWAY_EXECUTOR=celery needs REDIS_URL")

if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            # channels_redis blocks 5 s per receive; redis-py's default 5 s socket timeout would cut that
            # read short and crash every idle consumer. Longer than the pop, still short of a dead Redis.
            "CONFIG": {"hosts": [{"address": REDIS_URL, "socket_timeout": 15}], "prefix": "sb:channels:"},
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", REDIS_URL or "memory://")
# How an agent's call reaches a worker: a Celery task, or pushed straight to the workers' call consumers
# (registry/call_consumer.py), which skips Celery's consumer and the worker's thread hop (2 ms less a call): the
# default where the broker is Redis, the one broker the consumers read.
_REDIS_BROKER = CELERY_BROKER_URL.startswith(("redis://", "rediss://"))
GATEWAY_CALL_TRANSPORT = env_choice("GATEWAY_CALL_TRANSPORT", "direct" if _REDIS_BROKER else "task", ("task", "direct"))
if GATEWAY_CALL_TRANSPORT == "direct" and not _REDIS_BROKER:
    raise ImproperlyConfigured("GATEWAY_CALL_TRANSPORT=direct needs a Redis broker (CELERY_BROKER_URL)")
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_DEFAULT_QUEUE = "upstream"
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# Replies to the web process travel on Redis lists under this prefix (see registry/executor.py).
GATEWAY_REDIS_PREFIX = env_str("GATEWAY_REDIS_PREFIX", "sb:")
