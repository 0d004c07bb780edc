"""This process's Redis clients of REDIS_URL: one synchronous, and one asynchronous per event loop."""

import asyncio
import threading
from functools import cache

import redis
import redis.asyncio as aredis
from django.conf import settings

# BLPOP waits as long as a call may take; redis-py's default 5 s socket timeout would cut it short.
REDIS_OPTIONS = {"socket_timeout": None, "socket_connect_timeout": 5}


@cache
def sync_redis() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL, **REDIS_OPTIONS)


# redis.asyncio clients belong to one event loop; a process may run several (web, pool thread, tests).
_async_clients: dict[tuple[int, str], aredis.Redis] = {}
_async_clients_lock = threading.Lock()


def async_redis(url: str = "") -> aredis.Redis:
    """This event loop's client of REDIS_URL (or of `url`: the Celery broker may live elsewhere)."""
    key = (id(asyncio.get_running_loop()), url or settings.REDIS_URL)
    with _async_clients_lock:
        if key not in _async_clients:
            _async_clients[key] = aredis.Redis.from_url(key[1], **REDIS_OPTIONS)
        return _async_clients[key]
