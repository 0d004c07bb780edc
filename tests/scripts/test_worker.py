"""scripts/worker: the Celery worker as deployed runs under jemalloc where Debian's libjemalloc2 is installed (glibc's
malloc fragments its heap: docs/reliability.md, "Soak"), and under glibc's malloc when told to."""

import os
import platform
from pathlib import Path

from tests import servers
from tests.conftest import needs

JEMALLOC = f"/usr/lib/{platform.machine()}-linux-gnu/libjemalloc.so.2"


def mapped_libraries(pid: int) -> set[str]:
    return {line.split()[-1] for line in Path(f"/proc/{pid}/maps").read_text().splitlines() if ".so" in line}


def worker_libraries(env: dict[str, str], log: Path) -> set[str]:
    needs(bool(os.environ.get("REDIS_URL")), "REDIS_URL is not set: no Redis, so no Celery worker")
    worker = servers.start_worker(env | {"GATEWAY_EXECUTOR": "celery"}, log)
    try:
        return mapped_libraries(worker.process.pid)
    finally:
        worker.stop()


def test_the_worker_runs_under_jemalloc_where_it_is_installed(server_env, logs):
    needs(os.path.exists(JEMALLOC), f"{JEMALLOC} is not installed (Debian package libjemalloc2)")
    assert JEMALLOC in worker_libraries(server_env, logs / "worker-jemalloc.log")


def test_a_worker_told_glibc_runs_under_glibcs_malloc(server_env, logs):
    libraries = worker_libraries(server_env | {"GATEWAY_WORKER_MALLOC": "glibc"}, logs / "worker-glibc.log")
    assert JEMALLOC not in libraries and any("libpython3" in library for library in libraries)
