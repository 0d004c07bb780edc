"""The executor: where upstream calls run. One interface, two implementations.

- InlineExecutor (embedded default): this very process's pool runs the call (on the serving loop itself in a web
  process: registry/upstreams/loop.py).
- CeleryExecutor (REDIS_URL set): a worker on queue `upstream` runs it and pushes the outcome onto a
  one-off Redis list that the caller waits on with BLPOP: no polling, no result backend. An agent's call may
  bypass Celery's consumer (GATEWAY_CALL_TRANSPORT=direct): the worker's call consumer takes it off a list of
  its own, on the pool's loop (registry/call_consumer.py). Tasks and replies
  carry MACs (gateway_project/lib/task_mac.py): a reply whose MAC fails is REPLY_REFUSED.
"""

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from functools import cache
from typing import Any, Protocol

import anyio
from celery import current_app
from django.conf import settings

from audit.outcomes import EXECUTOR_GRACE_SECONDS, call_deadline
from gateway_project.lib import task_mac
from gateway_project.lib.redis_clients import async_redis, script_run, sync_redis
from registry.publish import CALL_TASK, call_push, task_headers, task_publish
from registry.upstreams.loop import held_tunnel_close, pool_thread
from registry.upstreams.outcome import TUNNEL_GONE, Outcome, failure
from registry.upstreams.relay import LoopRelay, Relay, cancel_remote, carried, relay_channels, relay_pump
from registry.upstreams.requests import UpstreamRequest
from registry.upstreams.upstream_oauth import oauth_begin, oauth_finish, oauth_seconds
from registry.worker import HEARTBEAT_SECONDS, alive_key

logger = logging.getLogger(__name__)

REPLY_TTL_SECONDS = 60
EXECUTOR_UNAVAILABLE = "EXECUTOR_UNAVAILABLE"  # no executor answered in time
REPLY_REFUSED = "REPLY_REFUSED"  # a reply whose MAC did not verify: not the worker's, or not for this call


class Executor(Protocol):
    # A tool call, or a resources, prompts or completion request passed through as the upstream answers it.
    async def request(self, request: UpstreamRequest, relay: Relay | None = None) -> Outcome: ...

    def list_tools(self, *, upstream_id: int, revision: int, timeout: float) -> Outcome: ...

    # Handoff tunnels (handoff/protocol/tunnels.py): opened by whichever worker takes the task, then pinned to it;
    # `queue` names that worker ("" in the embedded default, where this process holds them).
    async def tunnel_open(
        self, *, tunnel_id: str, upstream_id: int, grant: dict[str, Any], connect_timeout: float
    ) -> Outcome: ...

    async def tunnel_call(
        self, *, tunnel_id: str, queue: str, tool: str, arguments: dict[str, Any], timeout: float
    ) -> Outcome: ...

    async def tunnel_close(self, *, tunnel_id: str, queue: str) -> None: ...

    # A person's sign-in at an upstream's own authorization server (registry/upstreams/upstream_oauth.py): the
    # executor discovers, registers and exchanges the code; the web process gets sealed material, never a token.
    def oauth_begin(self, *, upstream_id: int, redirect_uri: str) -> Outcome: ...

    def oauth_finish(
        self,
        *,
        upstream_id: int,
        material: dict[str, Any],
        sealed_code: str,
        redirect_uri: str,
        person_issuer: str,
        person_subject: str,
        person_name: str,
    ) -> Outcome: ...


class InlineExecutor:
    async def request(self, request: UpstreamRequest, relay: Relay | None = None) -> Outcome:
        runner, here = pool_thread(), asyncio.get_running_loop()
        # Cancelling the wait cancels the call on the pool's loop, and the SDK client tells the upstream.
        if (wanted := carried(relay)) and runner.loop is not here:
            wanted = LoopRelay(wanted, here)
        return await runner.run(runner.pool.request(request, wanted))

    def list_tools(self, *, upstream_id: int, revision: int, timeout: float) -> Outcome:
        runner = pool_thread()
        wait = call_deadline(timeout)
        try:
            return runner.submit(runner.pool.list_tools(upstream_id, revision)).result(timeout=wait)
        except TimeoutError:
            return _lost(wait)

    async def tunnel_open(
        self, *, tunnel_id: str, upstream_id: int, grant: dict[str, Any], connect_timeout: float
    ) -> Outcome:
        runner = pool_thread()
        outcome = await runner.run(runner.pool.tunnel_open(tunnel_id, upstream_id, grant, connect_timeout))
        return held_by(outcome, "")

    async def tunnel_call(
        self, *, tunnel_id: str, queue: str, tool: str, arguments: dict[str, Any], timeout: float
    ) -> Outcome:
        runner = pool_thread()
        return await runner.run(runner.pool.tunnel_call(tunnel_id, tool, arguments))

    async def tunnel_close(self, *, tunnel_id: str, queue: str) -> None:
        held_tunnel_close(tunnel_id)

    def oauth_begin(self, *, upstream_id: int, redirect_uri: str) -> Outcome:
        return _on_pool(oauth_begin(upstream_id, redirect_uri))

    def oauth_finish(self, **kwargs: Any) -> Outcome:
        return _on_pool(oauth_finish(**kwargs))


def _on_pool(work: Awaitable[Outcome]) -> Outcome:
    """A sign-in step on this process's pool thread, waited for from a (sync) view."""
    wait = oauth_seconds() + EXECUTOR_GRACE_SECONDS
    running = pool_thread().submit(work)
    try:
        return running.result(timeout=wait)
    except TimeoutError:
        running.cancel()
        return _lost(wait)


def held_by(outcome: Outcome, queue: str) -> Outcome:
    """An opened tunnel's outcome, naming the worker queue that holds it."""
    return outcome | {"result": outcome["result"] | {"queue": queue}} if outcome["ok"] else outcome


def _reply_prefix() -> str:
    return f"{settings.GATEWAY_REDIS_PREFIX}reply:"


def reply_key() -> str:
    return f"{_reply_prefix()}{uuid.uuid4().hex}"


def is_reply_key(key: object) -> bool:
    """Whether `key` names a reply list (a forged task's `reply_to` may name any key)."""
    return isinstance(key, str) and key.startswith(_reply_prefix())


def reply_opened(task: str, key: str, wire: bytes) -> Outcome:
    """The outcome a worker pushed onto `key` for `task`, or REPLY_REFUSED if its MAC does not verify."""
    try:
        return task_mac.reply_open(key, wire)
    except task_mac.Refused as refused:
        logger.warning("reply to task %s refused: %s", task, refused.reason)
        return failure(
            REPLY_REFUSED,
            "The gateway could not trust its worker's answer: the call may or may not have run. "
            "Check its effect before repeating it.",
            f"reply to {task} refused: {refused.reason}",
        )


def _worker_gone(queue: str) -> Outcome:
    return failure(TUNNEL_GONE, "The specialist's connection is gone.", f"the worker holding {queue} is not alive")


def _lost(timeout: float) -> Outcome:
    return failure(
        EXECUTOR_UNAVAILABLE,
        "No answer from the gateway's workers in time: the call may or may not have run. "
        "Check its effect before repeating it.",
        f"no reply from an executor within {timeout:g}s",
    )


Send = Callable[[dict[str, Any]], Awaitable[None]]  # hands a task's keyword arguments to the workers


def task_send(task: str, queue: str = "upstream") -> Send:
    """`task` (by name: the worker defines it) published to `queue`. One that no worker starts within the grace
    period could no longer answer in time: it expires rather than run late."""
    return lambda kwargs: task_publish(task, kwargs=kwargs, queue=queue, expires=EXECUTOR_GRACE_SECONDS)


def _call_send() -> Send:
    """An agent's call: straight to the workers' call consumers (GATEWAY_CALL_TRANSPORT=direct), or as its task."""
    if settings.GATEWAY_CALL_TRANSPORT == "direct":
        return lambda kwargs: call_push(kwargs, expires=EXECUTOR_GRACE_SECONDS)
    return task_send(CALL_TASK)


async def _publish_and_wait(task: str, kwargs: dict[str, Any], wait: float, send: Send) -> Outcome:
    """Hand `task`'s keyword arguments to the workers by `send` and wait up to `wait` seconds for the reply its
    worker pushes to `reply_to`."""
    key = reply_key()
    await send(kwargs | {"reply_to": key})
    reply = await async_redis().blpop([key], timeout=wait)
    return reply_opened(task, key, reply[1]) if reply else _lost(wait)


async def publish_call(task: str, kwargs: dict[str, Any], wait: float, relay: Relay | None, send: Send) -> Outcome:
    """A call of an agent's: sent and waited for as any task, relaying what the upstream sends meanwhile (if the
    relay wants anything); if the wait is cancelled, so is the call in the worker."""
    call, wanted = uuid.uuid4().hex, carried(relay)
    kwargs = kwargs | {"call": call}
    try:
        if wanted is None:
            return await _publish_and_wait(task, kwargs, wait, send)
        channels = relay_channels(call)
        kwargs |= {"relay": channels, "capabilities": sorted(wanted.capabilities)}
        return await _relayed(_publish_and_wait(task, kwargs, wait, send), channels, wanted)
    except anyio.get_cancelled_exc_class():
        with anyio.CancelScope(shield=True):
            await cancel_remote(call)
        raise


async def _relayed(waiting: Awaitable[Outcome], channels: dict[str, str], relay: Relay) -> Outcome:
    pumped = anyio.Event()

    async def pump() -> None:
        await relay_pump(channels, relay)
        pumped.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(pump)
        outcome = await waiting
        if outcome.get("code") != EXECUTOR_UNAVAILABLE:  # events travel apart from the reply: the last ones
            with anyio.move_on_after(EXECUTOR_GRACE_SECONDS):  # may still be on their way
                await pumped.wait()
        tg.cancel_scope.cancel()
    return outcome


class CeleryExecutor:
    async def request(self, request: UpstreamRequest, relay: Relay | None = None) -> Outcome:
        wait = call_deadline(request.timeout)
        return await publish_call(CALL_TASK, {"request": asdict(request)}, wait, relay, _call_send())

    async def tunnel_open(
        self, *, tunnel_id: str, upstream_id: int, grant: dict[str, Any], connect_timeout: float
    ) -> Outcome:
        kwargs = {
            "tunnel_id": tunnel_id,
            "upstream_id": upstream_id,
            "grant": grant,
            "connect_timeout": connect_timeout,
        }
        wait = connect_timeout + EXECUTOR_GRACE_SECONDS
        return await _publish_and_wait("registry.tunnel_open", kwargs, wait, task_send("registry.tunnel_open"))

    async def tunnel_call(
        self, *, tunnel_id: str, queue: str, tool: str, arguments: dict[str, Any], timeout: float
    ) -> Outcome:
        if not await async_redis().exists(alive_key(queue)):
            return _worker_gone(queue)
        key = reply_key()
        kwargs = {"tunnel_id": tunnel_id, "tool": tool, "arguments": arguments, "reply_to": key}
        await task_publish("registry.tunnel_call", kwargs=kwargs, queue=queue, expires=EXECUTOR_GRACE_SECONDS)
        # Waited for in slices: the worker's heartbeat is looked at between them, so a dead worker is
        # noticed within seconds instead of at the call's timeout.
        deadline = time.monotonic() + timeout + EXECUTOR_GRACE_SECONDS
        while (left := deadline - time.monotonic()) > 0:
            reply = await async_redis().blpop([key], timeout=min(HEARTBEAT_SECONDS, left))
            if reply:
                return reply_opened("registry.tunnel_call", key, reply[1])
            if not await async_redis().exists(alive_key(queue)):
                return _worker_gone(queue)
        return _lost(timeout + EXECUTOR_GRACE_SECONDS)

    async def tunnel_close(self, *, tunnel_id: str, queue: str) -> None:
        if queue:  # else no worker took it yet; one that opens it late closes it when it idles (pool.py)
            await task_publish("registry.tunnel_close", kwargs={"tunnel_id": tunnel_id}, queue=queue, expires=60)

    def list_tools(self, *, upstream_id: int, revision: int, timeout: float) -> Outcome:
        task, kwargs = "registry.list_tools", {"upstream_id": upstream_id, "revision": revision}
        wait = call_deadline(timeout)
        return _sent_and_waited(task, kwargs, wait)

    def oauth_begin(self, *, upstream_id: int, redirect_uri: str) -> Outcome:
        kwargs = {"upstream_id": upstream_id, "redirect_uri": redirect_uri}
        return _sent_and_waited("registry.oauth_begin", kwargs, oauth_seconds() + EXECUTOR_GRACE_SECONDS)

    def oauth_finish(self, **kwargs: Any) -> Outcome:
        return _sent_and_waited("registry.oauth_finish", kwargs, oauth_seconds() + EXECUTOR_GRACE_SECONDS)


def _sent_and_waited(task: str, kwargs: dict[str, Any], wait: float) -> Outcome:
    """From sync code (a view, an admin action): publish `task` with a MAC and wait up to `wait` s for its reply."""
    key = reply_key()
    kwargs = kwargs | {"reply_to": key}
    headers = task_headers(task, kwargs, EXECUTOR_GRACE_SECONDS)
    current_app.send_task(task, kwargs=kwargs, queue="upstream", expires=EXECUTOR_GRACE_SECONDS, headers=headers)
    reply = sync_redis().blpop([key], timeout=wait)
    return reply_opened(task, key, reply[1]) if reply else _lost(wait)


async def reply_after(key: str, work: Awaitable[Outcome]) -> None:
    """Worker side, on the pool's loop: run `work` and hand its outcome to whoever waits on `key` at once
    (it expires if nobody does), without waking the task's thread first."""
    await reply_send(key, await work)


# A reply and its expiry in one round trip, over the loop's line (redis_clients.script_run).
REPLY_SCRIPT = "redis.call('RPUSH', KEYS[1], ARGV[1]) return redis.call('EXPIRE', KEYS[1], ARGV[2])"


async def reply_send(key: str, outcome: Outcome) -> None:
    """Worker side, on the pool's loop: hand `outcome` to whoever waits on `key` (it expires if nobody does)."""
    await script_run(REPLY_SCRIPT, [key], [task_mac.reply_seal(key, outcome), REPLY_TTL_SECONDS])


def reply_now(key: str, outcome: Outcome) -> None:
    """Worker side, from the task's thread: hand `outcome` to whoever waits on `key` (a refusal, say)."""
    sync_redis().eval(REPLY_SCRIPT, 1, key, task_mac.reply_seal(key, outcome), REPLY_TTL_SECONDS)


@cache
def get_executor() -> Executor:
    return CeleryExecutor() if settings.GATEWAY_EXECUTOR == "celery" else InlineExecutor()
