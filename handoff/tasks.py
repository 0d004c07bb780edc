"""Celery tasks of the handoff app: the idle-tunnel sweep that beat schedules (GATEWAY_HANDOFF_SWEEP_SECONDS)."""

import asyncio

from celery import shared_task

from handoff.db import database_async
from handoff.notify import tools_changed_everywhere
from handoff.tunnels import index_session, tunnels_sweep_idle


async def sweep_and_tell(*, in_process: bool) -> int:
    """Sweep idle tunnels (this process's, or the workers') and tell their agents that their tools changed."""
    swept = await database_async(tunnels_sweep_idle)(in_process=in_process)
    await tools_changed_everywhere([index_session(t.agent_id, t.session_key) for t in swept])
    return len(swept)


@shared_task(name="handoff.sweep_idle_tunnels", ignore_result=True)
def sweep_idle_tunnels() -> int:
    return asyncio.run(sweep_and_tell(in_process=False))
