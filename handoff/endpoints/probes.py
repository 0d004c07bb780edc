"""`/healthz` and `/readyz`: what a load balancer or an orchestrator asks a web process. No credentials, no
Host check (probes name the pod's address), nothing secret in the answer, and cheap enough to ask every
second: `/healthz` touches nothing, `/readyz` makes one round trip to each store. A database that has not applied
the migrations this process's code needs is not ready either: it names them, so that new web processes wait for
the migration job of an upgrade while the old ones serve on.

On SIGTERM the process drains: `/readyz` answers 503 so that traffic moves elsewhere, it serves on for
GATEWAY_DRAIN_NOTICE_SECONDS while its balancer notices, requests to `/mcp` still running finish (for at most
GATEWAY_DRAIN_SECONDS), then the server's own shutdown runs."""

import asyncio
import functools
import json
import logging
import signal
from collections.abc import Awaitable, Callable
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connection
from django.db.migrations.loader import MigrationLoader
from django.db.migrations.recorder import MigrationRecorder

from gateway_project import __version__
from gateway_project.lib.database import BoundedRead, database_async
from gateway_project.lib.redis_clients import async_redis
from registry.worker import workers_alive

logger = logging.getLogger(__name__)
CHECK_SECONDS = 2.0  # a store slower than this to answer a probe counts as down

AsgiApp = Callable[[dict, Any, Any], Awaitable[None]]


class Drain:
    """This process's requests to `/mcp` in flight, and whether it is draining."""

    def __init__(self) -> None:
        self.draining = False
        self.started = asyncio.Event()  # set when the drain begins: streams that last as long as their client end
        self.in_flight = 0
        self._idle = asyncio.Event()
        self._watching = False

    def watch(self) -> None:
        """Put the drain in front of the server's own SIGTERM handler (Daphne's or uvicorn's), which runs
        after it. Called from requests: the server installs its handler when it starts serving."""
        if self._watching:
            return
        self._watching = True
        loop = asyncio.get_running_loop()
        previous = signal.getsignal(signal.SIGTERM)

        def server_shutdown() -> None:
            if callable(previous):
                previous(signal.SIGTERM, None)
            else:
                raise SystemExit(0)

        try:
            loop.add_signal_handler(signal.SIGTERM, lambda: loop.create_task(self.begin(server_shutdown)))
        except (ValueError, RuntimeError):  # an event loop outside the main thread (an embedding test harness)
            logger.info("SIGTERM stops this process without a drain: its event loop is not the main thread's")

    def tracked(self, app: AsgiApp) -> AsgiApp:
        async def counted(scope: dict, receive: Any, send: Any) -> None:
            self.watch()
            if scope.get("method") != "POST":  # GET streams last as long as their client: they are not work
                return await app(scope, receive, send)
            self.in_flight += 1
            self._idle.clear()
            try:
                await app(scope, receive, send)
            finally:
                self.in_flight -= 1
                if not self.in_flight:
                    self._idle.set()

        return counted

    async def begin(self, then: Callable[[], None]) -> None:
        self.draining = True
        self.started.set()
        logger.warning("SIGTERM: draining %d request(s) for up to %g s", self.in_flight, settings.GATEWAY_DRAIN_SECONDS)
        # A balancer that probes /readyz sends requests here until its next probe: they are served, not refused.
        await asyncio.sleep(settings.GATEWAY_DRAIN_NOTICE_SECONDS)
        if self.in_flight:
            try:
                await asyncio.wait_for(self._idle.wait(), settings.GATEWAY_DRAIN_SECONDS)
            except TimeoutError:
                logger.warning("drain time is up with %d request(s) in flight", self.in_flight)
        then()


drain = Drain()


async def _state(read: BoundedRead, judge: Callable[[Any], str] = lambda _: "ok") -> str:
    try:
        answer = await read()
    except TimeoutError:
        return f"no answer within {CHECK_SECONDS:g} s"
    except Exception as exc:  # the kind only: a message may name hosts or users
        return f"unavailable ({type(exc).__name__})"
    return judge(answer)


@functools.cache
def _last_migrations() -> frozenset[tuple[str, str]]:
    """Each app's last migration on disk: read once (0.1 s), as a running process's code does not change."""
    return frozenset(MigrationLoader(None, ignore_no_migrations=True).graph.leaf_nodes())


def _migrations_missing() -> list[str]:
    """The last migrations this code needs that the database has not applied, in one round trip: all of them
    where migrate never ran (no table of migrations)."""
    needed = _last_migrations()
    recorder = MigrationRecorder(connection)
    try:
        applied = set(recorder.migration_qs.filter(app__in={app for app, _ in needed}).values_list("app", "name"))
    except DatabaseError:
        if recorder.has_table():
            raise
        applied = set()
    return sorted(f"{app}.{name}" for app, name in needed - applied)


def _migrated(missing: list[str]) -> str:
    if not missing:
        return "ok"
    more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
    return f"not migrated: {', '.join(missing[:3])}{more} not applied (run manage.py migrate)"


# A check still waiting on a dead store (a connection pool waits its own timeout) is awaited again by the next
# probe rather than doubled, so probing a dead store every second piles up nothing.
database_check = BoundedRead(database_async(_migrations_missing), CHECK_SECONDS)
redis_check = BoundedRead(lambda: async_redis().ping(), CHECK_SECONDS)


async def readiness() -> tuple[int, dict[str, Any]]:
    checks = {"database": await _state(database_check, _migrated)}
    body: dict[str, Any] = {"checks": checks, "version": __version__}
    if settings.REDIS_URL:
        checks["redis"] = await _state(redis_check)
    if settings.GATEWAY_EXECUTOR == "celery" and checks.get("redis") == "ok":
        # Reported, not required: with no worker, calls fail as EXECUTOR_UNAVAILABLE, which beats taking
        # every web process out of rotation.
        body["workers"] = {"alive": await workers_alive()}
    ready = all(state == "ok" for state in checks.values())
    body["status"] = "draining" if drain.draining else "ready" if ready else "unready"
    return (200 if ready and not drain.draining else 503), body


async def _answer(send: Any, status: int, body: dict[str, Any]) -> None:
    headers = [(b"content-type", b"application/json"), (b"cache-control", b"no-store")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": json.dumps(body).encode()})


async def healthz_app(scope: dict, receive: Any, send: Any) -> None:
    drain.watch()
    await _answer(send, 200, {"status": "draining" if drain.draining else "ok"})


async def readyz_app(scope: dict, receive: Any, send: Any) -> None:
    drain.watch()
    await _answer(send, *await readiness())
