"""The executor's event loop, which holds the upstream pool for the life of the process: in a web process of the
embedded default, the loop that serves requests (handoff/web_process.py starts it there with the first request,
so a call reaches the pool without a hop between threads); anywhere else (a Celery worker, a management command,
a web process whose pool a catalog sync started before it served) a thread of its own, started on first use (so
after any fork)."""

import asyncio
import concurrent.futures
import os
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import anyio
from channels.db import database_sync_to_async

from registry.models import Upstream
from registry.upstreams.person import person_spec
from registry.upstreams.pool import UpstreamPool
from registry.upstreams.spec import UpstreamSpec

T = TypeVar("T")


def _upstream(upstream_id: int) -> Upstream:
    return Upstream.objects.select_related("catalog_credential").get(pk=upstream_id)


# Not on the thread-sensitive thread: under Daphne a sync view (an admin save that syncs a catalog) holds that
# thread while it waits for this very pool, and the spec read would wait for the view: a deadlock.
_upstream_read = database_sync_to_async(_upstream, thread_sensitive=False)
_spec_of = database_sync_to_async(UpstreamSpec.from_model, thread_sensitive=False)


async def load_spec(upstream_id: int, person: dict | None = None, catalog: bool = False) -> UpstreamSpec:
    """How to reach the upstream; a per-person one as `person` (a CredentialRef's fields) reaches it, or for its
    catalog as its designated connection does. Raises registry/upstreams/person.py CredentialUnusable."""
    upstream = await _upstream_read(upstream_id)
    return await person_spec(upstream, person, catalog) if upstream.per_person else await _spec_of(upstream)


# What the pool does with what it learns, registered at start-up by the apps' ready() (registry first, so an
# upstream's tools are synced again before agents are told they changed): the executor knows no layer above.
ChangeListener = Callable[[int, str], Awaitable[None]]
HealthListener = Callable[[int, str, str], Awaitable[None]]
_change_listeners: list[ChangeListener] = []
_health_listeners: list[HealthListener] = []


def on_upstream_change(listener: ChangeListener) -> None:
    """`listener(upstream_id, kind)` hears that an upstream said a list of its changed (kind: tools, prompts,
    resources) or one of its resources did (kind: UPDATED + its uri)."""
    if listener not in _change_listeners:
        _change_listeners.append(listener)


def on_upstream_health(listener: HealthListener) -> None:
    """`listener(upstream_id, health, cause)` stores the health an outcome showed."""
    if listener not in _health_listeners:
        _health_listeners.append(listener)


async def upstream_changed(upstream_id: int, kind: str) -> None:
    for listener in _change_listeners:
        await listener(upstream_id, kind)


async def health_store(upstream_id: int, health: str, cause: str) -> None:
    for listener in _health_listeners:
        await listener(upstream_id, health, cause)


class PoolThread:
    def __init__(self) -> None:
        self.pool = UpstreamPool(load_spec, upstream_changed, health_store)
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        self._thread = threading.Thread(target=self._main, args=(ready,), name="upstream-pool", daemon=True)
        self._thread.start()
        ready.wait()

    def _main(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._serve(ready))

    async def _serve(self, ready: threading.Event) -> None:
        async with anyio.create_task_group() as tg:
            self._scope = tg.cancel_scope
            await tg.start(self.pool.serve)
            ready.set()

    def submit(self, coro: Coroutine[Any, Any, T]) -> "concurrent.futures.Future[T]":
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    async def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await `coro` on the pool's loop, from another loop (cancelling the wait cancels it there)."""
        return await asyncio.wrap_future(self.submit(coro))

    def gone(self) -> bool:
        return not self._thread.is_alive()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self._scope.cancel)
        self._thread.join(timeout=10)


class PoolOnLoop:
    """The pool on a loop that serves requests: calls made on that loop await it directly; sync callers (views in
    threads, the health probe) reach it as they reach a pool thread's. Never waited for on the loop's own thread:
    that would block every request (and the pool) for good."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.pool = UpstreamPool(load_spec, upstream_changed, health_store)
        self.loop = loop
        self._started = asyncio.Event()
        self._scope: anyio.CancelScope | None = None
        self._task = loop.create_task(self._serve(), name="upstream-pool")  # held: the loop keeps weak references

    async def _serve(self) -> None:
        async with anyio.create_task_group() as tg:
            self._scope = tg.cancel_scope
            await tg.start(self.pool.serve)
            self._started.set()

    async def _when_started(self, coro: Coroutine[Any, Any, T]) -> T:
        # The pool's task group opens on the loop's next turn; a call that comes first waits for it.
        if not self._started.is_set():
            await self._started.wait()
        return await coro

    def submit(self, coro: Coroutine[Any, Any, T]) -> "concurrent.futures.Future[T]":
        if _loop_here() is self.loop:
            coro.close()
            raise RuntimeError("the upstream pool runs on this very loop: await it, do not wait for it")
        return asyncio.run_coroutine_threadsafe(self._when_started(coro), self.loop)

    async def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await `coro` on the pool's loop: directly if it is this one."""
        if asyncio.get_running_loop() is self.loop:
            return await self._when_started(coro)
        return await asyncio.wrap_future(self.submit(coro))

    def gone(self) -> bool:
        return self.loop.is_closed() or self._task.done()

    def stop(self) -> None:
        """Close the pool's sessions (and so its stdio servers); from the loop or from another thread."""
        if self.loop.is_closed():
            return
        if _loop_here() is self.loop:
            self._task.cancel()
        else:
            self.loop.call_soon_threadsafe(self._task.cancel)


PoolRunner = PoolThread | PoolOnLoop


def _loop_here() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


_lock = threading.Lock()
_instance: tuple[int, PoolRunner] | None = None


def _current() -> PoolRunner | None:
    running = _instance
    return running[1] if running and running[0] == os.getpid() and not running[1].gone() else None


def pool_thread() -> PoolRunner:
    """This process's pool (on the serving loop, or a thread of its own); a forked child gets a fresh one, never its
    parent's."""
    global _instance
    with _lock:
        if (running := _current()) is None:
            running = PoolThread()
            _instance = (os.getpid(), running)
        return running


def pool_on_this_loop() -> None:
    """From a web process's serving loop: hold the pool there unless this process holds one already (a pool
    thread that a catalog sync started before the server served keeps its sessions, and so its place)."""
    global _instance
    if _current() is not None:
        return
    with _lock:
        if _current() is None:
            _instance = (os.getpid(), PoolOnLoop(asyncio.get_running_loop()))


def held_tunnels() -> list[str]:
    """Ids of the handoff tunnels this process's pool holds (none if it never started one)."""
    with _lock:
        running = _current()
    return running.pool.tunnel_ids() if running else []


def held_tunnel_close(tunnel_id: str) -> None:
    """Close a tunnel this process's pool holds, from any thread (a no-op if it holds no such tunnel)."""
    runner = pool_thread()
    runner.loop.call_soon_threadsafe(runner.pool.tunnel_close, tunnel_id)
