"""Shared fixtures. The database is the one pytest-django creates; the gateways under test are real
Daphne processes reading it, so data made here is committed (no per-test transactions) and visible there."""

import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis
from django.db import connections
from playwright.sync_api import Browser, sync_playwright

from tests import servers
from tests.otlp import Receiver, otlp_receiver

REQUIRE_SERVICES = os.environ.get("SWITCHBOARD_REQUIRE_SERVICES") == "1"
TRIAGE_TOPICS = {
    "money": "mcp://finance.specialists:9000",
    "infrastructure": "devops",
    "payroll": "hr",
    "clock": "time",
}
BIN = Path(sys.executable).parent


# A test is end to end (marked `e2e`) when it needs a live process: a gateway, worker, specialist, upstream
# server or browser that a fixture starts (every such fixture takes `server_env`, `everything_http` or `logs`,
# but for Chromium's `browser`), one that a fixture starts for some of its parameters only (it takes the
# process's fixture by name: LIVE_PARAMETERS), or one the test starts itself (those modules say so with
# `pytestmark = pytest.mark.e2e`). `scripts/test -m "not e2e"` runs the rest in-process, against the real
# PostgreSQL and Redis, in under a minute; there, a test that starts a process anyway fails (tests/servers.py).
LIVE_PROCESS_FIXTURES = frozenset({"server_env", "everything_http", "logs", "browser"})
LIVE_PARAMETERS = {"gateway": {"inline", "celery"}, "admin_executor": {"celery"}}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        params = item.callspec.params if hasattr(item, "callspec") else {}
        if LIVE_PROCESS_FIXTURES.intersection(getattr(item, "fixturenames", ())) or any(
            params.get(name) in values for name, values in LIVE_PARAMETERS.items()
        ):
            item.add_marker(pytest.mark.e2e)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before the test's fixtures: only an e2e test may start a process through tests/servers.py."""
    servers.allow_processes(item.get_closest_marker("e2e") is not None)


def needs(condition: bool, reason: str) -> None:
    """Skip without a service, or fail where CI demands every service."""
    if not condition:
        if REQUIRE_SERVICES:
            pytest.fail(f"SWITCHBOARD_REQUIRE_SERVICES=1 but {reason}")
        pytest.skip(reason)


@pytest.fixture(scope="session")
def db(django_db_setup, django_db_blocker, shared_state) -> Iterator[None]:
    """The test database, and a clean Redis beside it (shared_state) even where no process fixture runs (the
    fast tier): state an earlier run left in Redis would name rows the new database reuses."""
    from django.core.management import call_command
    from django.db import connections

    call_command("static_ready", verbosity=0)  # the console's pages name their static files by the manifest
    with django_db_blocker.unblock():
        yield
        # Connections of this process's other threads (client scenarios', sync_to_async's) would otherwise
        # keep the test database from being dropped, after PostgreSQL waited 5 s for them to leave.
        if connections["default"].vendor == "postgresql":
            with connections["default"].cursor() as cursor:
                cursor.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
        for connection in connections.all(initialized_only=True):
            connection.close()
            if getattr(connection, "pool", None) is not None:  # PostgreSQL's; SQLite has none
                connection.close_pool()


@pytest.fixture(scope="session")
def logs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("logs")


@pytest.fixture(scope="session")
def shared_state() -> None:
    """A clean Redis database: breakers, rate windows and group locks of an earlier run name rows that the
    new test database reuses."""
    if os.environ.get("REDIS_URL"):
        redis.Redis.from_url(os.environ["REDIS_URL"]).flushdb()


@pytest.fixture(scope="session")
def server_env(db, shared_state) -> dict[str, str]:
    """The environment of every process under test: same database, same Redis, same secret."""
    from django.conf import settings
    from django.db import connection

    env = {k: v for k, v in os.environ.items() if k != "GATEWAY_EXECUTOR"}
    env |= {"DJANGO_SETTINGS_MODULE": "gateway_project.settings", "SECRET_KEY": settings.SECRET_KEY}
    env |= {"GATEWAY_CREDENTIAL_KEYS": ",".join(settings.GATEWAY_CREDENTIAL_KEYS)}
    env |= {"GATEWAY_EGRESS_ALLOWED_NETWORKS": ",".join(settings.GATEWAY_EGRESS_ALLOWED_NETWORKS)}
    env |= {
        "GATEWAY_DELEGATION_KEYS": settings.GATEWAY_DELEGATION_KEYS,
        "GATEWAY_AUDIT_KEYS": settings.GATEWAY_AUDIT_KEYS,
    }
    # The example Python triage tool, routing topics to the test specialists (and to two bad targets).
    env |= {"GATEWAY_EXTRA_APPS": "examples.triage_app", "TRIAGE_TOPICS": json.dumps(TRIAGE_TOPICS)}
    env |= {"GATEWAY_HANDOFF_SWEEP_SECONDS": "0.5"}
    name = connection.settings_dict["NAME"]
    if connection.vendor == "sqlite":
        env.pop("DATABASE_URL", None)
        env["SQLITE_PATH"] = str(name)
    else:
        env["DATABASE_URL"] = urlsplit(os.environ["DATABASE_URL"])._replace(path=f"/{name}").geturl()
    return env


@pytest.fixture(scope="session")
def everything_http(logs) -> Iterator[str]:
    needs(servers.EVERYTHING_JS.exists(), "npm packages are not installed (run: npm ci)")
    running = servers.start_everything("streamableHttp", logs / "everything.log")
    yield running.url
    running.stop()


@dataclass
class World:
    key: str  # alice, an enabled agent
    disabled_key: str  # mallory, whose agent is disabled
    upstreams: dict[str, int]


@pytest.fixture(scope="session")
def world(db, everything_http) -> World:
    """Agents and upstreams every gateway test shares: mcp-server-time and the demo server over stdio,
    server-everything over Streamable HTTP, and a demo server with a one-second timeout."""
    from policy.services import agent_create, agent_set_enabled
    from registry.models import Upstream
    from registry.services import upstream_catalog_sync, upstream_save
    from tests.factories import DEMO, demo_sandbox, stdio_upstream

    alice = agent_create(name="alice")
    mallory = agent_create(name="mallory")
    agent_set_enabled(agent=mallory.agent, enabled=False)
    made = [
        stdio_upstream("time", str(BIN / "mcp-server-time"), ["--local-timezone", "UTC"]),
        stdio_upstream("demo", sys.executable, DEMO, sandbox=demo_sandbox()),
        # Its timeouts are the point of the tests that use it: they must not open its circuit.
        stdio_upstream("slow", sys.executable, DEMO, timeout=1.0, breaker_failures=1000, sandbox=demo_sandbox()),
    ]
    every = Upstream(slug="every", transport="streamable_http", url=everything_http)
    upstream_save(upstream=every, created=True)
    assert upstream_catalog_sync(upstream=every).ok
    made.append(every)
    return World(key=alice.key, disabled_key=mallory.key, upstreams={u.slug: u.id for u in made})


@pytest.fixture(scope="session")
def traces() -> Iterator[Receiver]:
    """Where the shared gateways and worker export their spans, a call's stages among them (tests/otlp.py)."""
    with otlp_receiver() as receiver:
        yield receiver


@pytest.fixture(scope="session")
def traced_env(server_env, traces) -> dict[str, str]:
    """The environment of the shared gateways and worker: spans exported at once (not every 5 s) to `traces`."""
    return server_env | {"OTEL_EXPORTER_OTLP_ENDPOINT": traces.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100"}


@pytest.fixture(scope="session")
def inline_gateway(traced_env, world, logs) -> Iterator[servers.Running]:
    running = servers.start_gateway(traced_env | {"GATEWAY_EXECUTOR": "inline"}, logs / "gateway-inline.log")
    running.executor_pid = running.process.pid
    yield running
    running.stop()


@pytest.fixture(scope="session")
def short_window_gateway(server_env, world, logs) -> Iterator[servers.Running]:
    """An embedded-default gateway whose stateless keys' windows last 5 s (GATEWAY_STATELESS_WINDOW_SECONDS): long
    enough for the tests' few calls to fall inside one on a slow machine (at 2 s, 4 calls did not, on 2026-11-26)."""
    with servers.inline_gateway_with(
        server_env, logs / "gateway-short-window.log", GATEWAY_STATELESS_WINDOW_SECONDS="5"
    ) as running:
        yield running


@pytest.fixture(scope="session")
def celery_worker(traced_env, logs) -> Iterator[servers.Running]:
    needs(bool(os.environ.get("REDIS_URL")), "REDIS_URL is not set: no Redis, so no Celery executor")
    running = servers.start_worker(traced_env | {"GATEWAY_EXECUTOR": "celery"}, logs / "worker.log")
    yield running
    running.stop()


@pytest.fixture(scope="session")
def celery_gateway(traced_env, world, celery_worker, logs) -> Iterator[servers.Running]:
    """In Celery mode the web process seals credentials but never opens one: it holds the public key only."""
    running = servers.start_gateway(servers.web_env(traced_env, "celery"), logs / "gateway-celery.log")
    running.executor_pid = celery_worker.process.pid
    yield running
    running.stop()


@pytest.fixture(scope="session")
def workerless_gateway(server_env, world, logs) -> Iterator[servers.Running]:
    """A Celery gateway whose broker no worker listens on (another Redis database): workers down."""
    needs(bool(os.environ.get("REDIS_URL")), "REDIS_URL is not set: no Redis, so no Celery executor")
    broker = urlsplit(os.environ["REDIS_URL"])._replace(path="/13").geturl()
    env = server_env | {"GATEWAY_EXECUTOR": "celery", "REDIS_URL": broker, "GATEWAY_CONNECT_TIMEOUT": "1"}
    running = servers.start_gateway(env, logs / "gateway-workerless.log")
    yield running
    running.stop()
    redis.Redis.from_url(broker).flushdb()  # the expired task nobody took


@dataclass
class Specialists:
    finance: servers.Running
    devops: servers.Running


@pytest.fixture(scope="session")
def specialists(server_env, world, inline_gateway, logs) -> Iterator[Specialists]:
    """Two guarded specialists (examples/specialist_server.py): `finance`, reached through an admin route,
    and `devops`, reached through the example Python triage tool. Large carried state is redeemed from a
    gateway (any process serves it: the claim-check store is shared)."""
    from tests.factories import specialist_register

    running = Specialists(
        servers.start_specialist("finance", server_env, inline_gateway.url, logs / "finance.log"),
        servers.start_specialist("devops", server_env, inline_gateway.url, logs / "devops.log"),
    )
    with (
        specialist_register("finance", running.finance.url, route=True),
        specialist_register("devops", running.devops.url),
    ):
        yield running
    running.finance.stop()
    running.devops.stop()


@pytest.fixture
def isolated_celery(server_env, world, specialists, logs):
    """A Celery gateway and a worker of their own (another Redis database as broker and store), so that
    killing the worker harms no other test."""
    needs(bool(os.environ.get("REDIS_URL")), "REDIS_URL is not set: no Redis, so no Celery executor")
    own_redis = urlsplit(os.environ["REDIS_URL"])._replace(path="/12").geturl()
    env = server_env | {"GATEWAY_EXECUTOR": "celery", "REDIS_URL": own_redis}
    worker = servers.start_worker(env, logs / "worker-isolated.log")
    gateway = servers.start_gateway(env, logs / "gateway-isolated.log")
    yield gateway, worker
    gateway.stop()
    worker.stop()
    redis.Redis.from_url(own_redis).flushdb()


@pytest.fixture(params=["inline", "celery"])
def gateway(request) -> servers.Running:
    """The same test against both executors."""
    return request.getfixturevalue(f"{request.param}_gateway")


@pytest.fixture
def admin_client(db):
    """A logged-in superuser, "operator", on Django's test client."""
    from django.contrib.auth import get_user_model
    from django.test import Client

    user = get_user_model().objects.create_superuser("operator", password="pw-for-tests-only")
    client = Client()
    client.force_login(user)
    yield client
    user.delete()


@pytest.fixture(params=["inline", "celery"])
def admin_executor(request, settings):
    """The admin's own process runs catalog syncs and console calls through either executor (Celery: the
    test worker's)."""
    from registry.executor import get_executor

    if request.param == "celery":
        request.getfixturevalue("celery_worker")
    settings.GATEWAY_EXECUTOR = request.param
    get_executor.cache_clear()
    yield request.param
    get_executor.cache_clear()


@pytest.fixture
def admin_token(admin_client) -> str:
    """A REST API token of admin_client's superuser, "operator"."""
    from django.contrib.auth import get_user_model

    from policy.services import admin_token_issue

    return admin_token_issue(user=get_user_model().objects.get(username="operator"), actor="tests")


@pytest.fixture(scope="module")
def people(db) -> Iterator[str]:
    """The agent people signed in at the tests' IdP act as (tests/idp.py)."""
    from tests.factories import agent

    with agent("oidc-people", calls_per_minute=2) as (someone, _key):  # for each person (see the rate test)
        yield someone.name


@pytest.fixture(scope="module")
def idp_gateway(server_env, world, people, logs) -> Iterator[tuple]:
    """The tests' IdP (npm's oidc-provider) and an embedded-default gateway that trusts it, the console too."""
    from tests.idp import CLIENTS, CONSOLE_SECRET, Idp, private_jwk

    port = servers.free_port()
    resource = f"http://127.0.0.1:{port}/mcp"
    key, jwk = private_jwk("idp-1")
    console = {"client_id": "console", "client_secret": CONSOLE_SECRET, "grant_types": ["authorization_code"]}
    console |= {"redirect_uris": [f"http://127.0.0.1:{port}/oidc/callback/"], "response_types": ["code"]}
    clients = [*CLIENTS, console]
    groups = logs / "idp-groups.json"
    groups.write_text("{}")
    provider = servers.start_oidc_provider(resource, {"keys": [jwk]}, clients, logs / "oidc-provider.log", groups)
    settings = {"GATEWAY_OIDC_ISSUER": provider.url, "GATEWAY_OIDC_AGENT": people, "GATEWAY_OIDC_SCOPES": "mcp"}
    settings |= {"GATEWAY_CONSOLE_OIDC_CLIENT_ID": "console", "GATEWAY_CONSOLE_OIDC_CLIENT_SECRET": CONSOLE_SECRET}
    try:
        with servers.inline_gateway_with(server_env, logs / "gateway-oidc.log", port, **settings) as gateway:
            yield Idp(provider.url, resource, key, groups), gateway
    finally:
        provider.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Debian's Chromium through Playwright, for the console's pages."""
    needs(servers.CHROMIUM.exists(), "Chromium is not installed (apt-get install chromium)")
    # Playwright's sync API keeps an event loop on this thread; the ORM calls made here are still plain
    # blocking calls, which Django would otherwise refuse beside a loop.
    with pytest.MonkeyPatch.context() as patch, sync_playwright() as playwright:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        launched = playwright.chromium.launch(executable_path=str(servers.CHROMIUM), args=servers.CHROMIUM_ARGS)
        yield launched
        launched.close()
        connections.close_all()  # the ones opened beside Playwright's loop are not the session's to close
