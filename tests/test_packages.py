"""An npx or uvx upstream's package is installed when the upstream is registered, pinned, and run from its own
folder offline (registry/upstreams/packages/, registry/package_pins.py); one that changes is held until approved.
The packages are the tests' own (tests/support/npm_package.py, a tarball; tests/support/py_package.py, a wheel): no
registry or index is involved."""

import io
import json
import re
import shutil
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.core.management import CommandError, call_command

from audit.models import AuditEvent
from registry.models import Upstream
from registry.services import upstream_catalog_sync
from registry.upstreams.packages import PackageProblem, asked
from registry.upstreams.pool import UpstreamPool
from registry.upstreams.requests import UpstreamRequest
from registry.upstreams.spec import UpstreamSpec
from tests.clients import call
from tests.factories import stdio_upstream
from tests.helpers import run, with_pool
from tests.support import py_package
from tests.support.npm_package import NAME, pack


@pytest.fixture
def tarball(tmp_path: Path) -> Path:
    return pack(tmp_path / "echo.tgz", "1.0.0")


@pytest.fixture
def slug(db) -> Iterator[str]:
    """A new upstream's name; its row and its packages are removed after the test."""
    name = f"npm{uuid.uuid4().hex[:8]}"
    yield name
    Upstream.objects.filter(slug=name).delete()
    shutil.rmtree(Path(django_settings.GATEWAY_PACKAGES_DIR) / name, ignore_errors=True)


def started(upstream: Upstream) -> dict:
    """The outcome of its `version` tool, its server started in a new pool of this process from the upstream as
    stored."""
    upstream.refresh_from_db()

    async def version(pool: UpstreamPool) -> dict:
        return await pool.request(UpstreamRequest.tool_call(upstream.id, upstream.revision, "version", {}))

    return with_pool(UpstreamSpec.from_model(upstream), version)


def served(upstream: Upstream) -> dict:
    """What the pinned install says it is."""
    outcome = started(upstream)
    assert outcome["ok"], outcome
    return json.loads(outcome["result"]["content"][0]["text"])


def actions(slug: str) -> list[dict]:
    rows = AuditEvent.objects.filter(kind="admin_change", upstream=slug).order_by("id")
    return [row.detail for row in rows if row.detail.get("action", "").startswith("package_")]


def test_an_npx_upstream_is_pinned_at_registration_and_served_from_its_folder_through_the_gateway(
    gateway, world, tarball, slug
):
    upstream = stdio_upstream(slug, "npx", ["-y", str(tarball)])
    pin = Upstream.objects.get(pk=upstream.pk).package["pinned"]
    assert (pin["name"], pin["version"], pin["integrity"][:7]) == (NAME, "1.0.0", "sha512-")
    [pinned] = actions(slug)
    assert pinned == {"action": "package_pinned", "name": NAME, "version": "1.0.0", "integrity": pin["integrity"],
                      "digest": pin["digest"]}  # fmt: skip
    answer = run(lambda: call(gateway.url, world.key, f"{slug}__version"))
    said = json.loads(answer.content[0].text)
    folder = Path(django_settings.GATEWAY_PACKAGES_DIR) / slug / pin["digest"][:16]
    assert said == {"version": "1.0.0", "script": str(folder / "node_modules" / NAME / "server.js")}


def test_a_changed_package_is_held_and_the_pinned_one_serves_until_an_administrator_approves(db, tmp_path, slug):
    tarball = pack(tmp_path / "echo.tgz", "1.0.0")
    upstream = stdio_upstream(slug, "npx", ["-y", str(tarball)])
    call_command("upstream_package", slug, "--update", stdout=(said := io.StringIO()))
    assert said.getvalue() == f"{slug}: unchanged: {NAME} 1.0.0\n"
    pack(tarball, "1.0.1")
    call_command("upstream_package", slug, "--update", stdout=(said := io.StringIO()))
    held = Upstream.objects.get(pk=upstream.pk).package["held"]
    assert said.getvalue() == f"{slug}: held for approval: {NAME} 1.0.0 -> 1.0.1 ({held['integrity']})\n"
    assert served(upstream)["version"] == "1.0.0"
    call_command("upstream_package", slug, "--approve", stdout=(said := io.StringIO()))
    assert said.getvalue() == f"{slug}: approved: {NAME} 1.0.1\n"
    assert served(upstream)["version"] == "1.0.1"
    assert [(a["action"], a.get("after", a).get("version")) for a in actions(slug)] == [
        ("package_pinned", "1.0.0"),
        ("package_held", "1.0.1"),
        ("package_approved", "1.0.1"),
    ]


def test_a_pinned_package_missing_on_this_host_is_installed_again_from_its_lock_and_a_changed_one_refused(
    db, tarball, slug
):
    upstream = stdio_upstream(slug, "npx", ["-y", str(tarball)])
    pin = Upstream.objects.get(pk=upstream.pk).package["pinned"]
    folder = Path(django_settings.GATEWAY_PACKAGES_DIR) / slug / pin["digest"][:16]
    shutil.rmtree(folder)
    assert served(upstream)["version"] == "1.0.0" and folder.exists()  # `npm ci` from the pinned lock
    lock = folder / "package-lock.json"
    lock.write_text(lock.read_text().replace('"1.0.0"', '"6.6.6"'))
    refused = started(upstream)
    assert (refused["ok"], refused["code"]) == (False, "UPSTREAM_UNAVAILABLE")
    assert refused["cause"] == f"not started: the package {NAME} in {folder} is not the approved one (its lock changed)"


def test_a_package_that_cannot_be_installed_is_not_registered_and_its_health_says_why(db, tmp_path, slug):
    missing = tmp_path / "nowhere.tgz"
    upstream = Upstream(slug=slug, transport="stdio", command="npx", args=["-y", str(missing)])
    upstream.save()
    report = upstream_catalog_sync(upstream=upstream)
    upstream.refresh_from_db()
    assert not report.ok and report.error == (
        f"package not installed: npm install failed: ENOENT: enoent ENOENT: no such file or directory, open '{missing}'"
    )
    assert (upstream.health, upstream.health_cause, upstream.package) == ("failing", report.error, {})


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (["--foo", "pkg"], "npx option '--foo' is not understood: give the package first (npx -y <package>)"),
        (["-y"], "npx names no package"),
    ],
)
def test_an_npx_command_line_that_names_no_package_plainly_is_refused_with_why(args, problem):
    with pytest.raises(PackageProblem) as refused:
        asked("npx", args)
    assert str(refused.value) == problem


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (["--with", "x", "pkg"], "uvx option '--with' is not understood: give the package first (uvx <package>)"),
        (["-q"], "uvx names no package"),
    ],
)
def test_a_uvx_command_line_that_names_no_package_plainly_is_refused_with_why(args, problem):
    with pytest.raises(PackageProblem) as refused:
        asked("uvx", args)
    assert str(refused.value) == problem


def test_npx_command_lines_as_mcpservers_entries_write_them():
    assert asked("npx", ["-y", "@scope/server@1.2", "--port", "3"]).__dict__ == {
        "manager": "npm", "spec": "@scope/server@1.2", "bin": "", "args": ["--port", "3"]
    }  # fmt: skip
    given = asked("/usr/bin/npx", ["--package=pkg", "its-bin", "a"])
    assert given.__dict__ == {"manager": "npm", "spec": "pkg", "bin": "its-bin", "args": ["a"]}
    assert asked("uvx", ["mcp-server-time@2025.1", "--tz=UTC"]).__dict__ == {
        "manager": "uv", "spec": "mcp-server-time==2025.1", "bin": "", "args": ["--tz=UTC"]
    }  # fmt: skip
    given = asked("uvx", ["--from", "git-tools>=1", "git-mcp", "-v"])
    assert given.__dict__ == {"manager": "uv", "spec": "git-tools>=1", "bin": "git-mcp", "args": ["-v"]}
    assert asked(sys.executable, ["-m", "x"]) is None


@pytest.mark.parametrize("flag", ["--update", "--approve"])
def test_updating_or_approving_an_upstream_without_a_package_is_refused_with_why(db, flag):
    upstream = Upstream.objects.create(slug=f"plain{flag[2:]}", transport="stdio", command=sys.executable)
    try:
        with pytest.raises(CommandError) as refused:
            call_command("upstream_package", upstream.slug, flag)
    finally:
        upstream.delete()
    assert str(refused.value) == f"upstream {upstream.slug} runs no pinned package (npx, uvx)"


def test_approving_when_nothing_is_held_is_refused_with_why(db, tarball, slug):
    stdio_upstream(slug, "npx", ["-y", str(tarball)])
    with pytest.raises(CommandError) as refused:
        call_command("upstream_package", slug, "--approve")
    assert str(refused.value) == f"upstream {slug} has no package held for approval"
    with pytest.raises(CommandError) as unknown:
        call_command("upstream_package", "nobody", "--update")
    assert str(unknown.value) == "no upstream is named 'nobody'"


def test_the_console_holds_and_approves_a_package_and_shows_both(admin_client, tmp_path, slug):
    tarball = pack(tmp_path / "echo.tgz", "1.0.0")
    upstream = stdio_upstream(slug, "npx", ["-y", str(tarball)])
    pack(tarball, "2.0.0")

    def act(action: str) -> list[str]:
        said = admin_client.post(
            "/admin/registry/upstream/", {"action": action, "_selected_action": [upstream.pk]}, follow=True
        )
        return [message.message for message in said.context["messages"]]

    said = act("update_packages")
    held = Upstream.objects.get(pk=upstream.pk).package["held"]
    assert said == [f"{slug}: held for approval: {NAME} 1.0.0 -> 2.0.0 ({held['integrity']})"]
    shown = admin_client.get(f"/admin/registry/upstream/{upstream.pk}/change/").content.decode()
    assert f"; held for approval: {NAME} 2.0.0 (sha512-" in shown
    tile = re.search(
        r'id="held-packages"><strong>(\d+)</strong>.*?</a>', admin_client.get("/admin/dashboard/").content.decode()
    )
    assert tile and int(tile[1]) >= 1 and f"<small>{slug}</small>" in tile[0]
    assert act("approve_packages") == [f"{slug}: approved: {NAME} 2.0.0"]
    assert f"<small>{slug}</small>" not in admin_client.get("/admin/dashboard/").content.decode()
    assert act("approve_packages") == [f"upstream {slug} has no package held for approval"]
    actors = AuditEvent.objects.filter(upstream=slug, detail__action__in=["package_held", "package_approved"])
    assert [row.actor for row in actors] == ["operator", "operator"]


def test_a_uvx_upstream_runs_from_its_own_environment_and_a_rebuilt_wheel_is_held_until_approved(db, tmp_path, slug):
    wheel = py_package.build(tmp_path, "1.0.0", mark="first")
    upstream = stdio_upstream(slug, "uvx", ["--from", str(wheel), py_package.NAME])
    pin = Upstream.objects.get(pk=upstream.pk).package["pinned"]
    assert (pin["manager"], pin["name"], pin["version"], pin["integrity"][:7]) == (
        "uv",
        py_package.NAME,
        "1.0.0",
        "sha256:",
    )
    said = served(upstream)
    folder = Path(django_settings.GATEWAY_PACKAGES_DIR) / slug / pin["digest"][:16]
    assert (said["version"], said["mark"]) == ("1.0.0", "first")
    assert said["script"].startswith(str(folder / "venv/lib/"))
    py_package.build(tmp_path, "1.0.0", mark="second")  # the same version, other contents
    call_command("upstream_package", slug, "--update", stdout=(out := io.StringIO()))
    held = Upstream.objects.get(pk=upstream.pk).package["held"]
    assert held["integrity"] != pin["integrity"]
    assert out.getvalue() == f"{slug}: held for approval: {py_package.NAME} 1.0.0 -> 1.0.0 ({held['integrity']})\n"
    assert served(upstream)["mark"] == "first"
    call_command("upstream_package", slug, "--approve", stdout=io.StringIO())
    assert served(upstream)["mark"] == "second"


def test_a_uvx_package_that_cannot_be_resolved_is_not_registered_with_uvs_reason(db, tmp_path, slug):
    missing = tmp_path / "switchboard_py_echo-9.9.9-py3-none-any.whl"
    upstream = Upstream(slug=slug, transport="stdio", command="uvx", args=["--from", str(missing), "x"])
    upstream.save()
    report = upstream_catalog_sync(upstream=upstream)
    assert report.error.startswith("package not installed: uv pip failed: ") and str(missing) in report.error
