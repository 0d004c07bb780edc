"""This process's Redis clients of REDIS_URL: one synchronous, and one asynchronous per event loop.

redis-py is imported by the first client made or the first error matched, not with this module: it costs a
process 0.15-0.2 s to start, and the embedded default never uses it. Catch its errors as
`redis_clients.RedisError`, which is looked up only when an exception is being matched."""

import asyncio
import hashlib
import threading
from collections.abc import Awaitable, Callable
from functools import cache
from typing import TYPE_CHECKING, Any

from django.conf import settings

from gateway_project.lib import redis_line

if TYPE_CHECKING:
    import redis
    import redis.asyncio

# BLPOP waits as long as a call may take; redis-py's default 5 s socket timeout would cut it short.
REDIS_OPTIONS = {"socket_timeout": None, "socket_connect_timeout": 5}


def __getattr__(name: str) -> Any:
    if name == "RedisError":
        import redis

        return redis.RedisError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _retry(retry_class: type) -> Any:
    """A pooled connection that Redis dropped (it restarted, or killed idle clients) fails on its next use: a
    command is sent again, on a new connection, up to twice. from_url gives none: Retry(NoBackoff(), 0). The
    bound keeps an outage's answers quick (about 0.1 s spent retrying)."""
    from redis.backoff import ExponentialWithJitterBackoff

    return retry_class(backoff=ExponentialWithJitterBackoff(base=0.01, cap=0.1), retries=2)


@cache
def sync_redis() -> "redis.Redis":
    import redis
    import redis.retry

    return redis.Redis.from_url(settings.REDIS_URL, **REDIS_OPTIONS, retry=_retry(redis.retry.Retry))


# redis.asyncio clients belong to one event loop; a process may run several (web, pool thread, tests).
_async_clients: dict[tuple[int, str], "redis.asyncio.Redis"] = {}
_async_clients_lock = threading.Lock()


def async_redis(url: str = "") -> "redis.asyncio.Redis":
    """This event loop's client of REDIS_URL (or of `url`: the Celery broker may live elsewhere)."""
    key = (id(asyncio.get_running_loop()), url or settings.REDIS_URL)
    with _async_clients_lock:
        if key not in _async_clients:
            import redis.asyncio
            import redis.asyncio.retry

            retry = _retry(redis.asyncio.retry.Retry)
            _async_clients[key] = redis.asyncio.Redis.from_url(key[1], **REDIS_OPTIONS, retry=retry)
        return _async_clients[key]


@cache
def _sha1(script: str) -> str:
    return hashlib.sha1(script.encode()).hexdigest()


def _sender(url: str = "") -> Callable[..., Awaitable[Any]]:
    """How this loop sends a command to REDIS_URL (or `url`): over its line (redis_line.py), which costs a fraction
    of redis-py's CPU, unless the URL asks for what only redis-py's client does (TLS, socket options)."""
    client = redis_line.line_for(url or settings.REDIS_URL) or async_redis(url)
    return client.command if isinstance(client, redis_line.Line) else client.execute_command


async def command(*args: Any, url: str = "") -> Any:
    """One plain command (`command("GET", key)`) to REDIS_URL (or `url`: the Celery broker may live elsewhere),
    answered and failing as redis-py's execute_command does."""
    return await _sender(url)(*args)


async def script_run(script: str, keys: list[str], args: list[Any]) -> Any:
    """A Lua script by its digest (EVALSHA): a call's scripts run on every call, and EVAL would send their
    text and have Redis hash it each time. A Redis that does not hold it (restarted, its scripts flushed) is
    sent the text once, which it then keeps."""
    import redis

    send = _sender()
    try:
        return await send("EVALSHA", _sha1(script), len(keys), *keys, *args)
    except redis.exceptions.NoScriptError:
        return await send("EVAL", script, len(keys), *keys, *args)
