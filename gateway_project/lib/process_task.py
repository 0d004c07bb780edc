"""Work a web process does for its whole life beside requests. Daphne runs no ASGI lifespan, so each such
task is started by the first request that needs it and kept by a task of its own; one that failed (its
Redis was down, say) is started again by the next request."""

import asyncio
import logging
from collections.abc import Awaitable, Callable

logger = logging.getLogger(__name__)


class ProcessTask:
    """Runs `body(ready)` once per process; `body` resolves `ready` when requests may rely on it."""

    def __init__(self, body: Callable[[asyncio.Future], Awaitable[None]]) -> None:
        self._body = body
        self._ready: asyncio.Future | None = None
        self._task: asyncio.Task | None = None  # held: the loop keeps only weak references to tasks

    def start(self) -> None:
        """Start it unless it runs (without waiting for it to be ready)."""
        if self._task is None or self._task.done():
            loop = asyncio.get_running_loop()
            self._ready = loop.create_future()
            self._task = loop.create_task(self._run(self._ready))

    async def ensure_running(self) -> None:
        """Start it unless it runs, and wait until it is ready (or raise why it could not be)."""
        self.start()
        assert self._ready is not None
        await asyncio.shield(self._ready)

    async def _run(self, ready: asyncio.Future) -> None:
        try:
            await self._body(ready)
        except Exception as exc:
            logger.exception("background task %s stopped", getattr(self._body, "__name__", self._body))
            if not ready.done():
                ready.set_exception(exc)
                ready.exception()  # retrieved here: a start() nobody waits on must not warn at exit
