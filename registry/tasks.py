"""Celery tasks: thin wrappers that run one request on this worker's pool (queue `upstream`, or for a tunnel
the queue of the worker holding it). Each runs only from a message whose MAC verifies (Checked)."""

import asyncio
import logging
from typing import Any

from celery import Task, shared_task
from django.conf import settings

from gateway_project.lib import task_mac
from gateway_project.lib.database import database_async
from gateway_project.lib.process_task import ProcessTask
from registry.call_consumer import refused_outcome, request_run
from registry.executor import held_by, is_reply_key, reply_after, reply_now
from registry.services import upstream_health_probe
from registry.sign_off_notify import sign_off_notify_attempt, sign_off_notify_publish
from registry.upstreams.loop import held_tunnel_close, pool_thread
from registry.upstreams.outcome import Outcome
from registry.upstreams.requests import UpstreamRequest
from registry.upstreams.upstream_oauth import oauth_begin, oauth_finish
from registry.worker import worker_queue

logger = logging.getLogger(__name__)

# Past every call's own deadline; the pool enforces the real one.
HARD_LIMIT = settings.GATEWAY_MAX_TIMEOUT + settings.GATEWAY_CONNECT_TIMEOUT + 30


class Checked(Task):
    """A task that runs only from a message whose MAC verifies, seen for the first time: anyone who can
    write to Redis could otherwise run a call as someone else. A refused one does nothing but log why and,
    if it names a reply list, say so there, so that its caller need not wait for its timeout."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.request.called_directly:  # in this process, not off the broker
            return super().__call__(*args, **kwargs)
        try:
            if args:  # the tasks take keyword arguments only: the MAC covers those
                raise task_mac.Refused(task_mac.MALFORMED)
            task_mac.task_check(self.name, kwargs, self.request.get(task_mac.HEADER))
        except task_mac.Refused as refused:
            self._refuse(refused.reason, kwargs.get("reply_to"))
            return None
        return self.run(**kwargs)  # as Celery's tracer would: its request (id, headers) stays current

    def _refuse(self, reason: str, reply_to: Any) -> None:
        logger.warning("task %s[%s] refused: %s", self.name, self.request.id, reason)
        if is_reply_key(reply_to):
            reply_now(reply_to, refused_outcome(self.name, reason))


@shared_task(name="registry.request", base=Checked, ignore_result=True, acks_late=False, time_limit=HARD_LIMIT)
def request_task(
    *,
    request: dict[str, Any],
    reply_to: str,
    call: str = "",
    relay: dict[str, str] | None = None,
    capabilities: list[str] = (),
) -> None:
    """An agent's tool call or forwarded request (an UpstreamRequest's fields)."""
    runner = pool_thread()
    running = request_run(
        runner.pool,
        request=UpstreamRequest(**request),
        reply_to=reply_to,
        call=call,
        relay=relay,
        capabilities=capabilities,
    )
    runner.submit(running).result()


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


@shared_task(name="registry.list_tools", base=Checked, ignore_result=True, time_limit=HARD_LIMIT)
def list_tools_task(*, upstream_id: int, revision: int, reply_to: str) -> None:
    runner = pool_thread()
    runner.submit(reply_after(reply_to, runner.pool.list_tools(upstream_id, revision))).result()


@shared_task(name="registry.tunnel_open", base=Checked, ignore_result=True, time_limit=HARD_LIMIT)
def tunnel_open_task(
    *, tunnel_id: str, upstream_id: int, grant: dict[str, Any], connect_timeout: float, reply_to: str
) -> None:
    runner = pool_thread()

    async def opened() -> Outcome:
        outcome = await runner.pool.tunnel_open(tunnel_id, upstream_id, grant, connect_timeout)
        return held_by(outcome, worker_queue())

    runner.submit(reply_after(reply_to, opened())).result()


@shared_task(name="registry.tunnel_call", base=Checked, ignore_result=True, time_limit=HARD_LIMIT)
def tunnel_call_task(*, tunnel_id: str, tool: str, arguments: dict[str, Any], reply_to: str) -> None:
    runner = pool_thread()
    runner.submit(reply_after(reply_to, runner.pool.tunnel_call(tunnel_id, tool, arguments))).result()


@shared_task(name="registry.tunnel_close", base=Checked, ignore_result=True)
def tunnel_close_task(*, tunnel_id: str) -> None:
    held_tunnel_close(tunnel_id)


@shared_task(name="registry.oauth_begin", base=Checked, ignore_result=True, time_limit=HARD_LIMIT)
def oauth_begin_task(*, upstream_id: int, redirect_uri: str, reply_to: str) -> None:
    """A person's sign-in at an upstream begins: where to send them, and the sealed material (upstream_oauth.py)."""
    pool_thread().submit(reply_after(reply_to, oauth_begin(upstream_id, redirect_uri))).result()


@shared_task(name="registry.oauth_finish", base=Checked, ignore_result=True, time_limit=HARD_LIMIT)
def oauth_finish_task(
    *,
    upstream_id: int,
    material: dict[str, Any],
    sealed_code: str,
    redirect_uri: str,
    person_issuer: str,
    person_subject: str,
    person_name: str,
    reply_to: str,
) -> None:
    """The code, sealed, exchanged here and the person's credential stored; the reply names no token."""
    finishing = oauth_finish(
        upstream_id, material, sealed_code, redirect_uri, person_issuer, person_subject, person_name
    )
    pool_thread().submit(reply_after(reply_to, finishing)).result()


@shared_task(
    name="registry.notify_sign_off",
    base=Checked,
    ignore_result=True,
    time_limit=settings.GATEWAY_SIGN_OFF_WEBHOOK_TIMEOUT + 30,
)
def notify_sign_off_task(*, sign_off_id: str, attempt: int = 0) -> None:
    """One attempt to tell approvers of a new sign-off request (registry/sign_off_notify.py); the next, if one is
    due, is a task of its own after its countdown, so no worker thread waits out the backoff."""
    attempting = sign_off_notify_attempt(sign_off_id=sign_off_id, attempt=attempt)
    delay = pool_thread().submit(attempting).result()
    if delay is not None:
        sign_off_notify_publish(sign_off_id=sign_off_id, attempt=attempt + 1, countdown=delay)
