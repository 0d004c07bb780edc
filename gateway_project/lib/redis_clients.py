"""This process's Redis clients of REDIS_URL: one synchronous, and one asynchronous per event loop."""

import asyncio
import threading
from functools import cache

import redis
import redis.asyncio as aredis
import redis.asyncio.retry
import redis.retry
from django.conf import settings
from redis.backoff import ExponentialWithJitterBackoff

# BLPOP waits as long as a call may take; redis-py's default 5 s socket timeout would cut it short.
REDIS_OPTIONS = {"socket_timeout": None, "socket_connect_timeout": 5}
# A pooled connection that Redis dropped (it restarted, or killed idle clients) fails on its next use: a
# command is sent again, on a new connection, up to twice. from_url gives none: Retry(NoBackoff(), 0). The
# bound keeps an outage's answers quick (about 0.1 s spent retrying).
_BACKOFF = {"backoff": ExponentialWithJitterBackoff(base=0.01, cap=0.1), "retries": 2}


@cache
def sync_redis() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL, **REDIS_OPTIONS, retry=redis.retry.Retry(**_BACKOFF))


# redis.asyncio clients belong to one event loop; a process may run several (web, pool thread, tests).
_async_clients: dict[tuple[int, str], aredis.Redis] = {}
_async_clients_lock = threading.Lock()


def async_redis(url: str = "") -> aredis.Redis:
    """This event loop's client of REDIS_URL (or of `url`: the Celery broker may live elsewhere)."""
    key = (id(asyncio.get_running_loop()), url or settings.REDIS_URL)
    with _async_clients_lock:
        if key not in _async_clients:
            retry = redis.asyncio.retry.Retry(**_BACKOFF)
            _async_clients[key] = aredis.Redis.from_url(key[1], **REDIS_OPTIONS, retry=retry)
        return _async_clients[key]
