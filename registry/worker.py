"""A worker process's identity for handoff tunnels. Each worker consumes a queue of its own besides
`upstream`, so a tunnel's calls reach the process that holds it, and keeps a heartbeat key alive in Redis
so that callers learn within seconds, not at their timeout, that it died. Workers run `-P threads`: one
process, one pool, one queue."""

import threading
import uuid

from django.conf import settings

HEARTBEAT_SECONDS = 1.0
ALIVE_TTL_SECONDS = 3

_queue = ""  # this process's tunnel queue, once it is a worker
_beating = threading.Event()


def worker_queue() -> str:
    return _queue


def alive_key(queue: str) -> str:
    return f"{settings.GATEWAY_REDIS_PREFIX}alive:{queue}"


def worker_consume_own_queue(nodename: str, consumer_app) -> None:
    """At worker setup: name this process's tunnel queue and consume it."""
    global _queue
    _queue = f"tunnels.{nodename}.{uuid.uuid4().hex[:8]}"
    consumer_app.amqp.queues.select_add(_queue)


def heartbeat_start() -> None:
    from registry.executor import sync_redis

    def beat() -> None:
        while not _beating.wait(HEARTBEAT_SECONDS):
            sync_redis().set(alive_key(_queue), "1", ex=ALIVE_TTL_SECONDS)

    sync_redis().set(alive_key(_queue), "1", ex=ALIVE_TTL_SECONDS)
    threading.Thread(target=beat, name="tunnel-heartbeat", daemon=True).start()


def heartbeat_stop() -> None:
    from registry.executor import sync_redis

    _beating.set()
    sync_redis().delete(alive_key(_queue))
