"""Agents' calls through a Celery gateway whose calls go straight to the workers' call consumers
(GATEWAY_CALL_TRANSPORT=direct, registry/call_consumer.py) keep the task's promises: an approval row before the
upstream runs and a completion after; progress and cancellation travel as before; a worker killed mid-call, or a
Redis that goes away mid-call, ends the call at its deadline with EXECUTOR_UNAVAILABLE, and the consumer takes
calls again once Redis is back; a worker stopped warmly (SIGTERM) finishes the calls it took before it exits."""

import os
import re
import signal
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import anyio
import pytest
from django.test import override_settings
from mcp.types import CallToolResult

from audit.models import AuditEvent
from registry.executor import CeleryExecutor
from registry.upstreams.requests import UpstreamRequest
from tests import servers
from tests.clients import call, sdk_client, tool_names
from tests.conftest import needs
from tests.factories import agent, demo_upstream
from tests.helpers import audit_mark, audit_since, eventually, run, until
from tests.servers import CANCELLED_DIR, TcpProxy, demo_started

pytestmark = pytest.mark.e2e

LOST = (
    "No answer from the gateway's workers in time: the call may or may not have run. "
    "Check its effect before repeating it."
)


def _gateway_of(transport: str, traced_env: dict[str, str], logs) -> Iterator[servers.Running]:
    env = servers.web_env(traced_env, "celery") | {"GATEWAY_CALL_TRANSPORT": transport}
    running = servers.start_gateway(env, logs / f"gateway-{transport}.log")
    yield running
    running.stop()


@pytest.fixture(scope="module")
def direct_gateway(traced_env, world, celery_worker, logs) -> Iterator[servers.Running]:
    yield from _gateway_of("direct", traced_env, logs)


@pytest.fixture(scope="module")
def task_gateway(traced_env, world, celery_worker, logs) -> Iterator[servers.Running]:
    yield from _gateway_of("task", traced_env, logs)


def _calls_by_task(worker: servers.Running) -> int:
    return len(re.findall(r"Task registry\.request\[\S+\] succeeded", worker.log.read_text()))


@pytest.mark.parametrize(("transport", "tasks"), [("direct", 0), ("task", 1)])
def test_a_call_is_approved_run_and_completed_by_the_call_consumer_or_the_task(
    request, transport, tasks, world, celery_worker
):
    gateway, mark, by_task = (
        request.getfixturevalue(f"{transport}_gateway"),
        audit_mark(),
        _calls_by_task(celery_worker),
    )
    result = run(lambda: call(gateway.url, world.key, "demo__echo", {"text": transport}))
    assert isinstance(result, CallToolResult) and (result.is_error, result.content[0].text) == (False, transport)
    rows = [(r.kind, r.outcome) for r in audit_since(mark) if r.exposed_name == "demo__echo"]
    assert rows == [(AuditEvent.Kind.APPROVED, ""), (AuditEvent.Kind.COMPLETED, "ok")]
    assert eventually(lambda: _calls_by_task(celery_worker) == by_task + tasks)  # a task carried it, or none


def test_progress_reaches_the_agent_through_the_call_consumer(direct_gateway, world):
    seen: list[float] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append(progress)

    async def scenario():
        async with sdk_client(direct_gateway.url, world.key, "legacy") as client:
            return await client.call_tool("demo__progress", {"seconds": 0.5}, progress_callback=on_progress)

    assert run(scenario).content[0].text == "done"
    assert seen == [0, 1, 2, 3, 4]


def test_cancelling_a_call_cancels_it_at_the_upstream_through_the_call_consumer(direct_gateway, world):
    mark, started = f"cancel-{uuid.uuid4().hex[:12]}", audit_mark()

    async def scenario():
        async with sdk_client(direct_gateway.url, world.key, "legacy", timeout=30) as client:
            async with anyio.create_task_group() as tg:
                tg.start_soon(client.call_tool, "demo__sleep", {"seconds": 20, "mark": mark})
                await until(lambda: demo_started(mark), timeout=10)
                tg.cancel_scope.cancel()

    run(scenario)
    assert eventually(lambda: os.path.exists(os.path.join(CANCELLED_DIR, mark)), timeout=10)
    rows = eventually(
        lambda: [(r.kind, r.error_code) for r in audit_since(started) if r.exposed_name == "demo__sleep"][1:]
    )
    assert rows == [(AuditEvent.Kind.COMPLETED, "CANCELLED")]


def _own_prefix() -> str:
    """A worker's calls, replies and nonces under a prefix of their own: one killed or cut off harms no
    other test's calls (the Redis database stays the one the tests were given)."""
    return f"sb-{uuid.uuid4().hex[:8]}:"


def _sleep_signalled(
    server_env, logs, slug: str, signum: int, *, upstream: dict[str, Any], **web: str
) -> tuple[CallToolResult, int, int]:
    """A 2 s call of upstream `slug` (its `upstream` fields) through a gateway and a worker of their own; once the
    upstream runs it, the worker is sent `signum`. The call's result, the audit mark before it, and the worker's
    exit status."""
    needs(bool(os.environ.get("REDIS_URL")), "REDIS_URL is not set: no Celery worker")
    env = server_env | {"GATEWAY_REDIS_PREFIX": _own_prefix()}
    worker = servers.start_worker(env | {"GATEWAY_EXECUTOR": "celery"}, logs / f"worker-direct-{slug}.log")
    web_env = servers.web_env(env, "celery") | {"GATEWAY_CALL_TRANSPORT": "direct", **web}
    gateway = servers.start_gateway(web_env, logs / f"gateway-direct-{slug}.log")
    mark = f"{slug}-{uuid.uuid4().hex[:12]}"
    try:
        with agent(f"{slug}-caller") as (_, key), demo_upstream(slug, **upstream):
            eventually(lambda: f"{slug}__sleep" in run(lambda: tool_names(gateway.url, key)), timeout=10)
            # The upstream started first (a sandboxed start on a loaded machine may outlast the connect timeout).
            eventually(lambda: _answered(run(lambda: call(gateway.url, key, f"{slug}__echo", {"text": "up"}))), 30)
            started = audit_mark()

            async def scenario():
                async with (
                    sdk_client(gateway.url, key, "legacy", timeout=30) as client,
                    anyio.create_task_group() as tg,
                ):
                    tg.start_soon(lambda: _signal_once_started(worker, mark, signum))
                    return await client.call_tool(f"{slug}__sleep", {"seconds": 2, "mark": mark})

            result = run(scenario)
            exited = worker.process.wait(timeout=30)
    finally:
        gateway.stop()
        worker.stop()
    return result, started, exited


def test_a_worker_killed_mid_call_ends_the_call_at_its_deadline_with_executor_unavailable(server_env, world, logs):
    # The deadline the gateway waits for is its own: the worker connects with the default 20 s.
    lost, started, _ = _sleep_signalled(
        server_env, logs, "killed", signal.SIGKILL, upstream={"timeout": 3.0}, GATEWAY_CONNECT_TIMEOUT="5"
    )
    assert (lost.is_error, lost.content[0].text) == (True, f"killed__sleep: {LOST}")
    row = next(r for r in audit_since(started) if r.kind == AuditEvent.Kind.COMPLETED)
    # The upstream's 3 s, connecting's 5 s, the executor's 5 s of grace.
    assert (row.outcome, row.error_code, row.error_detail) == (
        "error",
        "EXECUTOR_UNAVAILABLE",
        "no reply from an executor within 13s",
    )


def _answered(result: object) -> bool:
    return isinstance(result, CallToolResult) and not result.is_error


async def _signal_once_started(worker: servers.Running, mark: str, signum: int) -> None:
    await until(lambda: demo_started(mark), timeout=10)
    os.killpg(worker.process.pid, signum)


def test_redis_gone_mid_call_ends_it_at_its_deadline_and_the_consumer_takes_calls_once_redis_is_back(
    server_env, world, logs
):
    """The worker reaches Redis through a proxy that is cut while a call runs: its reply cannot be sent, so
    the caller's wait ends at the deadline; once Redis is back, the consumer takes the next call."""
    needs(bool(os.environ.get("REDIS_URL")), "REDIS_URL is not set: no Celery worker")
    shared = urlsplit(os.environ["REDIS_URL"])
    proxy = TcpProxy((shared.hostname or "127.0.0.1", shared.port or 6379))
    prefix = _own_prefix()
    through = shared._replace(netloc=f"127.0.0.1:{proxy.port}").geturl()
    env = server_env | {"GATEWAY_EXECUTOR": "celery", "GATEWAY_REDIS_PREFIX": prefix, "REDIS_URL": through}
    worker = servers.start_worker(env, logs / "worker-direct-blink.log")
    mark = f"blink-{uuid.uuid4().hex[:12]}"
    try:
        with (
            demo_upstream("blinking", timeout=3.0) as upstream,
            override_settings(GATEWAY_REDIS_PREFIX=prefix, GATEWAY_CALL_TRANSPORT="direct", GATEWAY_CONNECT_TIMEOUT=1),
        ):
            sleeping = UpstreamRequest.tool_call(
                upstream.id, upstream.revision, "sleep", {"seconds": 1, "mark": mark}, timeout=3.0
            )
            echo = UpstreamRequest.tool_call(upstream.id, upstream.revision, "echo", {"text": "back"}, timeout=3.0)

            eventually(lambda: run(lambda: CeleryExecutor().request(echo))["ok"], timeout=30)  # the upstream started

            async def cut_once_started() -> None:
                await until(lambda: demo_started(mark), timeout=10)
                proxy.cut()

            async def scenario():
                async with anyio.create_task_group() as tg:
                    tg.start_soon(cut_once_started)
                    return await CeleryExecutor().request(sleeping)

            lost = run(scenario)
            assert (lost["ok"], lost["code"], lost["detail"]) == (
                False,
                "EXECUTOR_UNAVAILABLE",
                "no reply from an executor within 9s",
            )
            eventually(lambda: "call consumer: Redis unavailable" in worker.log.read_text())
            proxy.restore()
            back = run(lambda: CeleryExecutor().request(echo))
            assert back["ok"] and back["result"]["content"][0]["text"] == "back", back
        log = worker.log.read_text()
        assert "call consumer: a call ended without its reply" in log and "call consumer: Redis is back" in log
    finally:
        worker.stop()
        proxy.close()


def test_a_worker_stopped_warmly_mid_call_finishes_the_call_it_took_then_exits(server_env, world, logs):
    finished, started, exited = _sleep_signalled(server_env, logs, "stopping", signal.SIGTERM, upstream={})
    assert exited == 0  # Celery's warm shutdown waited for the consumer's call, then the worker ended of itself
    assert (finished.is_error, finished.content[0].text) == (False, "slept")
    rows = [(r.kind, r.outcome) for r in audit_since(started) if r.exposed_name == "stopping__sleep"]
    assert rows == [(AuditEvent.Kind.APPROVED, ""), (AuditEvent.Kind.COMPLETED, "ok")]
