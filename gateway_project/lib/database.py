import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from channels.db import database_sync_to_async

T = TypeVar("T")


def database_async(func: Callable[..., Any]) -> Any:
    """`database_sync_to_async` on the shared thread pool. The default, thread-sensitive executor is a
    single thread per process, which would serialise every session's database work behind each other."""
    return database_sync_to_async(func, thread_sensitive=False)


class BoundedRead:
    """A read of a store that each caller waits for at most `seconds`. While one hangs (a database that does
    not answer, a pool waiting for a connection), callers give up after `seconds` and the next ones await the
    same read instead of starting more: a dead store ties up one thread, not one per request or per second."""

    def __init__(self, read: Callable[[], Awaitable[T]], seconds: float) -> None:
        self._read, self._seconds = read, seconds
        self._task: asyncio.Future[T] | None = None

    async def __call__(self) -> T:
        loop = asyncio.get_running_loop()
        if self._task is None or self._task.done() or self._task.get_loop() is not loop:  # a loop of its own
            self._task = asyncio.ensure_future(self._read())
            self._task.add_done_callback(lambda task: task.cancelled() or task.exception())  # retrieved: no warning
        return await asyncio.wait_for(asyncio.shield(self._task), self._seconds)
