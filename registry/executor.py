"""The executor: where upstream calls run. One interface, two implementations.

- InlineExecutor (embedded default): the pool thread of this very process runs the call.
- CeleryExecutor (REDIS_URL set): a worker on queue `upstream` runs it and pushes the outcome onto a
  one-off Redis list that the caller waits on with BLPOP: no polling, no result backend.
"""

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Awaitable
from functools import cache
from typing import Any, Protocol

import anyio
import redis
import redis.asyncio as aredis
from django.conf import settings

from registry.loop import pool_thread
from registry.pool import TUNNEL_GONE, Outcome, failure
from registry.relay import LoopRelay, Relay, cancel_remote, carried, relay_channels, relay_pump
from registry.worker import HEARTBEAT_SECONDS, alive_key

# How long past the upstream's own timeout a caller waits for the executor before calling it lost.
EXECUTOR_GRACE_SECONDS = 5.0
REPLY_TTL_SECONDS = 60
EXECUTOR_UNAVAILABLE = "EXECUTOR_UNAVAILABLE"  # no executor answered in time


def call_deadline(timeout: float) -> float:
    """How long a caller waits for a call on an upstream whose timeout is `timeout`: connecting, the call,
    then the grace. Past it the call has an outcome, or its process is gone (audit/outcomes.py)."""
    return timeout + settings.GATEWAY_CONNECT_TIMEOUT + EXECUTOR_GRACE_SECONDS


class Executor(Protocol):
    async def call_tool(
        self,
        *,
        upstream_id: int,
        revision: int,
        tool: str,
        arguments: dict[str, Any],
        timeout: float,
        traceparent: str = "",
        relay: Relay | None = None,
        rounds: dict[str, Any] | None = None,
    ) -> Outcome: ...

    def list_tools(self, *, upstream_id: int, revision: int, timeout: float) -> Outcome: ...

    # Resources, prompts and completions (requests.FORWARDED), passed through as the upstream answers them.
    async def forward(
        self,
        *,
        upstream_id: int,
        revision: int,
        method: str,
        params: dict[str, Any],
        timeout: float,
        relay: Relay | None = None,
        rounds: dict[str, Any] | None = None,
    ) -> Outcome: ...

    # Handoff tunnels (handoff/tunnels.py): opened by whichever worker takes the task, then pinned to it;
    # `queue` names that worker ("" in the embedded default, where this process holds them).
    async def tunnel_open(
        self, *, tunnel_id: str, upstream_id: int, grant: dict[str, Any], connect_timeout: float
    ) -> Outcome: ...

    async def tunnel_call(
        self, *, tunnel_id: str, queue: str, tool: str, arguments: dict[str, Any], timeout: float
    ) -> Outcome: ...

    async def tunnel_close(self, *, tunnel_id: str, queue: str) -> None: ...

    # Code mode (handoff/codemode.py): an execution, its code's tool calls decided and audited where it runs.
    async def run_code(self, *, execution: dict[str, Any], timeout: float) -> Outcome: ...


class InlineExecutor:
    async def call_tool(
        self,
        *,
        upstream_id: int,
        revision: int,
        tool: str,
        arguments: dict[str, Any],
        timeout: float,
        traceparent: str = "",
        relay: Relay | None = None,
        rounds: dict[str, Any] | None = None,
    ) -> Outcome:
        runner = pool_thread()
        # Cancelling the wait cancels the call on the pool's loop, and the SDK client tells the upstream.
        here = LoopRelay(wanted, asyncio.get_running_loop()) if (wanted := carried(relay)) else None
        calling = runner.pool.call_tool(upstream_id, revision, tool, arguments, traceparent, here, rounds)
        return await asyncio.wrap_future(runner.submit(calling))

    async def forward(
        self,
        *,
        upstream_id: int,
        revision: int,
        method: str,
        params: dict[str, Any],
        timeout: float,
        relay: Relay | None = None,
        rounds: dict[str, Any] | None = None,
    ) -> Outcome:
        runner = pool_thread()
        here = LoopRelay(wanted, asyncio.get_running_loop()) if (wanted := carried(relay)) else None
        forwarding = runner.pool.forward(upstream_id, revision, method, params, here, rounds)
        return await asyncio.wrap_future(runner.submit(forwarding))

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
        opening = runner.pool.tunnel_open(tunnel_id, upstream_id, grant, connect_timeout)
        outcome = await asyncio.wrap_future(runner.submit(opening))
        return held_by(outcome, "")

    async def tunnel_call(
        self, *, tunnel_id: str, queue: str, tool: str, arguments: dict[str, Any], timeout: float
    ) -> Outcome:
        runner = pool_thread()
        return await asyncio.wrap_future(runner.submit(runner.pool.tunnel_call(tunnel_id, tool, arguments)))

    async def tunnel_close(self, *, tunnel_id: str, queue: str) -> None:
        runner = pool_thread()
        runner.loop.call_soon_threadsafe(runner.pool.tunnel_close, tunnel_id)

    async def run_code(self, *, execution: dict[str, Any], timeout: float) -> Outcome:
        """On this process's own loop: the sandbox is a subprocess, and its calls go through this executor."""
        from handoff.codemode import execution_run  # handoff builds on registry

        return await execution_run(execution)


def held_by(outcome: Outcome, queue: str) -> Outcome:
    """An opened tunnel's outcome, naming the worker queue that holds it."""
    return outcome | {"result": outcome["result"] | {"queue": queue}} if outcome["ok"] else outcome


def reply_key() -> str:
    return f"{settings.GATEWAY_REDIS_PREFIX}reply:{uuid.uuid4().hex}"


def _worker_gone(queue: str) -> Outcome:
    return failure(TUNNEL_GONE, "The specialist's connection is gone.", f"the worker holding {queue} is not alive")


def _lost(timeout: float) -> Outcome:
    return failure(
        EXECUTOR_UNAVAILABLE,
        "No answer from the gateway's workers in time: the call may or may not have run. "
        "Check its effect before repeating it.",
        f"no reply from an executor within {timeout:g}s",
    )


# BLPOP waits as long as a call may take; redis-py's default 5 s socket timeout would cut it short.
REDIS_OPTIONS = {"socket_timeout": None, "socket_connect_timeout": 5}


@cache
def sync_redis() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL, **REDIS_OPTIONS)


# redis.asyncio clients belong to one event loop; a process may run several (web, pool thread, tests).
_async_clients: dict[tuple[int, str], aredis.Redis] = {}
_async_clients_lock = threading.Lock()


def async_redis(url: str = "") -> aredis.Redis:
    """This event loop's client of REDIS_URL (or of `url`: the Celery broker may live elsewhere)."""
    key = (id(asyncio.get_running_loop()), url or settings.REDIS_URL)
    with _async_clients_lock:
        if key not in _async_clients:
            _async_clients[key] = aredis.Redis.from_url(key[1], **REDIS_OPTIONS)
        return _async_clients[key]


async def _publish_and_wait(task: Any, kwargs: dict[str, Any], wait: float, queue: str = "upstream") -> Outcome:
    """Publish to `queue` and wait up to `wait` seconds for the reply the task pushes to `reply_to`."""
    from registry.publish import task_publish  # publish and tasks both import this module

    key = reply_key()
    # A task that no worker starts within the grace period could no longer answer in time: it expires
    # rather than run late.
    await task_publish(task, kwargs=kwargs | {"reply_to": key}, queue=queue, expires=EXECUTOR_GRACE_SECONDS)
    reply = await async_redis().blpop([key], timeout=wait)
    return json.loads(reply[1]) if reply else _lost(wait)


async def _publish_call(
    task: Any, kwargs: dict[str, Any], wait: float, relay: Relay | None, queue: str = "upstream"
) -> Outcome:
    """A call of an agent's: published and waited for as any task, relaying what the upstream sends meanwhile
    (if the relay wants anything); if the wait is cancelled, so is the call in the worker."""
    call, wanted = uuid.uuid4().hex, carried(relay)
    kwargs = kwargs | {"call": call}
    try:
        if wanted is None:
            return await _publish_and_wait(task, kwargs, wait, queue)
        channels = relay_channels(call)
        kwargs |= {"relay": channels, "capabilities": sorted(wanted.capabilities)}
        return await _relayed(_publish_and_wait(task, kwargs, wait), channels, wanted)
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
    async def call_tool(
        self,
        *,
        upstream_id: int,
        revision: int,
        tool: str,
        arguments: dict[str, Any],
        timeout: float,
        traceparent: str = "",
        relay: Relay | None = None,
        rounds: dict[str, Any] | None = None,
    ) -> Outcome:
        from registry.tasks import call_tool_task  # tasks import this module

        kwargs = {
            "upstream_id": upstream_id,
            "revision": revision,
            "tool": tool,
            "arguments": arguments,
            "traceparent": traceparent,
            "rounds": rounds,
        }
        wait = call_deadline(timeout)
        return await _publish_call(call_tool_task, kwargs, wait, relay)

    async def forward(
        self,
        *,
        upstream_id: int,
        revision: int,
        method: str,
        params: dict[str, Any],
        timeout: float,
        relay: Relay | None = None,
        rounds: dict[str, Any] | None = None,
    ) -> Outcome:
        from registry.tasks import forward_task

        kwargs = {"upstream_id": upstream_id, "revision": revision, "method": method, "params": params}
        wait = call_deadline(timeout)
        return await _publish_call(forward_task, kwargs | {"rounds": rounds}, wait, relay)

    async def tunnel_open(
        self, *, tunnel_id: str, upstream_id: int, grant: dict[str, Any], connect_timeout: float
    ) -> Outcome:
        from registry.tasks import tunnel_open_task

        kwargs = {
            "tunnel_id": tunnel_id,
            "upstream_id": upstream_id,
            "grant": grant,
            "connect_timeout": connect_timeout,
        }
        return await _publish_and_wait(tunnel_open_task, kwargs, connect_timeout + EXECUTOR_GRACE_SECONDS)

    async def tunnel_call(
        self, *, tunnel_id: str, queue: str, tool: str, arguments: dict[str, Any], timeout: float
    ) -> Outcome:
        from registry.publish import task_publish
        from registry.tasks import tunnel_call_task

        if not await async_redis().exists(alive_key(queue)):
            return _worker_gone(queue)
        key = reply_key()
        kwargs = {"tunnel_id": tunnel_id, "tool": tool, "arguments": arguments, "reply_to": key}
        await task_publish(tunnel_call_task, kwargs=kwargs, queue=queue, expires=EXECUTOR_GRACE_SECONDS)
        # Waited for in slices: the worker's heartbeat is looked at between them, so a dead worker is
        # noticed within seconds instead of at the call's timeout.
        deadline = time.monotonic() + timeout + EXECUTOR_GRACE_SECONDS
        while (left := deadline - time.monotonic()) > 0:
            reply = await async_redis().blpop([key], timeout=min(HEARTBEAT_SECONDS, left))
            if reply:
                return json.loads(reply[1])
            if not await async_redis().exists(alive_key(queue)):
                return _worker_gone(queue)
        return _lost(timeout + EXECUTOR_GRACE_SECONDS)

    async def tunnel_close(self, *, tunnel_id: str, queue: str) -> None:
        from registry.publish import task_publish
        from registry.tasks import tunnel_close_task

        if queue:  # else no worker took it yet; one that opens it late closes it when it idles (pool.py)
            await task_publish(tunnel_close_task, kwargs={"tunnel_id": tunnel_id}, queue=queue, expires=60)

    async def run_code(self, *, execution: dict[str, Any], timeout: float) -> Outcome:
        """On a worker of queue `sandbox`, whose code's tool calls go to queue `upstream` like any call: a
        sandbox worker needs no upstream credentials. An agent that leaves cancels the execution there."""
        from handoff.tasks import run_code_task  # handoff builds on registry

        wait = timeout + EXECUTOR_GRACE_SECONDS
        return await _publish_call(run_code_task, {"execution": execution}, wait, None, queue="sandbox")

    def list_tools(self, *, upstream_id: int, revision: int, timeout: float) -> Outcome:
        from registry.tasks import list_tools_task  # tasks import the executor's helpers

        key = reply_key()
        list_tools_task.apply_async(
            kwargs={"upstream_id": upstream_id, "revision": revision, "reply_to": key},
            queue="upstream",
            expires=EXECUTOR_GRACE_SECONDS,
        )
        wait = call_deadline(timeout)
        reply = sync_redis().blpop([key], timeout=wait)
        return json.loads(reply[1]) if reply else _lost(wait)


async def reply_after(key: str, work: Awaitable[Outcome]) -> None:
    """Worker side, on the pool's loop: run `work` and hand its outcome to whoever waits on `key` at once
    (it expires if nobody does), without waking the task's thread first."""
    outcome = await work
    async with async_redis().pipeline(transaction=False) as pipe:
        pipe.rpush(key, json.dumps(outcome))
        pipe.expire(key, REPLY_TTL_SECONDS)
        await pipe.execute()


@cache
def get_executor() -> Executor:
    return CeleryExecutor() if settings.GATEWAY_EXECUTOR == "celery" else InlineExecutor()
