"""An admin's switch reaches every gateway process within the snapshot check interval, without a restart."""

from mcp.shared.exceptions import MCPError

from policy.models import ServerGroup
from registry.models import Upstream
from registry.services import upstream_set_enabled
from tests.clients import sdk_client
from tests.helpers import audit_mark, audit_since, eventually, run


def _list_and_call(gateway, key) -> tuple[set[str], MCPError | None]:
    async def scenario():
        async with sdk_client(gateway.url, key, "legacy") as client:
            names = {tool.name for tool in (await client.list_tools()).tools}
            try:
                await client.call_tool("demo__echo", {"text": "hello"})
            except MCPError as refused:
                return names, refused
            return names, None

    return run(scenario)


def _once(gateway, key, refused: bool):
    """The listing and the refusal once the gateway both lists and treats demo__echo as switched off (or on),
    else None: within the snapshot interval the list and the call may each see the other side of a switch."""
    names, error = _list_and_call(gateway, key)
    return (names, error) if (error is not None) == refused == ("demo__echo" not in names) else None


def test_disabled_upstream_disappears_from_tools_list_in_another_process_and_calls_are_refused(gateway, world):
    demo = Upstream.objects.get(slug="demo")
    names, _ = eventually(lambda: _once(gateway, world.key, refused=False))
    assert "demo__echo" in names
    mark = audit_mark()
    upstream_set_enabled(upstream=demo, enabled=False, actor="tests")
    try:
        names, refused = eventually(lambda: _once(gateway, world.key, refused=True))
    finally:
        upstream_set_enabled(upstream=demo, enabled=True, actor="tests")
    assert not any(name.startswith("demo__") for name in names)
    assert "time__get_current_time" in names
    assert refused.code == -32001 and refused.data["code"] == "UPSTREAM_DISABLED"
    rows = audit_since(mark)
    assert [(r.actor, r.detail["action"]) for r in rows if r.kind == "admin_change"] == [
        ("tests", "upstream_disabled"),
        ("tests", "upstream_enabled"),
    ]
    denied = [r for r in rows if r.kind == "denied"]
    assert {(r.upstream, r.tool, r.error_code) for r in denied} == {("demo", "echo", "UPSTREAM_DISABLED")}
    refused_ids = {r.request_id for r in denied}
    assert not [r for r in rows if r.request_id in refused_ids and r.kind != "denied"], "a refused call ran"
    eventually(lambda: _once(gateway, world.key, refused=False))


def test_a_disabled_group_hides_its_upstreams(inline_gateway, world):
    group = ServerGroup.objects.create(name="tools-under-maintenance", enabled=False)
    demo = Upstream.objects.get(slug="demo")
    demo.group = group
    demo.save()
    try:
        names, refused = eventually(lambda: _once(inline_gateway, world.key, refused=True))
    finally:
        demo.group = None
        demo.save()
        group.delete()
    assert not any(name.startswith("demo__") for name in names)
    assert refused.data["code"] == "UPSTREAM_DISABLED"
    eventually(lambda: _once(inline_gateway, world.key, refused=False))
