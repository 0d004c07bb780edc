"""Free memory given back to the system. glibc's free() returns only the top of a heap, and only past a threshold
that glibc itself raises (to 2-4 MiB in the soak's processes): memory freed below a block still in use stays in
the process for good. Under the soak's steady load the worker's and the web process's RSS grew by that memory
while what malloc held in use stayed flat (docs/reliability.md, issue 41); malloc_trim(0) gave 3.5 and 7.3 MiB
back at once. So each process of the gateway calls it on a timer, in a thread of its own."""

import ctypes
import os
import threading

_libc = ctypes.CDLL(None)
_interval = 0.0  # set once trimming has started in this process


def malloc_trim_start(*, interval: float) -> bool:
    """Trim every `interval` seconds from now on, in this process and in any it forks (once per process); False
    where there is nothing to do (not glibc, an interval of 0, or started already)."""
    global _interval
    if interval <= 0 or not hasattr(_libc, "malloc_trim") or _interval:
        return False
    _interval = interval
    _thread_start()
    os.register_at_fork(after_in_child=_thread_start)  # a forked child has none of its parent's threads
    return True


def _thread_start() -> None:
    threading.Thread(target=_trim_every, args=(_interval,), name="malloc-trim", daemon=True).start()


def _trim_every(interval: float) -> None:
    stop = threading.Event()  # never set: waited on for its timeout, the thread ends with the process
    while not stop.wait(interval):
        _libc.malloc_trim(0)  # walks the free chunks under each arena's lock; ctypes lets the GIL go meanwhile
