"""Celery tasks of the handoff app: the idle-tunnel sweep that beat schedules (GATEWAY_HANDOFF_SWEEP_SECONDS),
code mode's executions (queue `sandbox`), and a stopping worker's tunnels closed."""

import asyncio
from typing import Any

from asgiref.sync import async_to_sync
from celery import shared_task
from django.conf import settings

from gateway_project.lib.database import database_async
from handoff.codemode.optional import execution_run
from handoff.mcp.list_changed import tools_changed_everywhere
from handoff.protocol.tunnels import index_session, tunnels_close_held, tunnels_sweep_idle
from registry.call_consumer import CANCELLED_OUTCOME
from registry.executor import reply_after
from registry.tasks import Checked
from registry.upstreams.loop import pool_thread
from registry.upstreams.relay import cancellable


async def sweep_and_tell(*, in_process: bool) -> int:
    """Sweep idle tunnels (this process's, or the workers') and tell their agents that their tools changed."""
    swept = await database_async(tunnels_sweep_idle)(in_process=in_process)
    await tools_changed_everywhere([index_session(t.agent_id, t.session_key) for t in swept])
    return len(swept)


@shared_task(name="handoff.sweep_idle_tunnels", ignore_result=True)
def sweep_idle_tunnels() -> int:
    return asyncio.run(sweep_and_tell(in_process=False))


@shared_task(
    name="handoff.run_code",
    base=Checked,  # an execution names its caller: a writer to Redis must not run code as someone else
    ignore_result=True,
    acks_late=False,
    time_limit=settings.GATEWAY_SANDBOX_TIMEOUT + 30,
)
def run_code_task(*, execution: dict[str, Any], reply_to: str, call: str = "") -> None:
    """One execution, on this worker's event loop (where its async clients live); the sandbox bounds it, and
    the web process that waits may cancel it (which ends Deno and cancels the calls in flight)."""
    running = cancellable(lambda: execution_run(execution), call, CANCELLED_OUTCOME)
    pool_thread().submit(reply_after(reply_to, running)).result()


def tunnels_close_on_shutdown() -> None:
    """A worker stopping gracefully closes the tunnels it holds and tells their agents."""
    closed = tunnels_close_held("worker shutdown")
    async_to_sync(tools_changed_everywhere)([index_session(t.agent_id, t.session_key) for t in closed])
