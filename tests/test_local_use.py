"""Single-server and local use: upstreams exposed without a prefix, and the anonymous agent."""

import json
import sys

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from audit.models import AuditEvent
from registry.models import Tool, Upstream
from registry.services import upstream_catalog_sync
from tests.clients import api, call, sdk_client, tool_names
from tests.factories import DEMO, demo_upstream
from tests.helpers import audit_mark, audit_since, eventually, run
from tests.servers import inline_gateway_with
from tests.test_mcp_errors import LIST, bearer, post


def offered(gateway, key: str, name: str) -> set[str]:
    """The agent's tool names once the gateway offers `name` (its snapshot follows the database shortly)."""
    return eventually(lambda: name in (names := run(lambda: tool_names(gateway.url, key))) and names)


def test_import_sets_the_namespace_from_the_entry(db, tmp_path, capsys):
    demo = {"command": sys.executable, "args": DEMO}
    config = {
        "mcpServers": {
            "Local Demo": demo | {"namespace": ""},
            "renamed": demo | {"namespace": "clock"},
            "bad-prefix": demo | {"namespace": "Not A Slug"},
            "odd": demo | {"namespace": 7},
        }
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    try:
        with pytest.raises(CommandError, match="2 of 4 entries were rejected or failed to sync"):
            call_command("import_mcp_config", str(path), "--no-sync")
        assert capsys.readouterr().out.splitlines() == [
            "created  local-demo",
            "created  clock",
            "rejected bad-prefix: slug: Lower-case letters and digits in words joined by single hyphens, "
            "starting with a letter.",
            "rejected odd: 'namespace' must be a string: the prefix, or \"\" for the upstream's own names",
        ]
        assert Upstream.objects.get(slug="local-demo").prefixed is False
        assert Upstream.objects.get(slug="clock").prefixed is True
    finally:
        Upstream.objects.filter(slug__in=["local-demo", "clock"]).delete()


def test_an_unprefixed_upstream_keeps_its_names_and_a_colliding_one_is_refused_at_sync(db):
    with demo_upstream("plain", prefixed=False) as plain, demo_upstream("twin") as twin:
        assert set(plain.tools.values_list("name", flat=True)) >= {"echo", "add"}
        twin.prefixed = False
        twin.save()
        report = upstream_catalog_sync(upstream=twin)
        assert report.ok and "'echo': its name 'echo' is already exposed by upstream 'plain'" in report.rejected
        twin.refresh_from_db()
        assert twin.last_sync_error.startswith("Refused (name collisions): 'echo': its name 'echo' is already")
        assert not Tool.objects.filter(upstream=twin).exists()  # its tools left: plain still owns the names


def test_an_unprefixed_upstream_may_not_name_a_tool_inside_another_upstreams_namespace(db, tmp_path):
    """Tool shadowing: `victim__wipe` from another server would pass for victim's tool, out of reach of the
    rules that name victim, though victim has no tool of that name."""
    manifest = tmp_path / "manifest.json"
    schema = {"type": "object", "properties": {}}
    names = ["victim__wipe", "switchboard__route", "nobody__own"]
    manifest.write_text(json.dumps({"tools": [{"name": name, "inputSchema": schema} for name in names]}))
    with demo_upstream("victim"), demo_upstream("shadow", prefixed=False, env={"DEMO_MANIFEST": str(manifest)}) as up:
        kept = set(up.tools.values_list("name", flat=True))
        up.refresh_from_db()
    assert "nobody__own" in kept and not {"victim__wipe", "switchboard__route"} & kept
    assert "'victim__wipe': it would take upstream 'victim''s namespace" in up.last_sync_error
    assert "'switchboard__route': it would take the gateway's own namespace" in up.last_sync_error


def test_unprefixed_tools_are_listed_and_called_by_their_own_names(inline_gateway, world):
    with demo_upstream("plain", prefixed=False):
        names = offered(inline_gateway, world.key, "echo")
        assert {"echo", "add", "time__get_current_time"} <= names and "plain__echo" not in names
        result = run(lambda: call(inline_gateway.url, world.key, "echo", {"text": "hi"}, mode="2026-07-28"))
        assert result.content[0].text == "hi"


def test_the_api_switches_the_prefix_off_and_sync_follows(inline_gateway, world, admin_token):
    with demo_upstream("switchable"):
        changed = api(inline_gateway, "PATCH", "upstreams/switchable", admin_token, json={"prefixed": False})
        assert (changed.status_code, changed.json()["prefixed"]) == (200, False)
        names = offered(inline_gateway, world.key, "pid")
        assert "switchable__pid" not in names


@pytest.fixture(scope="module")
def anonymous_gateway(server_env, world, logs):
    with inline_gateway_with(server_env, logs / "anonymous.log", GATEWAY_ANONYMOUS_AGENT="alice") as gateway:
        yield gateway


def test_requests_without_credentials_act_as_the_anonymous_agent(anonymous_gateway, world):
    mark = audit_mark()

    async def scenario():
        async with sdk_client(anonymous_gateway.url, None, "legacy") as client:
            return await client.call_tool("demo__echo", {"text": "anonymous"})

    assert run(scenario).content[0].text == "anonymous"
    rows = [r for r in audit_since(mark) if r.kind in (AuditEvent.Kind.APPROVED, AuditEvent.Kind.COMPLETED)]
    assert [(r.kind, r.agent_name, r.exposed_name) for r in rows] == [
        ("approved", "alice", "demo__echo"),
        ("completed", "alice", "demo__echo"),
    ]
    assert "GATEWAY_ANONYMOUS_AGENT is set: requests without credentials act as agent 'alice'" in (
        anonymous_gateway.log.read_text()
    )


def test_wrong_credentials_are_refused_even_with_an_anonymous_agent(anonymous_gateway):
    wrong = post(anonymous_gateway, json.dumps(LIST), **bearer("sb_000000000000_wrong"))
    basic = post(anonymous_gateway, json.dumps(LIST), authorization="Basic YWxpY2U6eA==")
    assert (wrong.status_code, basic.status_code) == (401, 401)
