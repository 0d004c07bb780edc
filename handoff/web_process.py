"""What every web process runs beside requests: the change relay (list_changed.py), and in the embedded default,
which has no Celery beat, the upstream pool on the serving loop (registry/upstreams/loop.py), the idle-tunnel
sweep (tasks.py), the audit trail's upkeep (audit/tasks.py), the sign-off sweep (policy/tasks.py) and the
upstreams' health probe (registry/tasks.py) on timers of their own. The pool ends with the loop: the server's
shutdown (after the drain, probes.py) cancels its task, which closes its sessions and so its stdio servers."""

import asyncio
import atexit
import logging

from django.conf import settings

from audit.tasks import embedded_audit_keeper
from gateway_project.lib.process_task import ProcessTask
from handoff.loop_lag import loop_lag_watch
from handoff.mcp.list_changed import change_relay
from handoff.protocol.tunnels import tunnels_close_held
from handoff.tasks import sweep_and_tell
from policy.tasks import embedded_sign_off_keeper
from registry.tasks import embedded_health_prober
from registry.upstreams.loop import pool_on_this_loop

logger = logging.getLogger(__name__)


async def _sweep_here(ready: asyncio.Future) -> None:
    # This process holds its tunnels: when it stops, their rows close with it (its agents' sessions end too).
    atexit.register(tunnels_close_held, "gateway shutdown")
    ready.set_result(None)
    while True:
        await asyncio.sleep(settings.GATEWAY_HANDOFF_SWEEP_SECONDS)
        try:
            await sweep_and_tell(in_process=True)
        except Exception:  # a database hiccup: the next round sweeps what this one could not
            logger.exception("idle tunnel sweep failed")


embedded_sweeper = ProcessTask(_sweep_here)


def background_start() -> None:
    """Requests do not wait for these: a change relay that cannot reach Redis must not fail a request
    that does not need it (the handoff moves, which do, wait for it: handoff/mcp/list_changed.py)."""
    change_relay.start()
    if settings.GATEWAY_MAX_LOOP_LAG_MS > 0:
        loop_lag_watch.start()
    if settings.GATEWAY_EXECUTOR == "inline":
        pool_on_this_loop()
        embedded_sweeper.start()
        embedded_audit_keeper.start()
        embedded_sign_off_keeper.start()
        embedded_health_prober.start()
