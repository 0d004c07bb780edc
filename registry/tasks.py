"""Celery tasks on queue `upstream`: thin wrappers that run one request on this worker's pool."""

from typing import Any

from celery import shared_task
from django.conf import settings

from registry.executor import reply_after
from registry.loop import pool_thread

# Past every call's own deadline; the pool enforces the real one.
HARD_LIMIT = settings.GATEWAY_MAX_TIMEOUT + settings.GATEWAY_CONNECT_TIMEOUT + 30


@shared_task(name="registry.call_tool", ignore_result=True, acks_late=False, time_limit=HARD_LIMIT)
def call_tool_task(*, upstream_id: int, revision: int, tool: str, arguments: dict[str, Any], reply_to: str) -> None:
    runner = pool_thread()
    runner.submit(reply_after(reply_to, runner.pool.call_tool(upstream_id, revision, tool, arguments))).result()


@shared_task(name="registry.list_tools", ignore_result=True, time_limit=HARD_LIMIT)
def list_tools_task(*, upstream_id: int, revision: int, reply_to: str) -> None:
    runner = pool_thread()
    runner.submit(reply_after(reply_to, runner.pool.list_tools(upstream_id, revision))).result()
