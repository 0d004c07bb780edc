"""Celery tasks: thin wrappers that run one request on this worker's pool (queue `upstream`, or for a tunnel
the queue of the worker holding it)."""

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from celery import shared_task
from django.conf import settings

from gateway_project.lib.database import database_async
from gateway_project.lib.process_task import ProcessTask
from registry.executor import held_by, reply_after
from registry.services import upstream_health_probe
from registry.upstreams.loop import held_tunnel_close, pool_thread
from registry.upstreams.pool import Outcome, failure
from registry.upstreams.relay import ChannelRelay, Relay, cancellable
from registry.upstreams.requests import UpstreamRequest
from registry.worker import worker_queue

logger = logging.getLogger(__name__)

CANCELLED_OUTCOME = failure("CANCELLED", "The call was cancelled.", "cancelled by the caller")
# Past every call's own deadline; the pool enforces the real one.
HARD_LIMIT = settings.GATEWAY_MAX_TIMEOUT + settings.GATEWAY_CONNECT_TIMEOUT + 30


def _run_call(
    work: Callable[[Relay | None], Awaitable[Outcome]],
    reply_to: str,
    call: str,
    relay: dict[str, str] | None,
    capabilities: Iterable[str],
) -> None:
    """Run an agent's call on this worker's pool and reply; the web process that waits may cancel it, and
    with `relay` (the call's channels) what the upstream sends meanwhile goes to that process."""
    here = ChannelRelay(relay, list(capabilities)) if relay else None

    async def running() -> Outcome:
        outcome = await cancellable(lambda: work(here), call, CANCELLED_OUTCOME)
        if here is not None:
            await here.end()
        return outcome

    pool_thread().submit(reply_after(reply_to, running())).result()


@shared_task(name="registry.request", ignore_result=True, acks_late=False, time_limit=HARD_LIMIT)
def request_task(
    *,
    request: dict[str, Any],
    reply_to: str,
    call: str = "",
    relay: dict[str, str] | None = None,
    capabilities: list[str] = (),
) -> None:
    """An agent's tool call or forwarded request (an UpstreamRequest's fields)."""
    pool, upstream_request = pool_thread().pool, UpstreamRequest(**request)
    _run_call(lambda here: pool.request(upstream_request, here), reply_to, call, relay, capabilities)


@shared_task(name="registry.probe_upstreams", ignore_result=True, time_limit=HARD_LIMIT)
def probe_upstreams_task() -> int:
    return upstream_health_probe()


async def _probe(ready: asyncio.Future) -> None:
    ready.set_result(None)
    while True:
        await asyncio.sleep(settings.GATEWAY_HEALTH_PROBE_SECONDS)
        try:
            await database_async(upstream_health_probe)()
        except Exception:  # a database hiccup: the next round probes again
            logger.exception("upstream health probe failed")


# The embedded default has no beat: its web process probes on a timer of its own (handoff/web_process.py).
embedded_health_prober = ProcessTask(_probe)


@shared_task(name="registry.list_tools", ignore_result=True, time_limit=HARD_LIMIT)
def list_tools_task(*, upstream_id: int, revision: int, reply_to: str) -> None:
    runner = pool_thread()
    runner.submit(reply_after(reply_to, runner.pool.list_tools(upstream_id, revision))).result()


@shared_task(name="registry.tunnel_open", ignore_result=True, time_limit=HARD_LIMIT)
def tunnel_open_task(
    *, tunnel_id: str, upstream_id: int, grant: dict[str, Any], connect_timeout: float, reply_to: str
) -> None:
    runner = pool_thread()

    async def opened() -> Outcome:
        outcome = await runner.pool.tunnel_open(tunnel_id, upstream_id, grant, connect_timeout)
        return held_by(outcome, worker_queue())

    runner.submit(reply_after(reply_to, opened())).result()


@shared_task(name="registry.tunnel_call", ignore_result=True, time_limit=HARD_LIMIT)
def tunnel_call_task(*, tunnel_id: str, tool: str, arguments: dict[str, Any], reply_to: str) -> None:
    runner = pool_thread()
    runner.submit(reply_after(reply_to, runner.pool.tunnel_call(tunnel_id, tool, arguments))).result()


@shared_task(name="registry.tunnel_close", ignore_result=True)
def tunnel_close_task(*, tunnel_id: str) -> None:
    held_tunnel_close(tunnel_id)
