"""Virtual servers in the mcpServers file (docs/import.md): export_mcp_config writes them beside `mcpServers` (a
key other clients ignore), with their own tool overrides; import_mcp_config creates or updates them (never removes
one), says so per server, and rejects a server it cannot apply, naming why, with exit status 1."""

import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from registry.models import VirtualServer
from registry.server_overrides import server_override_set, server_overrides_json
from tests.factories import unrouted_handoff_targets_removed
from tests.registry.test_overrides import weather  # noqa: F401 (a fixture)


@pytest.fixture
def desk(weather) -> Iterator[VirtualServer]:  # noqa: F811
    unrouted_handoff_targets_removed()
    server = VirtualServer.objects.create(name="mcp-desk", title="Desk", tools=["meteo__*"])
    server_override_set(server=server, tool=weather, data={"name": "outlook"}, actor="test")
    yield server
    VirtualServer.objects.filter(name__in=("mcp-desk", "mcp-bad")).delete()


def _imported(path: Path, *args: str) -> list[str]:
    out = io.StringIO()
    call_command("import_mcp_config", str(path), "--no-sync", *args, stdout=out)
    return [line for line in out.getvalue().splitlines() if "'mcp-desk'" in line or "dry run" in line]


def test_virtual_servers_are_exported_beside_mcp_servers_and_imported_back(desk, tmp_path):
    out = io.StringIO()
    call_command("export_mcp_config", stdout=out, stderr=io.StringIO())
    exported = json.loads(out.getvalue())
    path = tmp_path / "mcp.json"
    path.write_text(out.getvalue())
    desk.delete()
    dry = _imported(path, "--dry-run")
    assert not VirtualServer.objects.filter(name="mcp-desk").exists()
    created = _imported(path)
    again = _imported(path)

    assert exported["virtualServers"]["mcp-desk"] == {
        "team": "default",
        "title": "Desk",
        "instructions": "",
        "tools": ["meteo__*"],
        "resources": [],
        "prompts": [],
        "enabled": True,
        "overrides": {"meteo/weather": {"name": "outlook"}},
    }
    assert "meteo" in exported["mcpServers"]
    assert dry == ["would create virtual server 'mcp-desk'", "dry run: nothing was written"]
    assert created == ["created  virtual server 'mcp-desk'"]
    server = VirtualServer.objects.get(name="mcp-desk")
    assert (server.title, server_overrides_json(server=server)) == ("Desk", {"meteo/weather": {"name": "outlook"}})
    assert again == ["skipped  virtual server 'mcp-desk': already up to date"]


def test_a_virtual_server_the_import_cannot_apply_is_rejected_naming_why_and_the_others_go_on(desk, tmp_path):
    path = tmp_path / "mcp.json"
    servers = {
        "mcp-bad": {"tools": "meteo__*"},
        "mcp-desk": {"tools": ["meteo__*"], "overrides": {"meteo/gone": {"name": "x"}}},
        "mcp-new": {"tools": ["meteo__alerts"], "team": "nowhere"},
    }
    path.write_text(json.dumps({"mcpServers": {}, "virtualServers": servers}))
    out = io.StringIO()
    with pytest.raises(CommandError) as raised:
        call_command("import_mcp_config", str(path), "--no-sync", stdout=out)
    (tmp_path / "broken.json").write_text(json.dumps({"mcpServers": {}, "virtualServers": []}))
    with pytest.raises(CommandError) as unusable:
        call_command("import_mcp_config", str(tmp_path / "broken.json"), "--no-sync", stdout=io.StringIO())

    assert out.getvalue().splitlines() == [
        "rejected virtual server 'mcp-bad': tools: A list of exposed tool names or patterns, each 1 to 1024 "
        "characters.",
        "rejected virtual server 'mcp-desk': overrides 'meteo/gone', which the gateway's catalog does not have "
        "(sync it first)",
        "rejected virtual server 'mcp-new': it names team 'nowhere', which this gateway does not have",
    ]
    assert (str(raised.value), raised.value.returncode) == ("3 of 3 entries were rejected or failed to sync", 1)
    assert server_overrides_json(server=desk) == {"meteo/weather": {"name": "outlook"}}
    assert (str(unusable.value), unusable.value.returncode) == (
        f"{tmp_path / 'broken.json'}: 'virtualServers' must be a JSON object of virtual servers by name.",
        2,
    )
