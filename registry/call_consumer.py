"""A worker's own consumer of agents' calls (GATEWAY_CALL_TRANSPORT=direct), started by a Celery bootstep, so
that Celery still runs the worker, beat and every other task.

A web process pushes a call's keyword arguments and their seal onto the broker's list (registry/publish.py
call_push); here, on the upstream pool's own loop, a free slot takes one off (BRPOP), checks its seal as the
`registry.request` task's is checked (the MAC, the expiry, the nonce seen once), runs it on the pool and
replies as the task does. Neither Celery's consumer nor a thread of its pool stands between the list and the
pool. A worker holds at most its concurrency's worth of calls: one with no free slot leaves them to the
others. One killed mid-call loses the calls it took, as the task's `acks_late=False` does: their callers get
EXECUTOR_UNAVAILABLE at the deadline, and the audit sweep writes OUTCOME_UNKNOWN where no completion came.
"""

import concurrent.futures
import json
import logging
import time
from typing import Any

import anyio
from anyio.abc import TaskGroup
from celery import bootsteps
from django.conf import settings

from audit.outcomes import call_deadline
from gateway_project.lib import redis_clients, task_mac
from registry.executor import is_reply_key, reply_after, reply_send
from registry.publish import CALL_TASK, calls_key
from registry.upstreams.loop import pool_thread
from registry.upstreams.outcome import Outcome, failure
from registry.upstreams.pool import UpstreamPool
from registry.upstreams.relay import ChannelRelay, cancellable
from registry.upstreams.requests import UpstreamRequest

logger = logging.getLogger(__name__)

CANCELLED_OUTCOME = failure("CANCELLED", "The call was cancelled.", "cancelled by the caller")
TASK_REFUSED = "TASK_REFUSED"
MALFORMED_ENVELOPE = "its envelope is malformed"
CALLS_QUEUE = "upstream"  # the workers that consume the task's queue take pushed calls too
POP_SECONDS = 5  # a pop's wait: a Redis that stopped answering without closing is noticed this soon
RETRY_SECONDS = 1.0  # between pops while Redis is away


def refused_outcome(task: str, reason: str) -> Outcome:
    """What the caller of a refused task or call is told: it did not run, and why (never its arguments)."""
    message = "The gateway's worker refused the call as not authentic: it did not run."
    return failure(TASK_REFUSED, message, f"task {task} refused: {reason}")


async def request_run(
    pool: UpstreamPool,
    *,
    request: UpstreamRequest,
    reply_to: str,
    call: str = "",
    relay: dict[str, str] | None = None,
    capabilities: list[str] = (),
) -> None:
    """An agent's call on this worker's pool, replied to `reply_to`; the web process that waits may cancel it,
    and with `relay` (the call's channels) what the upstream sends meanwhile goes to that process."""
    here = ChannelRelay(relay, list(capabilities)) if relay else None

    async def running() -> Outcome:
        outcome = await cancellable(lambda: pool.request(request, here), call, CANCELLED_OUTCOME)
        if here is not None:
            await here.end()
        return outcome

    await reply_after(reply_to, running())


def _opened(raw: bytes) -> tuple[dict[str, Any], Any]:
    """A pushed call's keyword arguments and seal; ValueError if it is no envelope of ours."""
    envelope = json.loads(raw)
    if not (isinstance(envelope, dict) and isinstance(envelope.get("kwargs"), dict) and "seal" in envelope):
        raise ValueError(MALFORMED_ENVELOPE)
    return envelope["kwargs"], envelope["seal"]


async def _refuse(reason: str, reply_to: Any) -> None:
    logger.warning("call %s refused: %s", CALL_TASK, reason)
    if is_reply_key(reply_to):  # a forged call's reply_to may name any key: only a reply list is told
        await reply_send(reply_to, refused_outcome(CALL_TASK, reason))


async def call_take(pool: UpstreamPool, raw: bytes) -> None:
    """One envelope off the list: refused, dropped as expired, or run and replied to."""
    try:
        kwargs, seal = _opened(raw)
    except ValueError:  # JSON's errors are ValueErrors too
        logger.warning("call %s refused: %s", CALL_TASK, MALFORMED_ENVELOPE)
        return
    try:
        await task_mac.task_check_async(CALL_TASK, kwargs, seal)
    except task_mac.Refused as refused:
        await _refuse(refused.reason, kwargs.get("reply_to"))
        return
    if seal["exp"] < time.time():  # as Celery drops a task past its `expires`: too late to answer in time
        logger.warning("call %s dropped: no worker took it before it expired", CALL_TASK)
        return
    try:
        fields = kwargs | {"request": UpstreamRequest(**kwargs["request"])}
        work = request_run(pool, **fields)
    except (KeyError, TypeError):  # sealed, so one of ours: a web process of another version
        await _refuse(MALFORMED_ENVELOPE, kwargs.get("reply_to"))
        return
    await work


class CallConsumer:
    """Takes calls off the list while it has a free slot, each on a task of its own on the pool's loop."""

    def __init__(self, pool: UpstreamPool, slots: int) -> None:
        self._pool, self._slot_count = pool, slots
        self._stopped, self._taking = False, None

    async def serve(self) -> None:
        """Until `stop`; then the calls already taken run to their end."""
        self._slots = anyio.Semaphore(self._slot_count)  # anyio's primitives are made on the loop they serve
        async with anyio.create_task_group() as calls:
            with anyio.CancelScope() as self._taking:
                if not self._stopped:
                    await self._take(calls)

    def stop(self) -> None:
        """From the pool's loop: take no more calls."""
        self._stopped = True
        if self._taking is not None:
            self._taking.cancel()

    async def _take(self, calls: TaskGroup) -> None:
        broker, away = redis_clients.async_redis(settings.CELERY_BROKER_URL), False
        while True:
            await self._slots.acquire()
            try:
                popped = await broker.brpop([calls_key()], timeout=POP_SECONDS)
            except redis_clients.RedisError as exc:
                self._slots.release()
                if not away:
                    logger.warning("call consumer: Redis unavailable (%s); taking calls again once it is back", exc)
                away = True
                await anyio.sleep(RETRY_SECONDS)
                continue
            if away:
                logger.info("call consumer: Redis is back")
            away = False
            if popped is None:
                self._slots.release()
            else:
                calls.start_soon(self._run, popped[1])

    async def _run(self, raw: bytes) -> None:
        try:
            await call_take(self._pool, raw)
        except Exception:  # Redis went away (before the reply, say): the caller's wait ends at its deadline
            logger.exception("call consumer: a call ended without its reply")
        finally:
            self._slots.release()


class CallConsumerStep(bootsteps.StartStopStep):
    """The worker's blueprint runs the call consumer beside Celery's own (gateway_project/celery.py adds it)."""

    requires = {"celery.worker.components:Pool"}

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        self.consumer: CallConsumer | None = None
        self.serving: concurrent.futures.Future[None] | None = None

    def start(self, worker: Any) -> None:
        if CALLS_QUEUE not in worker.app.amqp.queues.consume_from:  # a worker for code mode alone, say
            return
        runner = pool_thread()
        self.consumer = CallConsumer(runner.pool, worker.concurrency)
        self.serving = runner.submit(self.consumer.serve())
        self.serving.add_done_callback(_ended)

    def stop(self, worker: Any) -> None:
        if self.consumer is None:
            return
        runner = pool_thread()
        runner.loop.call_soon_threadsafe(self.consumer.stop)
        # A warm shutdown lets the calls taken finish, as Celery lets its tasks; not past any call's deadline.
        _wait(self.serving, call_deadline(settings.GATEWAY_MAX_TIMEOUT))
        self.consumer = None


def _ended(serving: "concurrent.futures.Future[None]") -> None:
    if not serving.cancelled() and (error := serving.exception()) is not None:  # pushed calls would go unanswered
        logger.error("call consumer stopped: %r", error, exc_info=error)


def _wait(serving: "concurrent.futures.Future[None]", timeout: float) -> None:
    """Until the consumer ends (one that failed was logged as it did: the worker's shutdown goes on)."""
    if not concurrent.futures.wait([serving], timeout=timeout).done:
        logger.warning("call consumer: calls still running at shutdown are left to the audit sweep")
