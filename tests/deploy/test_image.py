"""The image (Containerfile, built by scripts/image) run with podman, on the host's network against this machine's
PostgreSQL (a database of its own) and Redis: a web process serves /healthz and, on a database not migrated,
/readyz 503 naming the migrations; the migrate command makes it ready; a worker runs a stdio upstream in its
bubblewrap sandbox and the official SDK client's call through the web process is answered and audited. The
container warns when its root file system is writable.

Building the image takes minutes (debootstrap, then the build: docs/deploy.md): these run only with
SWITCHBOARD_IMAGE_TESTS=1, where podman is installed, as root (the keys' files are given to the image's user)."""

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx2
import psycopg
import pytest
import redis
from django.db.migrations.loader import MigrationLoader

from gateway_project import __version__
from tests.clients import call, tool_names
from tests.conftest import needs
from tests.helpers import eventually, run, until
from tests.servers import free_port
from tests.test_probes import not_migrated

ROOT = Path(__file__).resolve().parents[2]
IMAGE = "localhost/switchboard:latest"
IMAGE_USER = 10001  # the Containerfile's
START_SECONDS = 60  # a container's Django start-up on a shared two-core machine, with margin
WRITABLE_ROOT = "switchboard: warning: the root file system is writable"

# These tests and tests/deploy/test_compose.py: opt-in, as building the image takes minutes (docs/deploy.md).
IMAGE_TESTS = [
    pytest.mark.e2e,
    pytest.mark.skipif(shutil.which("podman") is None, reason="podman is not installed"),
    pytest.mark.skipif(
        not os.environ.get("SWITCHBOARD_IMAGE_TESTS"),
        reason="SWITCHBOARD_IMAGE_TESTS is not set: building the image takes minutes",
    ),
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: rootful podman, keys chowned to the image's user"),
]
pytestmark = IMAGE_TESTS


@pytest.fixture(scope="module")
def image() -> str:
    subprocess.run([ROOT / "scripts" / "image"], cwd=ROOT, check=True, timeout=1800, stdout=subprocess.DEVNULL)
    return IMAGE


def image_redis_url() -> str:
    """A Redis database of the image's own (8: the tests' own take 9 to 15): on REDIS_URL's, the suite's Celery
    worker would take the image's tasks and answer them with its own task key."""
    return urlsplit(os.environ["REDIS_URL"])._replace(path="/8").geturl()


@pytest.fixture(scope="module")
def database_url() -> Iterator[str]:
    """A database of the image's own beside the tests' (theirs, with `_image`), empty."""
    needs(bool(os.environ.get("DATABASE_URL", "").startswith("postgres")), "DATABASE_URL is not PostgreSQL")
    needs(bool(os.environ.get("REDIS_URL")), "REDIS_URL is not set")
    parts = urlsplit(os.environ["DATABASE_URL"])
    name = parts.path.lstrip("/") + "_image"
    admin = urlunsplit(parts._replace(path="/postgres"))

    def recreate(create: bool) -> None:
        with psycopg.connect(admin, autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            if create:
                connection.execute(f'CREATE DATABASE "{name}"')

    recreate(True)
    yield urlunsplit(parts._replace(path=f"/{name}"))
    recreate(False)
    redis.Redis.from_url(image_redis_url()).flushdb()  # the image's queues and replies


@pytest.fixture(scope="module")
def keys(tmp_path_factory, database_url) -> Path:
    """A set from `manage.py keys_make`, and the database's URL, as files the image's user may read."""
    directory = tmp_path_factory.mktemp("keys") / "switchboard"
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE")}
    env["SWITCHBOARD_VAR_DIR"] = str(tmp_path_factory.mktemp("var"))
    command = [ROOT / ".venv" / "bin" / "python", "manage.py", "keys_make", directory]
    subprocess.run(command, cwd=ROOT, env=env, check=True, capture_output=True, timeout=60)
    (directory / "database_url").write_text(database_url)
    for path in [directory, *directory.iterdir()]:
        os.chown(path, IMAGE_USER, IMAGE_USER)
    return directory


def container_args(keys: Path, *extra_env: str) -> list[str]:
    """What every process of the test's stack is run with: the host's network, a read-only root, the keys."""
    secrets = "/run/secrets/switchboard"
    env = {
        "DATABASE_URL_FILE": f"{secrets}/database_url",
        "REDIS_URL": image_redis_url(),
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
        "SECRET_KEY_FILE": f"{secrets}/secret_key",
        "GATEWAY_DELEGATION_KEYS_FILE": f"{secrets}/delegation_keys",
        "GATEWAY_AUDIT_KEYS_FILE": f"{secrets}/audit_keys",
        "GATEWAY_TASK_KEY_FILE": f"{secrets}/task_key",
        # Every process, while the built-in authorization server is on (the default): the settings read it.
        "GATEWAY_AUTH_SIGNING_KEY_FILE": f"{secrets}/auth_signing_key.pem",
    }
    args = ["--network", "host", "--read-only", "--tmpfs", "/tmp", "-v", f"{keys}:{secrets}:ro"]
    return args + [f"--env={k}={v}" for k, v in env.items()] + [f"--env={e}" for e in extra_env]


SEALING = ("GATEWAY_CREDENTIAL_PUBLIC_KEY_FILE=/run/secrets/switchboard/credential_public_key",)


def podman_run(image: str, keys: Path, *command: str, env: tuple[str, ...] = SEALING, options: tuple = ()) -> str:
    """A one-shot command in the image; its output (stdout)."""
    args = ["podman", "run", "--rm", *container_args(keys, *env), *options, image, *command]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.fixture
def started(image, keys) -> Iterator:
    """start(role, *env, options=()): a detached container of the image, removed at the end of the test."""
    names: list[str] = []

    def start(role: str, *env: str, options: tuple = ()) -> str:
        name = f"switchboard-test-{role}-{free_port()}"
        args = ["podman", "run", "-d", "--name", name, *container_args(keys, *env), *options, image, role]
        subprocess.run(args, check=True, capture_output=True, timeout=60)
        names.append(name)
        return name

    yield start
    for name in names:
        subprocess.run(["podman", "rm", "-f", "-t", "0", name], capture_output=True, timeout=60)


@pytest.fixture
def web(started) -> str:
    """A web process of the image on a free port of the host; its base URL once /healthz answers."""
    port = free_port()
    name = started("web", *SEALING, f"PORT={port}")
    url = f"http://127.0.0.1:{port}"
    try:
        eventually(lambda: answer(f"{url}/healthz") == 200, timeout=START_SECONDS)
    except AssertionError:
        raise AssertionError(container_logs(name)) from None
    return url


def container_logs(name: str) -> str:
    return subprocess.run(["podman", "logs", "--tail", "30", name], capture_output=True, text=True).stderr


def answer(url: str) -> int | None:
    try:
        return httpx2.get(url, timeout=2).status_code
    except httpx2.TransportError:  # not listening yet
        return None


def test_the_image_is_labelled_runs_as_its_user_checks_its_health_and_holds_no_key(image):
    (inspected,) = json.loads(subprocess.run(["podman", "image", "inspect", image], capture_output=True).stdout)
    config = inspected["Config"]
    labels = config["Labels"]
    assert labels["org.opencontainers.image.version"] == __version__
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
    remote = subprocess.run(["git", "config", "--get", "remote.origin.url"], cwd=ROOT, capture_output=True, text=True)
    # scripts/image names the clone's remote: a path as a file URL, a URL without any credentials; without a
    # remote, the checkout's own path.
    source = remote.stdout.strip() or str(ROOT)
    assert labels["org.opencontainers.image.source"] == (f"file://{source}" if source.startswith("/") else source)
    assert config["User"] == f"{IMAGE_USER}:{IMAGE_USER}" and "/healthz" in " ".join(inspected["Healthcheck"]["Test"])
    listing = subprocess.run(["podman", "run", "--rm", image, "ls", "-A", "/app/var"], capture_output=True, text=True)
    assert listing.stdout.split() == ["static"]


def test_the_image_warns_when_its_root_is_writable_and_not_when_read_only(image):
    writable = subprocess.run(["podman", "run", "--rm", image, "true"], capture_output=True, text=True, timeout=60)
    read_only = subprocess.run(
        ["podman", "run", "--rm", "--read-only", image, "true"], capture_output=True, text=True, timeout=60
    )
    assert writable.returncode == read_only.returncode == 0
    assert WRITABLE_ROOT in writable.stderr and WRITABLE_ROOT not in read_only.stderr


def test_the_default_image_has_no_code_mode_and_says_so(image):
    run = ["podman", "run", "--rm", "--read-only", "--tmpfs", "/tmp", "-e", "SWITCHBOARD_VAR_DIR=/tmp/var", image]
    checked = subprocess.run([*run, "python", "manage.py", "check"], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0 and "(switchboard.I001) code mode is not installed here" in checked.stderr
    refused = subprocess.run(
        [*run[:-1], "-e", "GATEWAY_CODE_MODE=on", image, "python", "manage.py", "check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 1
    assert (
        refused.stderr.strip()
        .splitlines()[-1]
        .endswith(
            "GATEWAY_CODE_MODE is 'on', but code mode is not installed here (deno and numpy missing): run the image's "
            "`full` target (docs/deploy.md), or set GATEWAY_CODE_MODE to 'off'"
        )
    )


def test_web_is_live_but_not_ready_until_the_migrate_command_has_run(image, keys, web):
    readiness = httpx2.get(f"{web}/readyz", timeout=5)
    last = sorted(f"{app}.{name}" for app, name in MigrationLoader(None).graph.leaf_nodes())
    assert readiness.status_code == 503 and readiness.json()["status"] == "unready"
    assert readiness.json()["checks"] == {"database": not_migrated(last), "redis": "ok"}
    assert httpx2.get(f"{web}/healthz", timeout=5).status_code == 200
    podman_run(image, keys, "migrate")
    eventually(lambda: answer(f"{web}/readyz") == 200, timeout=10)


def test_a_call_through_the_image_runs_in_a_sandboxed_stdio_server_on_a_worker_and_is_audited(
    image, keys, web, started, database_url, tmp_path
):
    podman_run(image, keys, "migrate")
    sandbox = ("--security-opt", "seccomp=unconfined", "--security-opt", "unmask=/proc/*")
    worker = started("worker", "GATEWAY_CREDENTIAL_KEYS_FILE=/run/secrets/switchboard/credential_key", options=sandbox)
    config = tmp_path / "mcp.json"
    config.write_text(
        json.dumps({"mcpServers": {"time": {"command": "/app/.venv/bin/python", "args": ["-m", "mcp_server_time"]}}})
    )
    mount = ("-v", f"{config}:/config/mcp.json:ro")
    podman_run(image, keys, "python", "manage.py", "import_mcp_config", "/config/mcp.json", options=mount)
    key = podman_run(image, keys, "python", "manage.py", "create_agent", "image-tester").strip()

    async def scenario():
        await until(lambda: _offers(web, key), timeout=10)
        return await call(web, key, "time__get_current_time", {"timezone": "Europe/Paris"})

    result = run(scenario)
    assert not result.is_error and json.loads(result.content[0].text)["timezone"] == "Europe/Paris"
    with psycopg.connect(database_url) as connection:
        rows = connection.execute(
            "SELECT kind, outcome FROM audit_auditevent WHERE agent_name = %s AND tool = %s ORDER BY id",
            ("image-tester", "get_current_time"),
        ).fetchall()
    assert rows == [("approved", ""), ("completed", "ok")]
    # The server stays up between calls, in its sandbox: bwrap is among the worker container's processes.
    processes = subprocess.run(["podman", "exec", worker, "sh", "-c", "cat /proc/[0-9]*/comm"], capture_output=True)
    assert "bwrap" in processes.stdout.decode().split()


async def _offers(web: str, key: str) -> bool:
    return "time__get_current_time" in await tool_names(web, key)
