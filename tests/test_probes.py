"""`/healthz` and `/readyz`: no credentials, no Host check, JSON bodies with nothing secret; readiness follows
the database (and its migrations) and Redis, reports live workers without requiring them, and turns 503 while a
process drains on SIGTERM, whose requests in flight still finish."""

import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import anyio
import httpx2
import pytest
from django.db.migrations.loader import MigrationLoader

from gateway_project import __version__
from tests import servers
from tests.clients import stateless_call
from tests.helpers import audit_mark, audit_since, eventually, new_database, orm, run
from tests.servers import ROOT

# Orchestrators probe a pod by its address, which is in no ALLOWED_HOSTS.
POD = {"Host": "10.1.2.3:8000"}


def probe(gateway, path: str) -> tuple[int, dict]:
    response = httpx2.get(f"{gateway.url}{path}", headers=POD, timeout=5)
    assert response.headers["content-type"] == "application/json"
    return response.status_code, response.json()


def both_probes(gateway) -> tuple[tuple[int, dict], tuple[int, dict]]:
    return probe(gateway, "/readyz"), probe(gateway, "/healthz")


def test_a_serving_gateway_is_alive_and_ready_without_credentials(inline_gateway):
    assert probe(inline_gateway, "/healthz") == (200, {"status": "ok"})
    assert probe(inline_gateway, "/readyz") == (
        200,
        {"checks": {"database": "ok", "redis": "ok"}, "version": __version__, "status": "ready"},
    )


def test_readiness_reports_live_celery_workers_and_stays_ready_without_them(celery_gateway, workerless_gateway):
    status, body = probe(celery_gateway, "/readyz")
    assert (status, body["status"]) == (200, "ready")
    assert body["workers"]["alive"] >= 1, "the test worker beats"
    # No worker listens on this gateway's broker: calls fail as EXECUTOR_UNAVAILABLE, the process stays in rotation.
    assert probe(workerless_gateway, "/readyz") == (
        200,
        {
            "checks": {"database": "ok", "redis": "ok"},
            "version": __version__,
            "workers": {"alive": 0},
            "status": "ready",
        },
    )


def test_a_gateway_whose_stores_are_unreachable_is_alive_but_not_ready(server_env, logs):
    nowhere = servers.free_port()
    env = server_env | {
        "DATABASE_URL": f"postgres://postgres@127.0.0.1:{nowhere}/switchboard",
        "REDIS_URL": f"redis://127.0.0.1:{nowhere}/0",
    }
    with servers.inline_gateway_with(env, logs / "gateway-no-stores.log") as gateway:
        alive, ready = probe(gateway, "/healthz"), probe(gateway, "/readyz")
    assert alive == (200, {"status": "ok"})
    unavailable = "no answer within 2 s"  # the pool waits for a connection longer than a probe
    assert ready == (
        503,
        {
            "checks": {"database": unavailable, "redis": "unavailable (ConnectionError)"},
            "version": __version__,
            "status": "unready",
        },
    )
    assert str(nowhere) not in str(ready), "no address in the answer"


def test_on_sigterm_a_gateway_turns_unready_finishes_its_call_in_flight_and_exits(server_env, world, logs):
    with servers.inline_gateway_with(server_env, logs / "gateway-drain.log") as gateway:
        mark = audit_mark()

        async def call_through_a_drain() -> tuple:
            outcome: list = []

            async def slow_call() -> None:
                # One request: a 2025-11-25 client would also DELETE its session, after the process is gone.
                outcome.append(await stateless_call(gateway.url, world.key, "demo__sleep", {"seconds": 2}))

            async with anyio.create_task_group() as tasks:
                tasks.start_soon(slow_call)
                with anyio.fail_after(5):
                    while not [row for row in await orm(lambda: audit_since(mark)) if row.kind == "approved"]:
                        await anyio.sleep(0.05)
                os.kill(gateway.process.pid, signal.SIGTERM)
                with anyio.fail_after(5):
                    while (states := await anyio.to_thread.run_sync(both_probes, gateway))[0][0] != 503:
                        await anyio.sleep(0.05)
            return states, outcome[0]

        (ready, alive), outcome = run(call_through_a_drain)
        assert ready == (
            503,
            {"checks": {"database": "ok", "redis": "ok"}, "version": __version__, "status": "draining"},
        )
        assert alive == (200, {"status": "draining"})
        assert outcome["result"]["isError"] is False, "the call in flight finished"
        exited = eventually(lambda: gateway.process.poll() is not None or None, timeout=10)
    assert exited
    assert "SIGTERM: draining 1 request(s) for up to 20 s" in gateway.log.read_text()


@pytest.fixture
def unmigrated_env(server_env, tmp_path) -> Iterator[dict[str, str]]:
    """A gateway's environment whose database exists but was never migrated."""
    with new_database(server_env, "unmigrated", tmp_path) as env:
        yield env


def not_migrated(missing: list[str]) -> str:
    more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
    return f"not migrated: {', '.join(missing[:3])}{more} not applied (run manage.py migrate)"


def test_a_gateway_on_a_database_not_migrated_is_alive_but_not_ready_naming_what_is_missing(unmigrated_env, logs):
    last = sorted(f"{app}.{name}" for app, name in MigrationLoader(None).graph.leaf_nodes())
    with servers.inline_gateway_with(unmigrated_env, logs / "gateway-unmigrated.log") as gateway:
        alive, before = probe(gateway, "/healthz"), probe(gateway, "/readyz")
        # Migrating one app (what an upgrade's migration job does, in part) is seen by the next probe.
        migrate = [sys.executable, "manage.py", "migrate", "sessions", "--verbosity", "0"]
        subprocess.run(migrate, env=unmigrated_env, cwd=ROOT, check=True, timeout=120)
        after = probe(gateway, "/readyz")
    assert alive == (200, {"status": "ok"})
    assert len(last) > 3 and "sessions.0001_initial" in last
    body = {"checks": {"database": not_migrated(last), "redis": "ok"}, "version": __version__, "status": "unready"}
    assert before == (503, body)
    last.remove("sessions.0001_initial")
    assert after == (503, body | {"checks": {"database": not_migrated(last), "redis": "ok"}})
