"""Redis that drops every connection for a moment (a restart, a failover, a proxy that recycles): the gateway
and its worker hold pooled connections that are dead from then on. The first call afterwards is served as
any other, and the worker's heartbeat, which tells callers that its tunnels are alive, beats again."""

import os
import time
from urllib.parse import urlsplit

import pytest
import redis

from registry.worker import HEARTBEAT_SECONDS, workers_key
from tests.clients import call, tool_names
from tests.conftest import needs
from tests.factories import agent, demo_upstream
from tests.helpers import eventually, run
from tests.servers import TcpProxy, start_gateway, start_worker

pytestmark = pytest.mark.e2e


def _connected_times(log) -> int:
    return log.read_text().count("Connected to redis://")


def _last_beat(beats: redis.Redis) -> float:
    return max((at for _, at in beats.zrange(workers_key(), 0, -1, withscores=True)), default=0.0)


def test_the_first_call_after_redis_dropped_every_connection_is_served_and_the_worker_beats_again(
    server_env, world, logs
):
    needs(bool(os.environ.get("REDIS_URL")), "REDIS_URL is not set: no Celery worker")
    shared = urlsplit(os.environ["REDIS_URL"])
    proxy = TcpProxy((shared.hostname or "127.0.0.1", shared.port or 6379))
    own = f"redis://127.0.0.1:{proxy.port}/9"
    beats = redis.Redis.from_url(shared._replace(path="/9").geturl())  # read directly, not through the proxy
    env = server_env | {"GATEWAY_EXECUTOR": "celery", "REDIS_URL": own}
    worker = start_worker(env, logs / "worker-redis-blink.log")
    try:
        with agent("blinked") as (_, key), demo_upstream("blink", timeout=2.0):
            gateway = start_gateway(env, logs / "gateway-redis-blink.log")
            try:
                eventually(lambda: "blink__echo" in run(lambda: tool_names(gateway.url, key)))
                before = run(lambda: call(gateway.url, key, "blink__echo", {"text": "before"}))
                assert before.content[0].text == "before"
                connected = _connected_times(worker.log)

                proxy.cut()  # every connection through it dropped, new ones refused
                eventually(lambda: time.time() - _last_beat(beats) > 2 * HEARTBEAT_SECONDS)  # a beat was missed
                proxy.restore()
                restored = time.time()
                # Celery's consumer reconnects on its own schedule; the pools under test are the gateway's.
                eventually(lambda: _connected_times(worker.log) > connected, timeout=20)

                after = run(lambda: call(gateway.url, key, "blink__echo", {"text": "after"}))
                assert not isinstance(after, Exception), after
                assert (after.is_error, after.content[0].text) == (False, "after")
                eventually(lambda: _last_beat(beats) > restored)
                log = worker.log.read_text()
                assert "heartbeat: Redis unavailable" in log and "heartbeat: Redis is back" in log
            finally:
                gateway.stop()
    finally:
        worker.stop()
        proxy.close()
        beats.flushdb()
