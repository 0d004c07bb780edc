"""Upstream registration: the mcpServers import, catalog sync through both executors, exposed names."""

import json
import re
import sys

import pytest
import redis
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings

from registry.credentials import credentials_open
from registry.executor import CeleryExecutor
from registry.models import Tool, Upstream
from registry.naming import exposed_name, split_exposed_name
from registry.publish import task_envelope
from registry.services import upstream_catalog_sync, upstream_save
from registry.tasks import request_task
from tests.conftest import BIN, needs
from tests.factories import DEMO, demo_upstream
from tests.servers import ROOT

DEMO_TOOLS = {
    "echo",
    "add",
    "fail",
    "sleep",
    "crash",
    "pid",
    "raise",
    "bad_output",
    "header",
    "query",
    "progress",
    "leak",
    "env",
    "trace",
    "ask",
    "announce",
    "log",
    "needs_sampling",
    "nested",
}


def test_import_mcp_config_creates_updates_skips_and_rejects_with_reasons(db, tmp_path, capsys):
    config = {
        "mcpServers": {
            "Imported Time": {"command": str(BIN / "mcp-server-time"), "args": ["--local-timezone", "UTC"]},
            "remote-docs": {"url": "http://127.0.0.1:9/mcp", "headers": {"Authorization": "Bearer s3cret"}},
            "legacy-sse": {"url": "http://127.0.0.1:9/sse?api_key=q-s3cret", "type": "sse"},
            "metadata": {"url": "http://169.254.169.254/latest/mcp"},
            "off": {"command": "true", "disabled": True},
            "neither": {"foo": 1},
            "odd-type": {"url": "http://127.0.0.1:9/x", "type": "carrier-pigeon"},
        }
    }
    path = tmp_path / "claude_desktop_config.json"
    path.write_text(json.dumps(config))
    try:
        with pytest.raises(CommandError):  # two entries are rejected
            call_command("import_mcp_config", str(path), "--no-sync", "--internal")
        first = capsys.readouterr().out.splitlines()
        config["mcpServers"]["remote-docs"]["url"] = "http://127.0.0.1:9/v2/mcp"
        path.write_text(json.dumps(config))
        with pytest.raises(CommandError):
            call_command("import_mcp_config", str(path), "--no-sync", "--internal")
        second = capsys.readouterr().out.splitlines()
        assert first == [
            "created  imported-time",
            "created  remote-docs",
            "created  legacy-sse",
            "created  metadata",
            "skipped  off: marked disabled in the file",
            "rejected neither: an entry needs either 'command' (stdio) or 'url' (HTTP)",
            "rejected odd-type: unknown transport type 'carrier-pigeon'",
        ]
        assert (
            "updated  remote-docs" in second
            and "skipped  Imported Time: upstream 'imported-time' is already up to date" in second
        )
        docs = Upstream.objects.get(slug="remote-docs")
        assert (docs.transport, docs.revision, list(docs.headers)) == ("streamable_http", 2, ["Authorization"])
        assert "s3cret" not in docs.headers["Authorization"]  # sealed at rest; only the executor opens it
        assert credentials_open(docs.headers) == {"Authorization": "Bearer s3cret"}
        sse = Upstream.objects.get(slug="legacy-sse")
        assert (sse.transport, sse.url) == ("sse", "http://127.0.0.1:9/sse")  # the key moved to `query`, sealed
        assert "q-s3cret" not in json.dumps(sse.query) and credentials_open(sse.query) == {"api_key": "q-s3cret"}
        assert "s3cret" not in json.dumps(list(docs_audit_details()))
    finally:
        Upstream.objects.filter(slug__in=["imported-time", "remote-docs", "legacy-sse", "metadata"]).delete()


def test_import_refuses_private_addresses_unless_told_they_are_internal(db, tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"mcpServers": {"metadata": {"url": "http://169.254.169.254/latest/mcp"}}}))
    with pytest.raises(CommandError):
        call_command("import_mcp_config", str(path), "--no-sync")
    assert capsys.readouterr().out.splitlines() == [
        "rejected metadata: url: 169.254.169.254 is not a public address. "
        'Pass --internal, or set "internal": true on the entry, to allow it.'
    ]
    assert not Upstream.objects.filter(slug="metadata").exists()


def docs_audit_details():
    from audit.models import AuditEvent

    return AuditEvent.objects.filter(upstream="remote-docs").values_list("detail", flat=True)


def test_import_then_sync_lists_the_new_upstreams_tools(db, tmp_path, capsys):
    path = tmp_path / "config.json"
    demo = [str(ROOT / "examples/demo_upstream.py")]
    path.write_text(json.dumps({"mcpServers": {"demo-two": {"command": sys.executable, "args": demo}}}))
    try:
        call_command("import_mcp_config", str(path))
        report = rf"demo-two: {len(DEMO_TOOLS)} added, 0 changed, 0 removed, 0 rejected \(\d+\.\d s\)"
        assert re.fullmatch(report, capsys.readouterr().out.splitlines()[-1])
        assert set(Tool.objects.filter(upstream__slug="demo-two").values_list("name", flat=True)) == DEMO_TOOLS
    finally:
        Upstream.objects.filter(slug="demo-two").delete()


def test_an_unreachable_upstream_fails_sync_with_a_reason_and_no_secrets(db):
    upstream = Upstream(slug="ghost", transport="stdio", command="/nonexistent/server", env={"API_TOKEN": "hunter2"})
    upstream_save(upstream=upstream, created=True)
    try:
        report = upstream_catalog_sync(upstream=upstream)
        upstream.refresh_from_db()
    finally:
        upstream.delete()
    assert not report.ok
    assert (
        report.summary()
        == "ghost: catalog sync failed: UPSTREAM_UNAVAILABLE: The service could not be reached. Try later. "
        "(cause: command not found: /nonexistent/server)"
    )
    assert "hunter2" not in upstream.last_sync_error


def test_catalog_sync_runs_on_the_celery_worker_too(world, celery_worker):
    demo = Upstream.objects.get(slug="demo")
    with override_settings(GATEWAY_EXECUTOR="celery"):
        outcome = CeleryExecutor().list_tools(upstream_id=demo.id, revision=demo.revision, timeout=5)
    assert outcome["ok"], outcome
    assert {tool["name"] for tool in outcome["result"]["tools"]} == DEMO_TOOLS


def test_a_changed_connection_bumps_the_revision_so_executors_reconnect(db):
    upstream = Upstream(slug="rev", transport="stdio", command="a")
    upstream_save(upstream=upstream, created=True)
    try:
        upstream.timeout = 5
        upstream_save(upstream=upstream)
        assert upstream.revision == 1
        upstream.args = ["--verbose"]
        upstream_save(upstream=upstream)
        assert Upstream.objects.get(pk=upstream.pk).revision == 2
    finally:
        upstream.delete()


@pytest.mark.parametrize("slug", ["Time", "my_server", "a.b", "-x", "x-", "1abc", "a--b", ""])
def test_slugs_that_could_blur_the_namespace_are_refused(slug):
    from django.core.exceptions import ValidationError

    with pytest.raises(ValidationError):
        Upstream(slug=slug, transport="stdio", command="x").full_clean(exclude=["group"])


@pytest.mark.parametrize(
    ("url", "error"),
    [
        ("http://u:pw@127.0.0.1:9/mcp", "Credentials in the URL would be stored and shown in clear: put them in a "
         "header, which is sealed."),
        ("http://127.0.0.1:9/mcp?key=a&key=b", "The URL's query names a parameter twice; each may appear once."),
    ],
)  # fmt: skip
def test_a_url_that_would_show_a_secret_or_lose_a_parameter_is_refused(db, url, error):
    from django.core.exceptions import ValidationError

    upstream = Upstream(slug="urls", transport="streamable_http", url=url, internal=True)
    with pytest.raises(ValidationError) as refused:
        upstream.full_clean(exclude=["group"])
    assert refused.value.message_dict["url"] == [error]


def test_long_names_are_shortened_deterministically_and_stay_distinct():
    a = exposed_name("github", "x" * 80 + "_list_issues")
    b = exposed_name("github", "x" * 80 + "_list_pulls")
    assert len(a) == len(b) == 64
    assert a != b and a == exposed_name("github", "x" * 80 + "_list_issues")
    assert a.startswith("github__xxx")
    assert exposed_name("time", "get_current_time") == "time__get_current_time"


def test_exposed_names_split_at_the_first_separator_only():
    assert split_exposed_name("my-api__get__thing") == ("my-api", "get__thing")
    assert split_exposed_name("notnamespaced") is None
    assert split_exposed_name("bad name__x") is None
    with override_settings(GATEWAY_TOOL_SEPARATOR="."):
        assert split_exposed_name("time.get_current_time") == ("time", "get_current_time")


def test_stdio_arguments_reach_the_server_as_a_list_never_through_a_shell(db, tmp_path):
    marker = tmp_path / "shell-ran"
    args = DEMO + [f"$(touch {marker})", f"; touch {marker}", f"`touch {marker}`"]
    with demo_upstream("no-shell", args=args) as upstream:  # its first catalog sync started the server
        assert upstream_catalog_sync(upstream=upstream).ok
    assert not marker.exists()


def test_the_event_loop_publishes_exactly_what_apply_async_would(db, settings):
    """registry/publish.py builds the message kombu would push; if Celery or kombu change it, this says so."""
    needs(bool(settings.REDIS_URL), "REDIS_URL is not set")
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    request = {
        "upstream_id": 1,
        "revision": 2,
        "method": "tools/call",
        "params": {"name": "echo", "arguments": {"text": "é"}},
    }
    kwargs = {"request": request | {"timeout": 5.0}, "reply_to": "sb:reply:x"}
    client.delete("publish-probe")
    request_task.apply_async(kwargs=kwargs, queue="publish-probe", expires=5.0)
    theirs = json.loads(client.rpop("publish-probe"))
    ours = json.loads(task_envelope(request_task, kwargs=kwargs, queue="publish-probe", expires=5.0))
    # Each message's MAC has its own nonce (gateway_project/lib/task_mac.py): both carry one, and differ there.
    varying = {"id", "root_id", "expires", "switchboard_mac"}, {"correlation_id", "reply_to", "delivery_tag"}
    for message in (theirs, ours):
        assert message["headers"].pop("origin").startswith("gen")
        for field in varying[0]:
            message["headers"].pop(field)
        for field in varying[1]:
            message["properties"].pop(field)
    assert ours == theirs
