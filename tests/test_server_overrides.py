"""Overrides per virtual server (issue 38) end to end: the official SDK client through /mcp/s/<name> of a live
gateway sees the server's own presentation of a tool (on top of the upstream's override) and calls it, the upstream
receives the fixed value, and the audit digest is of what it receives; /mcp and other virtual servers still see the
tool as before; the REST API sets, reads, refuses (each with its exact error) and clears such overrides."""

from collections.abc import Iterator

import pytest
from mcp.shared.exceptions import MCPError

from audit.services import canonical_sha256
from policy.models import Team
from registry.models import Tool, VirtualServer
from registry.server_overrides import server_override_set
from registry.services import tool_override_set
from tests.clients import api, sdk_client, tool_names
from tests.factories import demo_upstream
from tests.helpers import audit_mark, audit_since, eventually, run
from tests.test_team_names import _operator
from tests.test_tool_overrides import SUM
from tests.test_virtual_servers import _offered

TALLY = "/mcp/s/tally"
TOOLS = {"tally": "staged__add", "plain": "staged__*"}


async def call(base_url: str, key: str, name: str, arguments: dict, path: str = "/mcp") -> object:
    """The result of one call at the endpoint, or the MCPError it was refused with."""
    async with sdk_client(base_url, key, "legacy", path=path) as client:
        try:
            return await client.call_tool(name, arguments)
        except MCPError as refused:
            return refused


@pytest.fixture
def tally(db) -> Iterator[VirtualServer]:
    # tally names the tool it renames exactly: what it offers is matched by the name /mcp lists
    servers = [VirtualServer.objects.create(name=name, tools=[tools]) for name, tools in TOOLS.items()]
    yield servers[0]
    for server in servers:
        server.delete()


def test_a_servers_override_is_seen_and_called_through_it_only_and_the_upstream_gets_the_fixed_value(
    inline_gateway, world, tally
):
    with demo_upstream("staged") as upstream:
        add = Tool.objects.get(upstream=upstream, name="add")
        tool_override_set(tool=add, data={"params": {"a": {"name": "first"}}}, actor="olga")  # the upstream's
        server_override_set(
            server=tally, tool=add, data={"name": "sum", "params": {"b": {"value": 10}}}, actor="olga"
        )  # the server's, naming parameters as /mcp shows them
        offered = eventually(
            lambda: (n := _offered(inline_gateway, world.key, "legacy", TALLY)) and "staged__sum" in n and n
        )
        plain = _offered(inline_gateway, world.key, "legacy", "/mcp/s/plain")
        everything = run(lambda: tool_names(inline_gateway.url, world.key))
        mark = audit_mark()
        answered = run(lambda: call(inline_gateway.url, world.key, "staged__sum", {"first": 5}, path=TALLY))
        fixed = run(lambda: call(inline_gateway.url, world.key, "staged__sum", {"first": 5, "b": 1}, path=TALLY))
        old = run(lambda: call(inline_gateway.url, world.key, "staged__add", {"first": 5, "b": 1}, path=TALLY))
        at_mcp = run(lambda: call(inline_gateway.url, world.key, "staged__sum", {"first": 5}))
        rows = audit_since(mark)

    assert "staged__add" not in offered and {"staged__add", "staged__echo"} <= plain
    assert "staged__add" in everything and "staged__sum" not in everything
    assert answered.content[0].text == "15"
    assert isinstance(fixed, MCPError) and fixed.data["code"] == "INVALID_ARGUMENTS"
    assert (
        fixed.message
        == "Invalid arguments for 'staged__sum': Additional properties are not allowed ('b' was unexpected)"
    )
    assert isinstance(old, MCPError) and old.data["code"] == "TOOL_NOT_FOUND"
    assert isinstance(at_mcp, MCPError) and at_mcp.data["code"] == "TOOL_NOT_FOUND"
    [approved] = [r for r in rows if r.kind == "approved"]
    assert (approved.tool, approved.exposed_name, approved.server) == ("add", "staged__sum", "tally")
    assert approved.arguments_sha256 == canonical_sha256({"a": 5, "b": 10})


def test_the_api_sets_reads_refuses_and_clears_a_servers_override(inline_gateway, world, tally):
    team = Team.objects.get(slug="default")
    _, token = _operator("vera", team, "view_virtualserver", "change_virtualserver")
    _, reader = _operator("rita", team, "view_virtualserver")
    with demo_upstream("staged") as upstream:
        path = "virtual-servers/tally/overrides/staged/add"
        hidden = api(inline_gateway, "PUT", path, token, json={"params": {"a": {"hidden": True}}})
        unknown = api(inline_gateway, "PUT", "virtual-servers/tally/overrides/staged/nothing", token, json=SUM)
        forbidden = api(inline_gateway, "PUT", path, reader, json=SUM)
        given = api(inline_gateway, "PUT", path, token, json=SUM)
        listed = api(inline_gateway, "GET", "virtual-servers/tally/overrides", token)
        eventually(lambda: "staged__sum" in _offered(inline_gateway, world.key, "legacy", TALLY))
        cleared = api(inline_gateway, "DELETE", path, token)
        after = api(inline_gateway, "GET", path, token)
        back = eventually(
            lambda: (n := _offered(inline_gateway, world.key, "legacy", TALLY)) and "staged__add" in n and n
        )
        del upstream

    assert (hidden.status_code, hidden.json()) == (
        400,
        {"override": ["Parameter 'a' is required: give it a fixed value to hide it."]},
    )
    assert (unknown.status_code, unknown.json()) == (
        404,
        {"detail": "The catalog has no tool 'nothing' of upstream 'staged'."},
    )
    assert (forbidden.status_code, forbidden.json()) == (
        403,
        {"detail": "Overriding a virtual server's tool needs the permission to change virtual servers."},
    )
    assert (given.status_code, given.json()) == (200, SUM)
    assert listed.json() == {"staged/add": SUM}
    assert (cleared.status_code, after.json()) == (204, {})
    assert "staged__sum" not in back
