"""The project's wiring (settings, URLs, ASGI, the Celery app) and `lib/`, the plumbing every app may import.
The Celery app is loaded by registry's AppConfig, not here: `lib` is imported by processes without Django
(a specialist verifying delegation tokens) that must not load it."""

import os

# NumPy's OpenBLAS (code mode's embeddings) runs with one thread, set before NumPy loads: with a pool of BLAS
# threads, its fork handler waits for them, so a subprocess forked by uvloop (uvicorn's loop: a stdio server, a
# Deno sandbox) while an embedding ran in another thread hung the web process for good. Daphne's loop spawns with
# vfork, which runs no fork handlers. Set, not defaulted: no value is safe but one.
os.environ["OPENBLAS_NUM_THREADS"] = "1"

# The one place the version is written: serverInfo, /readyz and the console footer read it (CHANGELOG.md says
# what each version changed).
__version__ = "0.1.0"
