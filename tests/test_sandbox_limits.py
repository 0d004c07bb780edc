"""A confined stdio server's limits (registry/upstreams/limits.py): a hostile server of the tests' own
(tests/support/hostile_server.py) grows past its memory, forks without end, spins a core and writes a file past its
size; each meets its limit, the operator is told which, and the next call is served."""

import json
import sys
import uuid
from pathlib import Path

import pytest

from registry.upstreams.limits import ROOT, cgroup_make
from registry.upstreams.pool import UpstreamPool
from registry.upstreams.requests import UpstreamRequest
from registry.upstreams.sandbox import SandboxSettings
from registry.upstreams.spec import UpstreamSpec
from tests import servers
from tests.clients import call
from tests.factories import stdio_upstream
from tests.helpers import audit_mark, audit_since, eventually, run, with_pool

SCRIPT = str(servers.ROOT / "tests/support/hostile_server.py")
NOTHING = json.dumps({"files": [], "tcp": [], "sockets": [], "write": [], "processes": []})


def _cgroups() -> bool:
    """Whether a cgroup can be made here (as root on these machines: cgroup v1)."""
    made = cgroup_make("probe", SandboxSettings())
    if made is not None:
        made.remove()
    return made is not None


needs_cgroups = pytest.mark.skipif(not _cgroups(), reason="no cgroup can be made here: only the rlimits hold")


def hostile(slug: str, **limits) -> UpstreamSpec:
    return UpstreamSpec(
        id=1, revision=1, slug=slug, transport="stdio", timeout=30, command=sys.executable,
        args=[SCRIPT, NOTHING], sandbox=SandboxSettings(**limits),
    )  # fmt: skip


def said(outcome: dict) -> dict:
    assert outcome["ok"], outcome
    return json.loads(outcome["result"]["content"][0]["text"])


def tool(name: str, **arguments) -> UpstreamRequest:
    return UpstreamRequest.tool_call(1, 1, name, arguments)


def cgroups(slug: str) -> list[Path]:
    return sorted(ROOT.glob(f"*/switchboard/{slug}-*"))


@needs_cgroups
def test_cgroups_made_and_removed_intern_no_string_of_their_own(monkeypatch):
    """Each server's cgroup has a new name; pathlib interned it (sys.intern of a path's parts), one more entry in
    CPython's table of interned strings for each server started (docs/reliability.md). The cgroups after the first
    intern what the first did."""
    interned: list[str] = []
    real = sys.intern
    monkeypatch.setattr(sys, "intern", lambda text: interned.append(text) or real(text))
    each = []
    for _ in range(3):
        interned.clear()
        made = cgroup_make("interned", SandboxSettings())
        assert made is not None
        assert made.join() and not made.memory_killed()
        made.remove()
        each.append(set(interned))
    assert [later - each[0] for later in each[1:]] == [set(), set()]


@needs_cgroups
def test_a_server_past_its_memory_limit_is_killed_said_so_and_the_next_call_is_served(db):
    async def grown(pool: UpstreamPool) -> tuple[dict, dict]:
        return await pool.request(tool("grow", most_mib=512)), await pool.request(tool("grow", most_mib=8))

    killed, served = with_pool(hostile("glutton", memory_mb=128), grown)
    assert (killed["ok"], killed["code"]) == (False, "UPSTREAM_UNAVAILABLE")
    assert killed["message"].startswith(
        "The service's process was killed: memory limit 128 MiB during the call; it is being restarted."
    )
    assert killed["cause"] == "the connection closed during a call: the server was killed: memory limit 128 MiB"
    assert said(served) == {"held_mib": 8}
    assert cgroups("glutton") == []  # each server's cgroup removed once it ended


@needs_cgroups
def test_a_fork_bomb_meets_the_process_limit_and_the_server_serves_on(db):
    async def bombed(pool: UpstreamPool) -> tuple[dict, dict]:
        return said(await pool.request(tool("fork", most=500))), said(await pool.request(tool("rlimits")))

    forked, limits = with_pool(hostile("bomber", pids=32), bombed)
    assert forked["error"] == "Resource temporarily unavailable" and 0 < forked["started"] < 32
    assert limits == {"nofile": 1024, "fsize": 1024 << 20}


@needs_cgroups
def test_a_server_spinning_a_core_gets_its_cpu_share_and_no_more(db):
    async def spun(pool: UpstreamPool) -> tuple[dict, str]:
        share = said(await pool.request(tool("spin", seconds=1.0)))
        [cpu] = [folder for folder in cgroups("spinner") if folder.parent.parent.name == "cpu"]
        return share, (cpu / "cpu.stat").read_text()

    share, stat = with_pool(hostile("spinner", cpus=0.3), spun)
    throttled = dict(line.split() for line in stat.splitlines())["nr_throttled"]
    assert int(throttled) > 0 and share["cpu_share"] < 0.6, (share, stat)


def test_a_server_writing_past_its_file_size_limit_is_refused_and_serves_on(db, settings):
    settings.GATEWAY_STDIO_SANDBOX_FSIZE_MB = 2

    async def filled(pool: UpstreamPool) -> tuple[dict, dict]:
        return said(await pool.request(tool("fill", most_mib=16))), said(await pool.request(tool("rlimits")))

    written, limits = with_pool(hostile("writer"), filled)
    assert written == {"written_mib": 2, "error": "File too large"}
    assert limits == {"nofile": 1024, "fsize": 2 << 20}


@needs_cgroups
def test_through_the_gateway_a_server_killed_at_its_memory_limit_is_named_in_the_audit_row_and_its_health(
    gateway, world
):
    slug = f"glutton{uuid.uuid4().hex[:6]}"
    upstream = stdio_upstream(slug, sys.executable, [SCRIPT, NOTHING], sandbox={"memoryMb": 128})
    try:
        begun = audit_mark()
        answer = run(lambda: call(gateway.url, world.key, f"{slug}__grow", {"most_mib": 512}))
        assert answer.is_error and answer.content[0].text.startswith(
            f"{slug}__grow: The service's process was killed: memory limit 128 MiB during the call;"
        )
        [completed] = [r for r in audit_since(begun) if r.kind == "completed" and r.upstream == slug]
        assert (completed.outcome, completed.error_code) == ("error", "UPSTREAM_UNAVAILABLE")
        assert "killed: memory limit 128 MiB" in completed.error_detail

        def health() -> tuple[str, str] | None:
            upstream.refresh_from_db()
            return (upstream.health, upstream.health_cause) if upstream.health == "failing" else None

        assert "the server was killed: memory limit 128 MiB" in eventually(health, timeout=15)[1]
        echoed = run(lambda: call(gateway.url, world.key, f"{slug}__grow", {"most_mib": 4}))
        assert json.loads(echoed.content[0].text) == {"held_mib": 4}
    finally:
        upstream.delete()


def test_an_upstreams_limits_override_the_gateways_defaults(settings):
    settings.GATEWAY_STDIO_SANDBOX_MEMORY_MB = 300
    given = SandboxSettings.from_json({"pids": 40, "cpus": 0.5})
    assert (given.memory_mb, given.pids, given.cpus) == (300, 40, 0.5)
