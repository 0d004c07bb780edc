"""A worker process's identity for handoff tunnels. Each worker consumes a queue of its own besides
`upstream`, so a tunnel's calls reach the process that holds it, and keeps a heartbeat key alive in Redis
so that callers learn within seconds, not at their timeout, that it died. Workers run `-P threads`: one
process, one pool, one queue."""

import logging
import threading
import time
import uuid

from django.conf import settings

from gateway_project.lib import redis_clients

logger = logging.getLogger(__name__)

HEARTBEAT_SECONDS = 1.0
ALIVE_TTL_SECONDS = 3
FORGOTTEN_SECONDS = 3600.0  # a worker silent this long leaves the set

_queue = ""  # this process's tunnel queue, once it is a worker
_beating = threading.Event()


def worker_queue() -> str:
    return _queue


def alive_key(queue: str) -> str:
    return f"{settings.GATEWAY_REDIS_PREFIX}alive:{queue}"


def workers_key() -> str:
    """A sorted set of worker queues by their last heartbeat: counting the live ones is one ZCOUNT."""
    return f"{settings.GATEWAY_REDIS_PREFIX}workers"


def _beat_once(client) -> None:
    now = time.time()
    with client.pipeline(transaction=False) as pipe:
        pipe.set(alive_key(_queue), "1", ex=ALIVE_TTL_SECONDS)
        pipe.zadd(workers_key(), {_queue: now})
        pipe.zremrangebyscore(workers_key(), "-inf", now - FORGOTTEN_SECONDS)
        pipe.execute()


async def workers_alive() -> int:
    """How many workers beat within the last ALIVE_TTL_SECONDS."""
    return await redis_clients.async_redis().zcount(workers_key(), time.time() - ALIVE_TTL_SECONDS, "+inf")


def workers_alive_sync() -> int:
    """The same count, for sync code (the metrics collector)."""
    with redis_clients.sync_redis() as client:
        return client.zcount(workers_key(), time.time() - ALIVE_TTL_SECONDS, "+inf")


def worker_consume_own_queue(nodename: str, consumer_app) -> None:
    """At worker setup: name this process's tunnel queue and consume it."""
    global _queue
    _queue = f"tunnels.{nodename}.{uuid.uuid4().hex[:8]}"
    consumer_app.amqp.queues.select_add(_queue)


def heartbeat_start() -> None:
    def beat() -> None:
        missed = False
        while not _beating.wait(HEARTBEAT_SECONDS):
            try:
                _beat_once(redis_clients.sync_redis())
            except redis_clients.RedisError as exc:  # Redis is away: beat once it is back, or tunnels read as gone
                if not missed:
                    logger.warning("heartbeat: Redis unavailable (%s); beating again once it is back", exc)
                missed = True
            else:
                if missed:
                    logger.info("heartbeat: Redis is back")
                missed = False

    _beat_once(redis_clients.sync_redis())
    threading.Thread(target=beat, name="tunnel-heartbeat", daemon=True).start()


def heartbeat_stop() -> None:
    _beating.set()
    with redis_clients.sync_redis().pipeline(transaction=False) as pipe:
        pipe.delete(alive_key(_queue))
        pipe.zrem(workers_key(), _queue)
        pipe.execute()
