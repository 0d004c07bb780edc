"""Redis that drops every connection for a moment (a restart, a failover, a proxy that recycles): the gateway
and its worker hold pooled connections that are dead from then on. The first call afterwards is served as
any other, and the worker's heartbeat, which tells callers that its tunnels are alive, beats again."""

import os
import time
from urllib.parse import urlsplit

import httpx2
import pytest
import redis

from registry.worker import HEARTBEAT_SECONDS, workers_key
from tests.clients import call, raw_session, reply_of, tool_names
from tests.conftest import needs
from tests.factories import agent, demo_upstream
from tests.helpers import audit_mark, audit_since, eventually, run
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


def test_a_call_in_a_session_its_process_holds_is_refused_retry_later_and_recorded_while_redis_is_unreachable(
    server_env, world, logs
):
    """Such a call's session is read by its admission (handoff/mcp/unverified.py): with Redis unreachable neither can
    be made, so it is refused -32003 with a retry hint and a denied row, and the next call after Redis is back runs."""
    needs(bool(os.environ.get("REDIS_URL")), "REDIS_URL is not set: sessions live in one process without it")
    shared = urlsplit(os.environ["REDIS_URL"])
    proxy = TcpProxy((shared.hostname or "127.0.0.1", shared.port or 6379))
    env = server_env | {"GATEWAY_EXECUTOR": "inline", "REDIS_URL": f"redis://127.0.0.1:{proxy.port}/9"}
    echo = {"name": "unreached__echo", "arguments": {"text": "x"}}
    body = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": echo}
    try:
        with agent("unreached") as (_, key), demo_upstream("unreached"):
            gateway = start_gateway(env, logs / "gateway-redis-unreachable.log")
            try:
                eventually(lambda: "unreached__echo" in run(lambda: tool_names(gateway.url, key)))
                session = raw_session(gateway.url, key)
                assert reply_of(httpx2.post(f"{gateway.url}/mcp", json=body, headers=session, timeout=30))["result"]
                mark = audit_mark()
                proxy.cut()
                refused = httpx2.post(f"{gateway.url}/mcp", json=body, headers=session, timeout=30)
                proxy.restore()
                again = reply_of(httpx2.post(f"{gateway.url}/mcp", json=body, headers=session, timeout=30))
            finally:
                gateway.stop()
    finally:
        proxy.close()
        redis.Redis.from_url(shared._replace(path="/9").geturl()).flushdb()
    assert refused.status_code == 200
    error = reply_of(refused)["error"]
    data = error["data"]
    assert (error["code"], data["code"], data["retryAfter"]) == (-32003, "SESSION_STATE_UNAVAILABLE", 1)
    assert error["message"] == (
        "The gateway cannot read this session's state right now, so 'unreached__echo' was not run. "
        "Retry after 1 second."
    )
    assert again["result"]["content"][0]["text"] == "x"
    rows = [(r.kind, r.error_code) for r in audit_since(mark) if r.session_id == session["mcp-session-id"]]
    assert rows == [("denied", "SESSION_STATE_UNAVAILABLE"), ("approved", ""), ("completed", "")]
