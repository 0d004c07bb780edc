import gc
import inspect
import os
import shutil
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import anyio
import httpx2
import psycopg
from asgiref.sync import sync_to_async
from jsonschema import Draft202012Validator
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from audit.models import AuditEvent
from handoff.snapshot import snapshot
from policy.config_version import config_version
from registry.upstreams.pool import UpstreamPool
from registry.upstreams.spec import UpstreamSpec
from tests import servers

T = TypeVar("T")


def run(scenario: Callable[[], Awaitable[T]]) -> T:
    """Run an async client scenario with a bound; the ORM is then used outside any event loop."""

    async def bounded() -> T:
        with anyio.fail_after(60):
            return await scenario()

    return anyio.run(bounded)


def eventually(check: Callable[[], T], timeout: float = 5.0) -> T:
    """Poll `check` until it returns something truthy: another process sees a change within a bound
    (GATEWAY_SNAPSHOT_CHECK_SECONDS, 1 s by default), not at once."""
    deadline = time.monotonic() + timeout
    while not (value := check()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert value, f"still {value!r} after {timeout} s"
    return value


async def until(check: Callable[[], Any], timeout: float = 5.0) -> Any:
    """`eventually` inside a client scenario: poll `check` (a plain or an async function) until it returns
    something truthy, failing after `timeout` seconds."""
    with anyio.fail_after(timeout):
        while True:
            value = check()
            if inspect.isawaitable(value):
                value = await value
            if value:
                return value
            await anyio.sleep(0.02)


def audit_mark() -> int:
    return AuditEvent.objects.order_by("-id").values_list("id", flat=True).first() or 0


def audit_since(mark: int, *, sessions: bool = False) -> list[AuditEvent]:
    """Rows written after `mark`; the opening and closing of sessions only when asked for."""
    rows = AuditEvent.objects.filter(id__gt=mark).order_by("id")
    return list(rows if sessions else rows.exclude(kind=AuditEvent.Kind.SESSION))


def parent_pid(pid: int) -> int:
    # /proc/<pid>/stat: "pid (comm) state ppid ..."; comm may hold spaces, so split after the last ")".
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def ancestors(pid: int) -> list[int]:
    """A process's parent, its parent's parent, and so on up to init."""
    found = []
    while (pid := parent_pid(pid)) > 1:
        found.append(pid)
    return found


async def orm(query: Callable[[], T]) -> T:
    """A database read from inside a client scenario, on a connection closed right after (a connection
    left open would keep the test database from being dropped)."""
    from django.db import connection

    from gateway_project.lib.database import database_async

    def query_and_close() -> T:
        try:
            return query()
        finally:
            connection.close()  # back to the pool, which the session's teardown closes

    return await database_async(query_and_close)()


def scrape(gateway) -> list[Metric]:
    """A gateway's /metrics, parsed."""
    return list(text_string_to_metric_families(httpx2.get(f"{gateway.url}/metrics", timeout=5).text))


def metric_value(families: list[Metric], name: str, **labels: str) -> float:
    """The sample of that name with exactly these labels (0 when there is none yet)."""
    samples = (sample for family in families for sample in family.samples)
    return next((s.value for s in samples if s.name == name and s.labels == labels), 0.0)


async def snapshot_current() -> None:
    """This process's snapshot, as a web process holds it, holding what the test just made."""
    await snapshot.at_least(await sync_to_async(config_version)())


def schema_validator(schema: dict, path: str, method: str, status: str) -> Draft202012Validator:
    """A validator of one response's body against the served OpenAPI 3.1 schema (its $refs resolved in it)."""
    registry = Registry().with_resource("urn:api", Resource.from_contents(schema, default_specification=DRAFT202012))
    pointer = f"/paths/{path.replace('/', '~1')}/{method}/responses/{status}/content/application~1json/schema"
    return Draft202012Validator({"$ref": f"urn:api#{pointer}"}, registry=registry)


def server_pid(said: str) -> int:
    """The host's id of the process whose demo `pid` tool said `said` ("2 pid:[4026532612]": its id in its PID
    namespace, and that namespace; a sandboxed server cannot know its id outside)."""
    pid, namespace = said.split()
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if os.readlink(entry / "ns/pid") != namespace:
                continue
            status = (entry / "status").read_text()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        ids = next(line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:"))
        if ids[-1] == pid:
            return int(entry.name)
    raise LookupError(f"no process is {said}")


def with_pool(spec: UpstreamSpec, body: Callable[[UpstreamPool], Awaitable[Any]], **options: Any) -> Any:
    """Run `body` against a serving pool whose only upstream is `spec` (`options`: the pool's listeners), then stop
    the pool."""

    async def load_spec(upstream_id: int, person: dict | None = None, catalog: bool = False) -> UpstreamSpec:
        return spec

    async def scenario() -> Any:
        pool = UpstreamPool(load_spec, **options)
        try:
            async with anyio.create_task_group() as tg:
                await tg.start(pool.serve)
                try:
                    return await body(pool)
                finally:
                    tg.cancel_scope.cancel()
        finally:
            await transports_settle()

    return anyio.run(scenario)


async def transports_settle() -> None:
    """Let the loop finish closing what a stopped pool left (a killed server's transport closes in callbacks the
    loop has yet to run) and collect it while the loop runs: else its __del__ ran later, in another test, on a
    closed loop (and inside ast.parse, CPython 3.11 then raised SystemError)."""
    for _ in range(10):
        await anyio.lowlevel.checkpoint()
    gc.collect()


@contextmanager
def new_database(server_env: dict[str, str], suffix: str, sqlite_dir: Path) -> Iterator[dict[str, str]]:
    """The environment of a process whose database is new and empty (not migrated); dropped after."""
    if "DATABASE_URL" not in server_env:
        yield server_env | {"SQLITE_PATH": str(sqlite_dir / f"{suffix}.sqlite3")}
        return
    url = urlsplit(server_env["DATABASE_URL"])
    name, admin = f"{url.path.lstrip('/')}_{suffix}", url._replace(path="/postgres").geturl()
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield server_env | {"DATABASE_URL": url._replace(path=f"/{name}").geturl()}
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextmanager
def own_redis(log: Path, *options: str, port: int = 0) -> Iterator[servers.Running]:
    """A redis-server of the test's own on a free port (or `port`, to start one again where it was)."""
    from tests.conftest import needs  # conftest imports this module

    needs(shutil.which("redis-server") is not None, "redis-server is not installed")
    port = port or servers.free_port()
    command = ["redis-server", "--port", str(port), "--save", "", "--appendonly", "no", *options]
    running = servers.Running(servers.start(command, dict(os.environ), log), log, f"redis://127.0.0.1:{port}")
    try:
        servers.wait_for_port(port, running.process, log)
        yield running
    finally:
        running.stop()
