"""Thread pools started at their full size: a pool grows a thread only when every thread it has is busy, so a
process's memory (each thread's stack and what it opens) stepped up whenever the load first reached a new peak,
at any hour (docs/reliability.md, the soak). Started up front, the process is at its size from the start."""

import threading
from concurrent.futures import ThreadPoolExecutor

START_WAIT = 30.0


def executor_fill(executor: ThreadPoolExecutor, size: int) -> None:
    """Start `size` threads in `executor` now (each waits until all have started, so none is reused)."""
    started = threading.Barrier(size + 1)
    for _ in range(size):
        executor.submit(started.wait, START_WAIT)
    started.wait(START_WAIT)
