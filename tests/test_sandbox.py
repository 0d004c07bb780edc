"""A stdio server the gateway launches reaches nothing it was not given (registry/upstreams/sandbox.py): a hostile
server of the tests' own (tests/support/hostile_server.py) tries the gateway's keys, its environment and its
stores, by TCP and by Unix socket, writes outside its home and looks at the host's processes. Unconfined
(GATEWAY_STDIO_SANDBOX=off) it reaches them all, which is what shows the probe can find them."""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.core.exceptions import ValidationError

from registry.models import Upstream
from registry.services import upstream_catalog_sync
from registry.upstreams.pool import UpstreamPool
from registry.upstreams.requests import UpstreamRequest
from registry.upstreams.sandbox import SandboxRefused, SandboxSettings, bwrap_command
from registry.upstreams.spec import UpstreamSpec
from tests import servers
from tests.clients import call
from tests.factories import stdio_upstream
from tests.helpers import run, with_pool

SCRIPT = str(servers.ROOT / "tests/support/hostile_server.py")
PG_SOCKET = "/var/run/postgresql/.s.PGSQL.5432"
VAR = django_settings.VAR_DIR


@pytest.fixture
def database() -> Iterator[Path]:
    """A SQLite database in the gateway's var folder, as the embedded default keeps its own there."""
    path = Path(django_settings.VAR_DIR) / "hostile-target.sqlite3"
    path.write_bytes(b"SQLite format 3\0")
    yield path
    path.unlink()


@pytest.fixture
def listening() -> Iterator[str]:
    """A Unix socket on the host standing in for every local service's (Redis's, podman's): accepting."""
    folder = tempfile.mkdtemp(prefix="hostile-")
    os.chmod(folder, 0o755)
    path = os.path.join(folder, "service.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.bind(path)
        os.chmod(path, 0o777)
        sock.listen(8)
        yield path


def targets(listening: str, *, ports: list[int], processes: list[int]) -> dict:
    """What the hostile server tries: the files of the gateway's var folder (its keys, a database), PostgreSQL
    and Redis by TCP, their sockets, writes into the project and the var folder."""
    var = Path(django_settings.VAR_DIR)
    files = [str(var / name) for name in sorted(os.listdir(var)) if (var / name).is_file()]
    return {
        "files": [*files, "/etc/shadow"],
        "tcp": [5432, 6379, *ports],
        "sockets": [p for p in (PG_SOCKET, listening) if os.path.exists(p)],
        "write": [str(servers.ROOT / "owned-by-upstream"), str(var / "owned-by-upstream"), "/usr/owned"],
        "processes": [str(pid) for pid in processes],
    }


def probe_in_pool(found: dict, sandbox: SandboxSettings | None = None) -> dict:
    spec = UpstreamSpec(
        id=1, revision=1, slug="hostile", transport="stdio", timeout=10, command=sys.executable,
        args=[SCRIPT, json.dumps(found)], sandbox=sandbox or SandboxSettings(),
    )  # fmt: skip

    async def probe(pool: UpstreamPool) -> dict:
        return await pool.request(UpstreamRequest.tool_call(1, 1, "probe", {}))

    outcome = with_pool(spec, probe)
    assert outcome["ok"], outcome
    return json.loads(outcome["result"]["content"][0]["text"])


def learnt_nothing(seen: dict) -> None:
    assert (seen["read"], seen["tcp"], seen["sockets"], seen["wrote"]) == ([], [], [], [])
    assert (seen["environ"], seen["other_processes"], seen["home_writable"]) == ({}, [], True)
    assert seen["uid"] == (django_settings.GATEWAY_STDIO_SANDBOX_UID if os.geteuid() == 0 else os.geteuid())


def test_a_confined_server_learns_nothing_that_an_unconfined_one_reads(db, settings, listening, database):
    found = targets(listening, ports=[], processes=[os.getpid()])  # this process's environment holds DATABASE_URL
    learnt_nothing(probe_in_pool(found))
    settings.GATEWAY_STDIO_SANDBOX = "off"
    try:
        seen = probe_in_pool(found)
    finally:
        for path in found["write"]:
            Path(path).unlink(missing_ok=True)
    assert set(seen["read"]) >= {f for f in found["files"] if f.endswith(("secret_key", "credential_key", ".sqlite3"))}
    assert 5432 in seen["tcp"] and listening in seen["sockets"] and seen["other_processes"]
    assert seen["environ"][str(os.getpid())] == ["DATABASE_URL", "REDIS_URL"]


def test_a_server_that_fills_its_tmp_meets_the_size_of_its_own_and_serves_on(db, settings):
    settings.GATEWAY_STDIO_SANDBOX_TMP_MB = 8
    nothing = {"files": [], "tcp": [], "sockets": [], "write": [], "processes": []}
    spec = UpstreamSpec(
        id=1, revision=1, slug="hostile", transport="stdio", timeout=10, command=sys.executable,
        args=[SCRIPT, json.dumps(nothing)],
    )  # fmt: skip

    async def twice(pool: UpstreamPool) -> list[dict]:
        calls = [
            UpstreamRequest.tool_call(1, 1, "fill", {"most_mib": 64}),
            UpstreamRequest.tool_call(1, 1, "probe", {}),
        ]
        return [json.loads((await pool.request(call))["result"]["content"][0]["text"]) for call in calls]

    filled, probed = with_pool(spec, twice)
    assert filled == {"written_mib": 8, "error": "No space left on device"}
    learnt_nothing(probed)


def test_a_server_given_the_hosts_network_reaches_loopback_and_nothing_else_more(db, listening, database, caplog):
    seen = probe_in_pool(targets(listening, ports=[], processes=[os.getpid()]), SandboxSettings(network="host"))
    assert (seen["tcp"], seen["read"], seen["sockets"], seen["environ"]) == ([5432, 6379], [], [], {})
    assert "upstream hostile: its stdio server shares the host's network, unconfined" in caplog.messages


def test_through_the_gateway_in_each_executor_a_hostile_server_learns_nothing_and_the_others_serve_on(
    gateway, world, listening, database
):
    port = int(gateway.url.rsplit(":", 1)[1].split("/")[0])
    found = targets(listening, ports=[port], processes=[gateway.process.pid, gateway.executor_pid])
    upstream = stdio_upstream("hostile", sys.executable, [SCRIPT, json.dumps(found)])
    try:
        answer = run(lambda: call(gateway.url, world.key, "hostile__probe"))
        assert not answer.is_error, answer
        learnt_nothing(json.loads(answer.content[0].text))
        assert not any(os.path.exists(path) for path in found["write"])
        echoed = run(lambda: call(gateway.url, world.key, "demo__echo", {"text": "still here"}))
        assert echoed.content[0].text == "still here"
    finally:
        upstream.delete()


@pytest.mark.parametrize(
    ("paths", "problem"),
    [
        (["/"], "paths: '/' would give the server the whole of /."),
        (["/var"], "paths: '/var' would give the server the whole of /var."),
        (["relative/path"], "paths: 'relative/path' is not an absolute path."),
        ([str(servers.ROOT)], f"paths: {str(servers.ROOT)!r} holds or is inside the gateway's own"),
        (
            [f"{django_settings.VAR_DIR}/secret_key"],
            f"paths: '{django_settings.VAR_DIR}/secret_key' holds or is inside",
        ),
    ],
)
def test_a_sandbox_path_that_would_open_the_gateway_is_refused_with_why(db, paths, problem):
    upstream = Upstream(slug="opened", transport="stdio", command=sys.executable, sandbox={"paths": paths})
    with pytest.raises(ValidationError) as refused:
        upstream.full_clean()
    assert problem in refused.value.message_dict["sandbox"][0]


@pytest.mark.parametrize(
    ("sandbox", "problem"),
    [
        ({"network": "everywhere"}, "network must be one of none, outbound, host, not 'everywhere'."),
        ({"memory": 5}, "Unknown sandbox setting 'memory': network, paths, memoryMb, pids, cpus are known."),
        ({"paths": "/srv"}, "paths must be a JSON list of strings."),
        ({"memoryMb": 4}, "memoryMb must be a whole number from 16 to 1048576."),
        ({"memoryMb": 64.5}, "memoryMb must be a whole number from 16 to 1048576."),
        ({"pids": True}, "pids must be a whole number from 8 to 4194304."),
        ({"cpus": "1"}, "cpus must be a number from 0.01 to 1024."),
        ({"cpus": 0}, "cpus must be a number from 0.01 to 1024."),
        ([], 'A JSON object: {"network": "none", "memoryMb": 512, "paths": ["/srv/data", "/srv/out:rw"]}.'),
    ],
)
def test_a_malformed_sandbox_setting_is_refused_with_why(db, sandbox, problem):
    upstream = Upstream(slug="opened", transport="stdio", command=sys.executable, sandbox=sandbox)
    with pytest.raises(ValidationError) as refused:
        upstream.full_clean()
    assert refused.value.message_dict["sandbox"] == [problem]


def test_a_command_run_from_the_gateways_own_folder_is_refused_before_it_starts(db):
    with pytest.raises(SandboxRefused) as refused:
        bwrap_command(sys.executable, [], str(servers.ROOT), SandboxSettings())
    assert str(refused.value).startswith(f"the command's own {str(servers.ROOT)!r} holds or is inside the gateway's")


def test_without_bubblewrap_a_stdio_upstream_does_not_start_and_its_health_says_why(db, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")  # where bwrap is looked for; the command is named by its path
    upstream = Upstream(slug="nobwrap", transport="stdio", command=sys.executable, args=[SCRIPT, "{}"])
    upstream.save()
    try:
        report = upstream_catalog_sync(upstream=upstream)
    finally:
        upstream.delete()
    assert report.cause == (
        "not started: bubblewrap is not installed where upstreams run (Debian package `bubblewrap`); "
        "GATEWAY_STDIO_SANDBOX=off runs stdio servers unconfined"
    )


@pytest.mark.parametrize("user", ["root", "not root"])
def test_a_sandboxs_own_folders_are_not_writable_whoever_runs_the_gateway(db, monkeypatch, user):
    """Not root, bwrap makes the sandbox's root and the folders above a given path as the server's own uid: they
    stay read-only (a write there would fill memory without a bound, and seem to reach the gateway's folders).
    As root the test drops to an unprivileged uid to run the gateway's side as a non-root gateway would."""
    given = tempfile.mkdtemp(prefix="given-", dir="/var/tmp")  # not under /tmp: its parents are made on the root
    nested = tempfile.mkdtemp(prefix="above-")  # under /tmp: its parent is made in the sandbox's /tmp
    os.makedirs(os.path.join(nested, "given"))
    for folder in (given, nested):
        os.chmod(folder, 0o755)
    uid = django_settings.GATEWAY_STDIO_SANDBOX_UID if os.geteuid() == 0 else os.geteuid()
    if user == "not root":
        monkeypatch.setattr(os, "geteuid", lambda: uid)
    probe = "; ".join(
        f'if echo x 2>/dev/null > {path}/owned; then echo "{path}"; fi'
        for path in ("", "/var", given, nested, f"{nested}/given", "/tmp", "/home/upstream")
    )
    sandbox = SandboxSettings(paths=(given, f"{nested}/given"))
    command = bwrap_command("/bin/sh", ["-c", probe], None, sandbox)
    monkeypatch.undo()
    drop = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"] if os.geteuid() == 0 else []
    try:
        done = subprocess.run([*drop, *command] if user == "not root" else command, capture_output=True, timeout=30)
    finally:
        shutil.rmtree(given), shutil.rmtree(nested)
    assert (done.returncode, done.stderr) == (0, b"")
    assert done.stdout.decode().split() == ["/tmp", "/home/upstream"]  # its own tmpfs, size-capped
