"""Virtual servers (issue 38): a team's curated endpoint at /mcp/s/<name> offers the tools it names, from any
upstreams, under its own name, title and instructions, in both eras and over WebSocket; everything else about a
call is /mcp's, and every audit row of a call through it names it."""

from collections.abc import Iterator

import httpx2
import pytest
from mcp.shared.exceptions import MCPError
from mcp.types import DiscoverResult

from audit.models import AuditEvent
from audit.services import canonical_sha256
from policy.models import Team
from policy.services import admin_token_issue
from registry.models import Tool, VirtualServer
from registry.services import tool_override_set
from tests.clients import INITIALIZE, api, sdk_client, tool_names, ws_session
from tests.factories import agent, demo_upstream
from tests.helpers import audit_mark, audit_since, eventually, run
from tests.test_tool_overrides import SUM

SERVER = "/mcp/s/support"
OFFERED = ["demo__echo", "time__*", "every__echo"]  # tools of three upstreams: one by name, a pattern, one by name


@pytest.fixture
def support(db) -> Iterator[VirtualServer]:
    server = VirtualServer.objects.create(
        name="support", title="Support desk", instructions="Answer customers; echo what they say.", tools=OFFERED
    )
    yield server
    server.delete()


def _offered(gateway, key: str, mode: str, path: str = SERVER) -> set[str]:
    """The names the virtual server lists, once the gateway's snapshot holds it (401/404 before: empty)."""

    async def listed() -> set[str]:
        try:
            async with sdk_client(gateway.url, key, mode, path=path) as client:
                return {tool.name for tool in (await client.list_tools()).tools}
        except Exception:
            return set()

    return eventually(lambda: run(listed), timeout=10)


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
def test_a_virtual_server_lists_only_what_it_names_serves_its_own_identity_and_audits_its_name(
    inline_gateway, world, support, mode
):
    everything = run(lambda: tool_names(inline_gateway.url, world.key, mode))
    offered = _offered(inline_gateway, world.key, mode)
    mark = audit_mark()

    async def scenario():
        async with sdk_client(inline_gateway.url, world.key, mode, path=SERVER) as client:
            if mode != "legacy":  # a 2026-07-28 client learns who serves it only if it asks
                client.session.adopt(DiscoverResult.model_validate(await client.session.send_discover(mode)))
            echoed = await client.call_tool("demo__echo", {"text": "through support"})
            with pytest.raises(MCPError) as refused:
                await client.call_tool("demo__add", {"a": 1, "b": 2})  # /mcp offers it; support does not
            return client.server_info, client.instructions, echoed, refused.value

    info, instructions, echoed, refused = run(scenario)

    expected = {"demo__echo", "every__echo"} | {name for name in everything if name.startswith("time__")}
    assert offered == expected and len(expected) >= 4 and "demo__add" in everything
    assert (info.name, info.title) == ("support", "Support desk")
    assert instructions == "Answer customers; echo what they say."
    assert echoed.content[0].text == "through support"
    assert refused.error.message == (
        "The virtual server 'support' does not offer 'demo__add': call tools/list to see what it does."
    )
    rows = [row for row in audit_since(mark) if row.exposed_name in ("demo__echo", "demo__add")]
    assert {(row.kind, row.exposed_name, row.server) for row in rows} >= {
        ("approved", "demo__echo", "support"),
        ("completed", "demo__echo", "support"),
        ("denied", "demo__add", "support"),
    }
    assert next(row for row in rows if row.kind == "denied").error_code == "NOT_OFFERED"


def test_a_virtual_server_over_websocket_lists_and_calls_only_what_it_names(inline_gateway, world, support):
    _offered(inline_gateway, world.key, "legacy")

    async def scenario():
        async with ws_session(inline_gateway.url, world.key, initialize=False, path=SERVER) as session:
            hello = await session.request("initialize", INITIALIZE["params"])
            await session.ws.send('{"jsonrpc": "2.0", "method": "notifications/initialized"}')
            listed = await session.request("tools/list")
            called = await session.request("tools/call", {"name": "demo__echo", "arguments": {"text": "ws"}})
            refused = await session.request("tools/call", {"name": "demo__add", "arguments": {"a": 1, "b": 2}})
            return hello, listed, called, refused

    hello, listed, called, refused = run(scenario)
    assert hello["result"]["serverInfo"]["name"] == "support"
    names = {tool["name"] for tool in listed["result"]["tools"]}
    assert (
        "demo__echo" in names
        and "demo__add" not in names
        and all(n in ("demo__echo", "every__echo") or n.startswith("time__") for n in names)
    )
    assert called["result"]["content"][0]["text"] == "ws"
    assert "does not offer 'demo__add'" in str(refused)


def test_a_session_of_a_virtual_server_is_no_session_at_mcp(inline_gateway, world, support):
    _offered(inline_gateway, world.key, "legacy")
    headers = {"Authorization": f"Bearer {world.key}", "Accept": "application/json, text/event-stream"}
    opened = httpx2.post(f"{inline_gateway.url}{SERVER}", json=INITIALIZE, headers=headers, timeout=5)
    session = {"Mcp-Session-Id": opened.headers["mcp-session-id"], "MCP-Protocol-Version": "2025-11-25"}
    listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
    elsewhere = httpx2.post(f"{inline_gateway.url}/mcp", json=listing, headers=headers | session, timeout=5)
    assert opened.status_code == 200
    assert elsewhere.status_code == 404


def test_an_unknown_virtual_server_is_404_naming_it_and_audited_with_who_asked(inline_gateway, world, support):
    mark = audit_mark()
    headers = {"Authorization": f"Bearer {world.key}", "Accept": "application/json, text/event-stream"}
    answer = httpx2.post(f"{inline_gateway.url}/mcp/s/nowhere", json=INITIALIZE, headers=headers, timeout=5)
    assert answer.status_code == 404
    assert answer.json()["error"]["message"] == (
        "No virtual server is named 'nowhere' here (or it is disabled): /mcp serves every tool you may use"
    )
    row = eventually(lambda: [r for r in audit_since(mark) if r.error_code == "UNKNOWN_SERVER"])[0]
    assert (row.kind, row.agent_name, row.server, row.outcome) == ("denied", "alice", "nowhere", "denied")


def test_another_teams_agent_is_refused_at_a_virtual_server_with_403(inline_gateway, world, support):
    ops = Team.objects.create(slug="ops-desk", name="Ops desk")
    try:
        with agent("olive", team=ops) as (_, key):
            headers = {"Authorization": f"Bearer {key}", "Accept": "application/json, text/event-stream"}

            def answered():
                reply = httpx2.post(f"{inline_gateway.url}{SERVER}", json=INITIALIZE, headers=headers, timeout=5)
                return reply if reply.status_code != 401 else None

            answer = eventually(answered, timeout=10)
    finally:
        ops.delete()
    assert answer.status_code == 403
    assert answer.json()["error"]["message"] == (
        "The virtual server 'support' serves team 'default'; you act for team 'ops-desk'"
    )


def test_the_rest_api_makes_a_virtual_server_and_refuses_bad_ones_with_their_reason(inline_gateway, db):
    token = admin_token_issue(user=_operator(), label="virtual servers")
    made = api(inline_gateway, "POST", "virtual-servers", token, json={"name": "billing", "tools": ["demo__*"]})
    bad_name = api(inline_gateway, "POST", "virtual-servers", token, json={"name": "../admin", "tools": []})
    twice = api(inline_gateway, "POST", "virtual-servers", token, json={"name": "twice", "tools": ["a", "a"]})
    not_list = api(inline_gateway, "POST", "virtual-servers", token, json={"name": "odd", "tools": "demo__*"})
    try:
        assert made.status_code == 201, made.text
        assert made.json() | {"created_at": None, "updated_at": None} == {
            "name": "billing",
            "team": "default",
            "title": "",
            "instructions": "",
            "tools": ["demo__*"],
            "resources": [],
            "prompts": [],
            "enabled": True,
            "created_at": None,
            "updated_at": None,
        }
        assert bad_name.status_code == 400
        assert bad_name.json()["name"] == [
            "Lower-case letters and digits in words joined by single hyphens, starting with a letter."
        ]
        assert (twice.status_code, twice.json()) == (400, {"tools": ["'a' is listed twice."]})
        assert (not_list.status_code, not_list.json()) == (
            400,
            {"tools": ['Expected a list of items but got type "str".']},
        )
        made_rows = AuditEvent.objects.filter(kind="admin_change", detail__action="virtualserver_created")
        assert made_rows.filter(detail__name="billing", actor="curator").count() == 1
    finally:
        VirtualServer.objects.filter(name="billing").delete()


def _operator():
    from django.contrib.auth import get_user_model

    user, _ = get_user_model().objects.get_or_create(username="curator", defaults={"is_superuser": True})
    return user


DOCUMENTS = "every+demo://resource/static/document/*"


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
def test_a_virtual_server_offers_only_the_resources_and_prompts_it_names(inline_gateway, world, mode):
    server = VirtualServer.objects.create(
        name="reading", tools=["every__echo"], resources=[DOCUMENTS], prompts=["every__simple-prompt"]
    )
    try:
        _offered(inline_gateway, world.key, mode, path="/mcp/s/reading")

        async def scenario():
            async with sdk_client(inline_gateway.url, world.key, mode, timeout=30, path="/mcp/s/reading") as client:
                resources = await client.list_resources(cache_mode="bypass")
                templates = await client.list_resource_templates(cache_mode="bypass")
                prompts = await client.list_prompts(cache_mode="bypass")
                document = next(r.uri for r in resources.resources)
                read = await client.read_resource(document)
                simple = await client.get_prompt("every__simple-prompt")
                with pytest.raises(MCPError) as unknown:
                    await client.get_prompt("every__args-prompt", {"city": "Paris"})
                return resources, templates, prompts, read, simple, unknown.value

        resources, templates, prompts, read, simple, unknown = run(scenario)
    finally:
        server.delete()
    uris = {r.uri for r in resources.resources}
    assert uris and all(uri.startswith("every+demo://resource/static/document/") for uri in uris)
    assert templates.resource_templates == []
    assert [p.name for p in prompts.prompts] == ["every__simple-prompt"]
    assert read.contents and simple.messages
    assert "every__args-prompt" in unknown.error.message


@pytest.mark.parametrize("transport", ["legacy", "2026-07-28", "ws"])
def test_a_virtual_server_of_three_upstreams_serves_a_renamed_tool_with_its_fixed_value(
    inline_gateway, world, transport
):
    """Issue 38's bar: tools of three upstreams, one renamed with a fixed parameter (its upstream's override), reached
    in both eras and over WebSocket: only what it names is listed, the call reaches the upstream with the fixed
    value, and the audit rows name the virtual server."""
    with demo_upstream("desk-math") as upstream:
        tool_override_set(tool=Tool.objects.get(upstream=upstream, name="add"), data=SUM, actor="olga")
        server = VirtualServer.objects.create(name="desk-three", tools=["desk-math__sum", "time__*", "every__echo"])
        path = "/mcp/s/desk-three"
        try:
            listed = eventually(
                lambda: (names := _offered(inline_gateway, world.key, "legacy", path)) >= WANTED and names
            )
            mark = audit_mark()
            answered = run(lambda: _sum_through(inline_gateway.url, world.key, transport, path))
            rows = [row for row in audit_since(mark) if row.exposed_name == "desk-math__sum"]
        finally:
            server.delete()
    assert "desk-math__sum" in listed and "every__echo" in listed and any(n.startswith("time__") for n in listed)
    assert not any(n.startswith("desk-math__") and n != "desk-math__sum" for n in listed)
    assert answered == "15"
    assert {(row.kind, row.tool, row.server) for row in rows} == {
        ("approved", "add", "desk-three"),
        ("completed", "add", "desk-three"),
    }
    assert rows[0].arguments_sha256 == canonical_sha256({"a": 5, "b": 10})  # what the upstream received


WANTED = {"desk-math__sum", "every__echo"}


async def _sum_through(url: str, key: str, transport: str, path: str) -> str:
    if transport == "ws":
        async with ws_session(url, key, path=path) as session:
            reply = await session.request("tools/call", {"name": "desk-math__sum", "arguments": {"first": 5}})
            return reply["result"]["content"][0]["text"]
    async with sdk_client(url, key, transport, path=path) as client:
        return (await client.call_tool("desk-math__sum", {"first": 5})).content[0].text


def test_a_virtual_server_that_offers_triage_hands_the_session_over_and_back(inline_gateway, world, specialists):
    """The specialist's tools are the session's during a handoff: the virtual server offered the triage tool, so it
    does not refuse them (nor the way back)."""
    triage, back = "switchboard__handoff_to_finance", "switchboard__return_to_triage"
    server = VirtualServer.objects.create(name="triage-desk", tools=[triage, "time__*"])
    try:
        eventually(lambda: triage in _offered(inline_gateway, world.key, "legacy", "/mcp/s/triage-desk"), timeout=10)

        async def scenario():
            async with sdk_client(inline_gateway.url, world.key, "legacy", path="/mcp/s/triage-desk") as client:
                handed = await client.call_tool(triage, {"reason": "a budget question"})
                during = {t.name for t in (await client.list_tools()).tools}
                context = await client.call_tool("finance__handoff_context", {})
                returned = await client.call_tool(back, {"note": "done"})
                with pytest.raises(MCPError) as refused:  # back at the virtual server: the finance tools are not
                    await client.call_tool("finance__handoff_context", {})
                return handed, during, context, returned, refused.value

        handed, during, context, returned, refused = run(scenario)
    finally:
        server.delete()
    assert handed.content[0].text.startswith("Handed off to the finance specialist.")
    assert {"finance__handoff_context", back} <= during
    assert not context.is_error and not returned.is_error
    assert "finance__handoff_context" in refused.error.message
