"""The project's wiring (settings, URLs, ASGI, the Celery app) and `lib/`, the plumbing every app may import.
The Celery app is loaded by registry's AppConfig, not here: `lib` is imported by processes without Django
(a specialist verifying delegation tokens) that must not load it."""

import ctypes
import os

# NumPy's OpenBLAS (code mode's embeddings) runs with one thread, set before NumPy loads: with a pool of BLAS
# threads, its fork handler waits for them, so a subprocess forked by uvloop (uvicorn's loop: a stdio server, a
# Deno sandbox) while an embedding ran in another thread hung the web process for good. Daphne's loop spawns with
# vfork, which runs no fork handlers. Set, not defaulted: no value is safe but one.
os.environ["OPENBLAS_NUM_THREADS"] = "1"

# glibc's malloc gives each thread that allocates an arena of its own, up to eight a core, and a process keeps the
# high-water mark of every arena: a Celery worker's 16 threads and the web process's executors grew in steps for
# as long as they ran (docs/reliability.md, issue 41's soak). Two arenas, set here so no deployment forgets it;
# MALLOC_ARENA_MAX in the environment, read by glibc at start, still wins. Not glibc (musl, macOS): nothing to do.
M_ARENA_MAX = -8
if "MALLOC_ARENA_MAX" not in os.environ and hasattr(libc := ctypes.CDLL(None), "mallopt"):
    libc.mallopt(M_ARENA_MAX, 2)

# The one place the version is written: serverInfo, /readyz and the console footer read it (CHANGELOG.md says
# what each version changed).
__version__ = "0.1.0"
