"""deploy/compose.yaml brought up with podman-compose: PostgreSQL, Redis, the migration first, two web processes
behind HAProxy, a worker and beat, each gateway process read-only with its keys as Compose secrets. The official
store and balancer images cannot be pulled here: tests/deploy/substitutes stands in for them (Debian's packages on
the same base). The official SDK client's call through HAProxy runs on the worker and is audited.

Like tests/deploy/test_image.py: only with SWITCHBOARD_IMAGE_TESTS=1, podman, and root."""

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx2
import pytest

from tests.clients import call, sdk_client, tool_names
from tests.deploy.test_image import IMAGE_TESTS, IMAGE_USER, answer
from tests.helpers import eventually, run, until
from tests.servers import free_port

ROOT = Path(__file__).resolve().parents[2]
SUBSTITUTES = Path(__file__).resolve().parent / "substitutes"
START_SECONDS = 180  # five gateway processes starting on a shared two-core machine, after the migration

pytestmark = IMAGE_TESTS


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[tuple[list[str], str]]:
    """The compose file, up: the podman-compose command that drives it, and HAProxy's URL."""
    subprocess.run([ROOT / "scripts" / "image"], cwd=ROOT, check=True, timeout=1800, stdout=subprocess.DEVNULL)
    build = ["podman", "build", "--runtime", "runc", "-q", "-t", "localhost/switchboard-substitutes:test", SUBSTITUTES]
    subprocess.run(build, check=True, timeout=900, stdout=subprocess.DEVNULL)
    project = tmp_path_factory.mktemp("compose")
    for name in ("compose.yaml", "haproxy.cfg"):
        shutil.copy(ROOT / "deploy" / name, project / name)
    make_keys(project / "keys")
    port = free_port()
    compose = [sys.executable, "-m", "podman_compose", "-p", f"switchboard-test-{port}"]
    compose += ["-f", str(project / "compose.yaml"), "-f", str(SUBSTITUTES / "compose.yaml")]
    env = os.environ | {"SWITCHBOARD_PORT": str(port)}
    try:
        # In the order the file's depends_on gives, each step with --no-deps: podman-compose 1.6 starts a dependant
        # with `podman run --requires`, which podman 4.3 refuses once the one-shot migration has exited.
        for services in (["postgres", "redis"], ["migrate"], ["web-1", "web-2", "worker", "beat", "haproxy"]):
            detach = [] if services == ["migrate"] else ["-d"]
            up = [*compose, "up", *detach, "--no-deps", *services]
            done = subprocess.run(up, env=env, capture_output=True, text=True, timeout=600)
            assert done.returncode == 0, done.stderr[-3000:]
        yield compose, f"http://127.0.0.1:{port}"
    finally:
        subprocess.run([*compose, "down", "-v", "-t", "0"], env=env, capture_output=True, timeout=300)


def make_keys(directory: Path) -> None:
    """What docs/deploy.md has a reader do: keys_make, a database password, its URL, owned by the image's user."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE")}
    env["SWITCHBOARD_VAR_DIR"] = str(directory.parent / "var")
    command = [ROOT / ".venv" / "bin" / "python", "manage.py", "keys_make", directory]
    subprocess.run(command, cwd=ROOT, env=env, check=True, capture_output=True, timeout=60)
    password = os.urandom(18).hex()
    (directory / "db_password").write_text(password)
    (directory / "database_url").write_text(f"postgres://switchboard:{password}@postgres/switchboard")
    for path in [directory, *directory.iterdir()]:
        os.chown(path, IMAGE_USER, IMAGE_USER)


def exec_in(compose: list[str], service: str, script: str, stdin: str = "") -> str:
    done = subprocess.run(
        [*compose, "exec", "-T", service, "sh", "-c", script], input=stdin, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_the_stack_comes_up_migrated_behind_haproxy_and_a_call_runs_on_the_worker_and_is_audited(stack):
    compose, url = stack
    eventually(lambda: answer(f"{url}/readyz") == 200, timeout=START_SECONDS)
    assert httpx2.get(f"{url}/readyz", timeout=5).json()["checks"] == {"database": "ok", "redis": "ok"}
    config = json.dumps(
        {"mcpServers": {"time": {"command": "/app/.venv/bin/python", "args": ["-m", "mcp_server_time"]}}}
    )
    imported = exec_in(
        compose, "web-1", "cat > /tmp/mcp.json && python manage.py import_mcp_config /tmp/mcp.json", config
    )
    assert "time: 2 added" in imported
    key = exec_in(compose, "web-2", "python manage.py create_agent compose-tester").strip()

    async def scenario():
        await until(lambda: _offers(url, key), timeout=10)
        return await call(url, key, "time__get_current_time", {"timezone": "Europe/Paris"})

    result = run(scenario)
    assert not result.is_error and json.loads(result.content[0].text)["timezone"] == "Europe/Paris"
    query = "SELECT kind, outcome FROM audit_auditevent WHERE agent_name = 'compose-tester' ORDER BY id"
    rows = exec_in(compose, "postgres", f'psql -U switchboard -d switchboard -tAF, -c "{query}"')
    assert "approved,\ncompleted,ok" in rows


async def _offers(url: str, key: str) -> bool:
    return "time__get_current_time" in await tool_names(url, key)


def _paris(result) -> bool:
    return not result.is_error and json.loads(result.content[0].text)["timezone"] == "Europe/Paris"


def _container(compose: list[str], service: str) -> str:
    """The id of the service's running container (podman-compose labels each with its project and service)."""
    project = compose[compose.index("-p") + 1]
    labels = [f"label=com.docker.compose.project={project}", f"label=com.docker.compose.service={service}"]
    done = subprocess.run(
        ["podman", "ps", "-q", "--no-trunc", *(f for label in labels for f in ("--filter", label))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done.stdout.strip()


def _audited(compose: list[str], agent: str) -> list[str]:
    kinds = "kind IN ('approved', 'completed')"
    query = f"SELECT kind || ',' || outcome FROM audit_auditevent WHERE agent_name = '{agent}' AND {kinds} ORDER BY id"
    return exec_in(compose, "postgres", f'psql -U switchboard -d switchboard -tA -c "{query}"').split()


def test_a_worker_killed_is_replaced_and_calls_run_on_its_replacement(stack):
    compose, url = stack
    eventually(lambda: answer(f"{url}/readyz") == 200, timeout=START_SECONDS)
    key = exec_in(compose, "web-1", "python manage.py create_agent compose-replacer").strip()
    killed = _container(compose, "worker")
    subprocess.run(["podman", "kill", "-s", "KILL", killed], check=True, capture_output=True, timeout=60)
    up = subprocess.run(
        [*compose, "up", "-d", "--no-deps", "--force-recreate", "worker"], capture_output=True, text=True, timeout=600
    )
    assert up.returncode == 0, up.stderr[-3000:]
    assert _container(compose, "worker") not in ("", killed)

    async def scenario():
        await until(lambda: _offers(url, key), timeout=30)
        return await call(url, key, "time__get_current_time", {"timezone": "Europe/Paris"})

    assert _paris(run(scenario))
    assert _audited(compose, "compose-replacer") == ["approved,", "completed,ok"]


def test_a_web_process_drained_leaves_rotation_while_a_session_carries_on_through_the_other(stack):
    compose, url = stack
    eventually(lambda: answer(f"{url}/readyz") == 200, timeout=START_SECONDS)
    key = exec_in(compose, "web-1", "python manage.py create_agent compose-drainer").strip()
    # It calls as fast as it can until web-1 has stopped (up to half a minute): past the default 600 a minute.
    unlimited = "a = Agent.objects.get(name='compose-drainer'); a.calls_per_minute = 100_000; a.save()"
    exec_in(compose, "web-1", f'python manage.py shell -c "from policy.models import Agent; {unlimited}"')
    web = _container(compose, "web-1")
    results = []

    async def scenario():
        await until(lambda: _offers(url, key), timeout=30)
        async with sdk_client(url, key, "legacy", timeout=30) as client:
            stopping = subprocess.Popen(["podman", "stop", "-t", "30", web], stdout=subprocess.DEVNULL)
            try:  # calls in the one session, before, while and after web-1 drains and stops
                while stopping.poll() is None or len(results) < 20:
                    results.append(await client.call_tool("time__get_current_time", {"timezone": "Europe/Paris"}))
            finally:
                await anyio.to_thread.run_sync(stopping.wait)
            return stopping.returncode

    try:
        assert run(scenario) == 0
        assert all(_paris(result) for result in results) and len(results) >= 20
        rows = _audited(compose, "compose-drainer")
        assert rows.count("approved,") == rows.count("completed,ok") == len(results)
    finally:
        subprocess.run(["podman", "start", web], capture_output=True, timeout=120)
