"""An admin's switch takes effect in every gateway process at once, without a restart."""

from mcp.shared.exceptions import MCPError

from policy.models import ServerGroup
from registry.models import Upstream
from registry.services import upstream_set_enabled
from tests.clients import sdk_client
from tests.helpers import audit_mark, audit_since, run


def _list_and_call(gateway, key):
    async def scenario():
        async with sdk_client(gateway.url, key, "legacy") as client:
            names = {tool.name for tool in (await client.list_tools()).tools}
            try:
                await client.call_tool("demo__echo", {"text": "hello"})
            except MCPError as refused:
                return names, refused
            return names, None

    return run(scenario)


def test_disabled_upstream_disappears_from_tools_list_in_another_process_and_calls_are_refused(gateway, world):
    demo = Upstream.objects.get(slug="demo")
    names, refused = _list_and_call(gateway, world.key)
    assert "demo__echo" in names and refused is None
    mark = audit_mark()
    upstream_set_enabled(upstream=demo, enabled=False, actor="tests")
    try:
        names, refused = _list_and_call(gateway, world.key)
    finally:
        upstream_set_enabled(upstream=demo, enabled=True, actor="tests")
    assert not any(name.startswith("demo__") for name in names)
    assert "time__get_current_time" in names
    assert refused is not None and refused.code == -32001 and refused.data["code"] == "UPSTREAM_DISABLED"
    rows = audit_since(mark)
    assert [(r.actor, r.detail["action"]) for r in rows if r.kind == "admin_change"] == [
        ("tests", "upstream_disabled"),
        ("tests", "upstream_enabled"),
    ]
    denied = [r for r in rows if r.kind == "denied"]
    assert [(r.upstream, r.tool, r.error_code) for r in denied] == [("demo", "echo", "UPSTREAM_DISABLED")]
    assert not any(r.kind == "approved" for r in rows), "a refused call must never reach the upstream"


def test_a_disabled_group_hides_its_upstreams(inline_gateway, world):
    group = ServerGroup.objects.create(name="tools-under-maintenance", enabled=False)
    Upstream.objects.filter(slug="demo").update(group=group)
    try:
        names, refused = _list_and_call(inline_gateway, world.key)
    finally:
        Upstream.objects.filter(slug="demo").update(group=None)
        group.delete()
    assert not any(name.startswith("demo__") for name in names)
    assert refused.data["code"] == "UPSTREAM_DISABLED"
