"""Free memory given back to the system. glibc's free() returns only the top of a heap, and only past a threshold
that glibc itself raises (to 2-4 MiB in the soak's processes): memory freed below a block still in use stays in
the process for good. Under the soak's steady load the worker's and the web process's RSS grew by that memory
while what malloc held in use stayed flat (docs/reliability.md, issue 41); malloc_trim(0) gave 3.5 and 7.5 MiB
back at once. So each process of the gateway calls it on a timer, in a thread of its own."""

import ctypes
import logging
import os
import threading

logger = logging.getLogger(__name__)

_libc = ctypes.CDLL(None)
_started_in = 0  # the pid whose trimmer runs: a forked child starts its own


def malloc_trim_start(*, interval: float) -> bool:
    """Trim every `interval` seconds from now on in this process (once per process); False where there is nothing
    to do (not glibc, or an interval of 0)."""
    global _started_in
    if interval <= 0 or not hasattr(_libc, "malloc_trim") or _started_in == os.getpid():
        return False
    _started_in = os.getpid()
    threading.Thread(target=_trim_every, args=(interval,), name="malloc-trim", daemon=True).start()
    return True


def _trim_every(interval: float) -> None:
    stop = threading.Event()  # never set: waited on for its timeout, the thread ends with the process
    while not stop.wait(interval):
        _libc.malloc_trim(0)  # walks the free chunks under each arena's lock: a few milliseconds
