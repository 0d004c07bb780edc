"""`import_mcp_config` and `export_mcp_config` for automation: exit statuses, names that would overwrite each
other, file order with a progress line per sync, --dry-run, ${VAR} placeholders and the export's round trip,
run as real commands (in this process, and as processes for their exit statuses) against real upstreams."""

import json
import queue
import re
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from audit.models import AuditEvent
from handoff.config_import import mcp_config_export, mcp_config_import
from handoff.models import HandoffRoute
from registry.credentials import credentials_open
from registry.models import Upstream
from registry.services import upstream_save
from tests import servers
from tests.conftest import BIN
from tests.factories import DEMO, unrouted_handoff_targets_removed

TIME = {"command": str(BIN / "mcp-server-time"), "args": ["--local-timezone", "UTC"]}
DEMO_ENTRY = {"command": sys.executable, "args": DEMO}
SECONDS = r"\(\d+\.\d s\)"


@pytest.fixture
def cleanup(db) -> Iterator[None]:
    """Removes what a test imported: every upstream it made starts with `imp-`."""
    unrouted_handoff_targets_removed()
    yield
    Upstream.objects.filter(slug__startswith="imp-").delete()


def manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, str(servers.ROOT / "manage.py"), *args]
    return subprocess.run(command, env=env, cwd=servers.ROOT, capture_output=True, text=True, timeout=120)


@pytest.fixture
def command_env(server_env) -> dict[str, str]:
    return server_env | {"GATEWAY_EXECUTOR": "inline"}


def test_the_exit_status_says_whether_every_entry_was_imported_and_synced(command_env, cleanup, tmp_path):
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"mcpServers": {"imp-time": TIME, "imp-off": {"command": "x", "disabled": True}}}))
    ok = manage(command_env, "import_mcp_config", str(good))
    rejected = tmp_path / "rejected.json"
    rejected.write_text(json.dumps({"mcpServers": {"imp-time": TIME, "imp-neither": {"foo": 1}}}))
    some_rejected = manage(command_env, "import_mcp_config", str(rejected), "--no-sync")
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({"mcpServers": {"imp-ghost": {"command": "/nonexistent/server"}}}))
    sync_failed = manage(command_env, "import_mcp_config", str(broken))
    (tmp_path / "not.json").write_text("{'mcpServers': {}}")
    not_json = manage(command_env, "import_mcp_config", str(tmp_path / "not.json"))
    missing = manage(command_env, "import_mcp_config", str(tmp_path / "missing.json"))

    assert ok.returncode == 0 and "CommandError" not in ok.stderr, ok.stderr
    lines = ok.stdout.splitlines()
    assert lines[:3] == ["created  imp-time", "skipped  imp-off: marked disabled in the file", "syncing imp-time…"]
    assert re.fullmatch(rf"imp-time: 2 added, 0 changed, 0 removed, 0 rejected {SECONDS}", lines[3]) and len(lines) == 4
    assert some_rejected.returncode == 1
    assert some_rejected.stdout.splitlines() == [
        "skipped  imp-time: upstream 'imp-time' is already up to date",
        "rejected imp-neither: an entry needs either 'command' (stdio) or 'url' (HTTP)",
    ]
    assert some_rejected.stderr.splitlines()[-1] == "CommandError: 1 of 2 entries were rejected or failed to sync"
    assert sync_failed.returncode == 1
    assert sync_failed.stdout.splitlines()[:2] == ["created  imp-ghost", "syncing imp-ghost…"]
    assert re.fullmatch(rf"imp-ghost: catalog sync failed: .+ {SECONDS}", sync_failed.stdout.splitlines()[2])
    assert sync_failed.stderr.splitlines()[-1] == "CommandError: 1 of 1 entries were rejected or failed to sync"
    assert (not_json.returncode, not_json.stdout) == (2, "")
    assert not_json.stderr.splitlines()[-1] == (
        f"CommandError: {tmp_path / 'not.json'}: Expecting property name enclosed in double quotes: "
        "line 1 column 2 (char 1)"
    )
    assert missing.returncode == 2
    assert missing.stderr.splitlines()[-1] == (
        f"CommandError: {tmp_path / 'missing.json'}: [Errno 2] No such file or directory: '{tmp_path / 'missing.json'}'"
    )


def test_a_name_repeated_in_mcp_servers_is_refused_not_overwritten(cleanup, tmp_path, capsys):
    path = tmp_path / "config.json"
    twice = json.dumps(TIME)
    path.write_text(
        f'{{"mcpServers": {{"imp-twice": {twice}, "imp-demo": {json.dumps(DEMO_ENTRY)}, '
        f'"imp-twice": {{"command": "/bin/false"}}}}}}'
    )
    with pytest.raises(CommandError) as raised:
        call_command("import_mcp_config", str(path), "--no-sync")
    assert capsys.readouterr().out.splitlines() == [
        "rejected imp-twice: two entries are named 'imp-twice' in 'mcpServers'; neither is imported",
        "created  imp-demo",
    ]
    assert (str(raised.value), raised.value.returncode) == ("1 of 2 entries were rejected or failed to sync", 1)
    assert list(Upstream.objects.filter(slug__startswith="imp-").values_list("slug", flat=True)) == ["imp-demo"]


def test_a_key_repeated_inside_an_entry_is_refused_naming_it(cleanup, tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(
        '{"mcpServers": {'
        '"imp-env": {"command": "/bin/true", "env": {"TOKEN": "first", "TOKEN": "second"}},'
        '"imp-cmd": {"command": "/bin/true", "command": "/bin/false"},'
        '"imp-deep": {"url": "https://example.com/mcp", "handoff": {"description": "a", "description": "b"}}}}'
    )
    with pytest.raises(CommandError, match="^3 of 3 entries were rejected or failed to sync$"):
        call_command("import_mcp_config", str(path), "--no-sync")
    assert capsys.readouterr().out.splitlines() == [
        "rejected imp-env: 'env' names 'TOKEN' twice; the entry is not imported",
        "rejected imp-cmd: the entry names 'command' twice; the entry is not imported",
        "rejected imp-deep: 'handoff' names 'description' twice; the entry is not imported",
    ]
    assert not Upstream.objects.filter(slug__startswith="imp-").exists()


def test_mcp_servers_twice_makes_the_file_unusable(cleanup, tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"mcpServers": {}, "mcpServers": {"imp-x": {"command": "/bin/true"}}}')
    with pytest.raises(CommandError) as raised:
        call_command("import_mcp_config", str(path))
    assert str(raised.value) == f"{path}: 'mcpServers' appears twice; which one is meant is unclear."
    assert raised.value.returncode == 2


def test_two_names_for_one_slug_are_both_refused_naming_each_other(cleanup, tmp_path, capsys):
    path = tmp_path / "config.json"
    config = {"mcpServers": {"Imp Clock": TIME, "imp-demo": DEMO_ENTRY, "imp-clock": DEMO_ENTRY}}
    path.write_text(json.dumps(config))
    with pytest.raises(CommandError, match="^2 of 3 entries were rejected or failed to sync$"):
        call_command("import_mcp_config", str(path), "--no-sync")
    assert capsys.readouterr().out.splitlines() == [
        "rejected Imp Clock: 'Imp Clock' and 'imp-clock' map to the same slug 'imp-clock'; none is imported "
        "(rename one, or set its namespace)",
        "created  imp-demo",
        "rejected imp-clock: 'imp-clock' and 'Imp Clock' map to the same slug 'imp-clock'; none is imported "
        "(rename one, or set its namespace)",
    ]
    assert not Upstream.objects.filter(slug="imp-clock").exists()


def test_the_loopback_hint_names_internal_and_an_entry_may_say_it_is_internal(cleanup, tmp_path, capsys):
    path = tmp_path / "config.json"
    config = {
        "mcpServers": {
            "imp-loop": {"url": "http://127.0.0.2:9/mcp"},
            "imp-local": {"url": "http://localhost:9/mcp"},
            "imp-inside": {"url": "http://10.1.2.3/mcp", "internal": True},
            "imp-odd": {"url": "http://10.1.2.3/mcp", "internal": "yes"},
        }
    }
    path.write_text(json.dumps(config))
    with pytest.raises(CommandError, match="^3 of 4 entries"):
        call_command("import_mcp_config", str(path), "--no-sync")
    assert capsys.readouterr().out.splitlines() == [
        'rejected imp-loop: url: 127.0.0.2 is not a public address. Pass --internal, or set "internal": true on '
        "the entry, to allow it.",
        'rejected imp-local: url: localhost is a loopback name. Pass --internal, or set "internal": true on the '
        "entry, to allow it.",
        "created  imp-inside",
        "rejected imp-odd: 'internal' must be true or false",
    ]
    assert Upstream.objects.get(slug="imp-inside").internal is True
    with pytest.raises(CommandError, match="^1 of 4 entries"):  # imp-odd still
        call_command("import_mcp_config", str(path), "--no-sync", "--internal", "--dry-run")
    assert capsys.readouterr().out.splitlines()[:2] == ["would create imp-loop", "would create imp-local"]


def test_a_dry_run_says_what_would_change_and_writes_and_syncs_nothing(cleanup, tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"mcpServers": {"imp-old": TIME, "imp-same": DEMO_ENTRY}}))
    call_command("import_mcp_config", str(path), "--no-sync")
    capsys.readouterr()
    before = list(Upstream.objects.filter(slug__startswith="imp-").values())
    audit_rows = AuditEvent.objects.count()
    moved = TIME | {"args": ["--local-timezone", "Europe/Paris"]}
    config = {"mcpServers": {"imp-new": DEMO_ENTRY, "imp-old": moved, "imp-same": DEMO_ENTRY, "imp-bad": {}}}
    path.write_text(json.dumps(config))
    with pytest.raises(CommandError, match="^1 of 4 entries were rejected or failed to sync$"):
        call_command("import_mcp_config", str(path), "--dry-run")
    assert capsys.readouterr().out.splitlines() == [
        "would create imp-new",
        "would update imp-old",
        "skipped  imp-same: upstream 'imp-same' is already up to date",
        "rejected imp-bad: an entry needs either 'command' (stdio) or 'url' (HTTP)",
        "dry run: nothing was written",
    ]
    assert list(Upstream.objects.filter(slug__startswith="imp-").values()) == before
    assert AuditEvent.objects.count() == audit_rows


def test_placeholders_are_read_from_the_environment_and_an_unset_one_is_named(cleanup, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("IMP_TOKEN", "tok&en=1")
    monkeypatch.setenv("IMP_HOST", "mcp.example.com")
    monkeypatch.delenv("IMP_MISSING", raising=False)
    remote = {
        "url": "https://${IMP_HOST}/mcp?key=${IMP_TOKEN}&plain=1",
        "headers": {"Authorization": "Bearer ${IMP_TOKEN}"},
    }
    config = {
        "mcpServers": {
            "imp-remote": remote,
            "imp-env": DEMO_ENTRY | {"env": {"TOKEN": "${IMP_TOKEN}", "OTHER": "${IMP_MISSING}"}},
            "imp-header": {"url": "https://example.com/mcp", "headers": {"X-Key": "${IMP_MISSING}"}},
            "imp-query": {"url": "https://example.com/mcp?key=${IMP_MISSING}"},
        }
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    with pytest.raises(CommandError, match="^3 of 4 entries"):
        call_command("import_mcp_config", str(path), "--no-sync")
    assert capsys.readouterr().out.splitlines() == [
        "created  imp-remote",
        "rejected imp-env: env.OTHER: the environment variable IMP_MISSING is not set",
        "rejected imp-header: headers.X-Key: the environment variable IMP_MISSING is not set",
        "rejected imp-query: url's query.key: the environment variable IMP_MISSING is not set",
    ]
    imported = Upstream.objects.get(slug="imp-remote")
    assert imported.url == "https://mcp.example.com/mcp"
    assert credentials_open(imported.query) == {"key": "tok&en=1", "plain": "1"}  # not read as URL syntax
    assert credentials_open(imported.headers) == {"Authorization": "Bearer tok&en=1"}


def test_each_sync_is_announced_before_it_starts(command_env, cleanup, tmp_path):
    """The progress line reaches a pipe while the sync still waits: the upstream answers nothing until the
    test, having read the line, releases it."""
    release = tmp_path / "release"
    wait = "import os, sys, time\nwhile not os.path.exists(sys.argv[1]):\n    time.sleep(0.05)"
    hangs = {"command": sys.executable, "args": ["-c", wait, str(release)]}
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"mcpServers": {"imp-time": TIME, "imp-hangs": hangs}}))
    command = [sys.executable, str(servers.ROOT / "manage.py"), "import_mcp_config", str(path)]
    process = subprocess.Popen(command, env=command_env, cwd=servers.ROOT, stdout=subprocess.PIPE, text=True)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line.rstrip("\n")) for line in process.stdout], daemon=True).start()
    try:
        seen = [lines.get(timeout=30) for _ in range(5)]
        assert process.poll() is None  # still waiting on imp-hangs
    finally:
        release.touch()
    assert process.wait(timeout=60) == 1
    seen.append(lines.get(timeout=5))
    assert seen[:3] == ["created  imp-time", "created  imp-hangs", "syncing imp-time…"]
    assert re.fullmatch(rf"imp-time: 2 added, 0 changed, 0 removed, 0 rejected {SECONDS}", seen[3])
    assert seen[4] == "syncing imp-hangs…"
    assert re.fullmatch(rf"imp-hangs: catalog sync failed: .+ {SECONDS}", seen[5])


SECRETS = {"IMP_DEMO_ENV_API_TOKEN": "env-s3cret", "IMP_MANUAL_HEADER_AUTHORIZATION": "Bearer hdr-s3cret"}
SECRETS |= {"IMP_MANUAL_QUERY_API_KEY": "q-s3cret", "IMP_LEGACY_HEADER_X_API_KEY": "sse-s3cret"}


def _state(slug: str) -> dict:
    upstream = Upstream.objects.get(slug=slug)
    fields = {f: getattr(upstream, f) for f in ("name", "transport", "command", "args", "cwd", "url", "internal")}
    fields |= {f: getattr(upstream, f) for f in ("prefixed", "handoff_only")}
    fields |= {f: credentials_open(getattr(upstream, f)) for f in Upstream.SECRET_MAPS}
    return fields | {"routes": list(upstream.handoff_routes.values_list("domain", "description"))}


def test_an_export_imports_back_into_the_same_upstreams_and_never_shows_a_secret(
    cleanup, logs, tmp_path, capsys, monkeypatch
):
    demo_http = servers.start_demo_http(logs / "imp-demo-http.log")
    sandbox = {"sandbox": {"network": "none", "paths": [f"{servers.STARTED_DIR}:rw"]}}
    config = {
        "mcpServers": {
            "imp-time": TIME,
            "Imp Demo": DEMO_ENTRY
            | {"env": {"API_TOKEN": "env-s3cret"}, "cwd": str(tmp_path), "namespace": ""}
            | sandbox,
            "Imp Docs": {
                "url": f"{demo_http.url}?api_key=q-s3cret",
                "headers": {"Authorization": "Bearer hdr-s3cret"},
                "namespace": "imp-manual",
            },
            "imp-legacy": {
                "url": "https://example.com/sse",
                "type": "sse",
                "headers": {"X-Api-Key": "sse-s3cret"},
                "handoff": {"description": "Questions about legacy systems."},
            },
        }
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    slugs = ["imp-time", "imp-demo", "imp-manual", "imp-legacy"]
    try:
        call_command("import_mcp_config", str(path), "--internal")
        imported = capsys.readouterr().out
        before = {slug: _state(slug) for slug in slugs}
        call_command("export_mcp_config")
        exported = capsys.readouterr()
        entries = json.loads(exported.out)["mcpServers"]
        mine = {name: entry for name, entry in entries.items() if name.lower().startswith("imp")}
        assert mine == {
            "Imp Demo": DEMO_ENTRY
            | {"env": {"API_TOKEN": "${IMP_DEMO_ENV_API_TOKEN}"}, "cwd": str(tmp_path), "namespace": ""}
            | sandbox,
            "Imp Docs": {
                "type": "http",
                "url": f"{demo_http.url}?api_key=${{IMP_MANUAL_QUERY_API_KEY}}",
                "headers": {"Authorization": "${IMP_MANUAL_HEADER_AUTHORIZATION}"},
                "internal": True,
                "namespace": "imp-manual",
            },
            "imp-legacy": {
                "type": "sse",
                "url": "https://example.com/sse",
                "headers": {"X-Api-Key": "${IMP_LEGACY_HEADER_X_API_KEY}"},
                "internal": True,
                "handoff": {"description": "Questions about legacy systems."},
            },
            "imp-time": TIME,
        }
        assert set(SECRETS) <= set(re.findall(r"[A-Z_]+", exported.err))
        Upstream.objects.filter(slug__in=slugs).delete()
        path.write_text(json.dumps({"mcpServers": mine}))
        for variable, value in SECRETS.items():
            monkeypatch.setenv(variable, value)
        call_command("import_mcp_config", str(path))
        again = capsys.readouterr().out
        after = {slug: _state(slug) for slug in slugs}
    finally:
        demo_http.stop()
        HandoffRoute.objects.filter(domain="imp-legacy").delete()
    assert after == before
    assert "imp-manual: " in again and "catalog sync failed" not in imported + again
    for secret in ["s3cret", *SECRETS.values()]:
        assert secret not in imported + exported.out + exported.err + again


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        (
            [{"slug": "imp-a", "env": {"X-Y": "1", "X_Y": "2"}}],
            "imp-a env 'X-Y' and imp-a env 'X_Y' would share the variable IMP_A_ENV_X_Y: rename one",
        ),
        (
            [{"slug": "imp-one", "name": "imp-two"}, {"slug": "imp-two"}],
            "upstreams 'imp-one' and 'imp-two' would both be named 'imp-two': rename one",
        ),
        (
            [{"slug": "imp-spec", "handoff_only": True}],
            "'imp-spec' is a handoff target with no handoff route, which the file cannot say",
        ),
    ],
)
def test_an_export_the_import_could_not_read_back_is_refused_naming_why(cleanup, capsys, rows, message):
    for row in rows:
        upstream_save(upstream=Upstream(transport="stdio", command="/bin/true", **row), created=True)
    with pytest.raises(CommandError) as raised:
        call_command("export_mcp_config")
    assert (str(raised.value), capsys.readouterr().out) == (message, "")


def test_a_per_person_entry_imports_and_exports_back_with_its_client_as_placeholders(cleanup, tmp_path, capsys):
    person = {"connect": "exchange", "exchangeUrl": "https://idp.example.com/token", "scope": "tracker"}
    person |= {"client": {"client_id": "${IMP_CLIENT_ID}", "client_secret": "${IMP_CLIENT_SECRET}"}}
    config = {
        "mcpServers": {
            "imp-tracker": {"url": "https://tracker.example.com/mcp", "perPerson": person},
            "imp-desk": DEMO_ENTRY | {"perPerson": {"slot": "env:DESK_TOKEN"}},
            "imp-odd": {"url": "https://example.com/mcp", "perPerson": {"connect": "magic"}},
            "imp-extra": {"url": "https://example.com/mcp", "perPerson": {"via": "x"}},
        }
    }
    environ = {"IMP_CLIENT_ID": "gateway", "IMP_CLIENT_SECRET": "s3cret-client-value"}
    report = mcp_config_import(config=config, environ=environ)
    assert [entry.line() for entry in report.rejected] == [
        "rejected imp-odd: 'perPerson.connect' must be one of token, oauth, exchange",
        "rejected imp-extra: 'perPerson' must be an object of audience, client, connect, exchangeUrl, scope, slot",
    ]
    tracker, desk = Upstream.objects.get(slug="imp-tracker"), Upstream.objects.get(slug="imp-desk")
    assert (tracker.per_person, tracker.person_connect, tracker.person_slot) == (True, "exchange", "bearer")
    assert (tracker.exchange_url, tracker.person_scope) == ("https://idp.example.com/token", "tracker")
    assert "s3cret-client-value" not in json.dumps(tracker.person_client)
    assert credentials_open(tracker.person_client) == {"client_id": "gateway", "client_secret": "s3cret-client-value"}
    assert (desk.per_person, desk.person_connect, desk.person_slot) == (True, "token", "env:DESK_TOKEN")
    exported = mcp_config_export().config["mcpServers"]
    assert exported["imp-tracker"]["perPerson"] == {
        "connect": "exchange",
        "slot": "bearer",
        "scope": "tracker",
        "exchangeUrl": "https://idp.example.com/token",
        "client": {
            "client_id": "${IMP_TRACKER_CLIENT_CLIENT_ID}",
            "client_secret": "${IMP_TRACKER_CLIENT_CLIENT_SECRET}",
        },
    }
    assert exported["imp-desk"]["perPerson"] == {"connect": "token", "slot": "env:DESK_TOKEN"}
