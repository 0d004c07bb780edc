from collections.abc import Callable
from typing import Any

from channels.db import database_sync_to_async


def database_async(func: Callable[..., Any]) -> Any:
    """`database_sync_to_async` on the shared thread pool. The default, thread-sensitive executor is a
    single thread per process, which would serialise every session's database work behind each other."""
    return database_sync_to_async(func, thread_sensitive=False)
