"""Strict server groups: the first call of a session into a strict group locks the session to it; another
strict group is then out of reach (POLICY_GROUP_ISOLATION), open and ungrouped servers are not. The lock is
shared state, so every gateway process sees it; 2026-07-28 requests have no session and bind it to their key."""

import anyio
from mcp.shared.exceptions import MCPError

from policy.services import agent_key_issue
from registry.models import VirtualServer
from tests.clients import call, sdk_client, tool_names, ws_session
from tests.factories import agent, two_strict_groups
from tests.helpers import audit_mark, audit_since, eventually, run


async def session_calls(url: str, key: str, mode: str, names: list[str], path: str = "/mcp") -> list:
    """Each call's text, or its refusal's (code, data code, message), all in one session (at /mcp, or `path`)."""
    outcomes = []
    async with sdk_client(url, key, mode, path=path) as client:
        for name in names:
            try:
                outcomes.append((await client.call_tool(name, {"text": name})).content[0].text)
            except MCPError as refused:
                outcomes.append((refused.code, refused.data["code"], str(refused)))
    return outcomes


REFUSED = (
    -32001,
    "POLICY_GROUP_ISOLATION",
    "This session already used another isolated server group, so 'mailer__echo' (group 'outbound') is out of "
    "its reach: isolated groups never share a session. Use a new session for it.",
)


def test_a_session_that_entered_a_strict_group_cannot_reach_another_but_a_fresh_session_can(gateway, world):
    with two_strict_groups():
        eventually(lambda: {"secrets__echo", "mailer__echo"} <= run(lambda: tool_names(gateway.url, world.key)))
        mark = audit_mark()
        names = ["secrets__echo", "demo__echo", "secrets__echo", "mailer__echo"]
        first = run(lambda: session_calls(gateway.url, world.key, "legacy", names))
        fresh = run(lambda: session_calls(gateway.url, world.key, "legacy", ["mailer__echo", "demo__echo"]))
    assert first == ["secrets__echo", "demo__echo", "secrets__echo", REFUSED]
    assert fresh == ["mailer__echo", "demo__echo"]
    [denied] = [r for r in audit_since(mark) if r.kind == "denied"]
    assert (denied.upstream, denied.error_code) == ("mailer", "POLICY_GROUP_ISOLATION")
    assert denied.session_id, "the row names the session that was locked"


def test_a_virtual_server_spanning_two_strict_groups_is_saved_but_one_session_still_cannot_cross(inline_gateway, world):
    with two_strict_groups():
        both = VirtualServer.objects.create(name="both-groups", tools=["secrets__echo", "mailer__echo"])
        try:
            url, path = inline_gateway.url, "/mcp/s/both-groups"
            names = {"secrets__echo", "mailer__echo"}
            listed = eventually(lambda: run(lambda: tool_names(url, world.key, path=path)) == names)
            first = run(lambda: session_calls(url, world.key, "legacy", ["secrets__echo", "mailer__echo"], path))
        finally:
            both.delete()
    assert listed
    assert first == ["secrets__echo", REFUSED]


def test_stateless_requests_bind_the_lock_to_their_api_key(inline_gateway, world):
    with two_strict_groups(), agent("heidi") as (heidi, key):
        other_key = agent_key_issue(agent=heidi).key
        url = inline_gateway.url
        eventually(lambda: "mailer__echo" in run(lambda: tool_names(url, other_key, "2026-07-28")))
        first = run(lambda: session_calls(url, key, "2026-07-28", ["secrets__echo"]))
        same_key = run(lambda: call(url, key, "mailer__echo", {"text": "x"}, mode="2026-07-28"))
        other = run(lambda: session_calls(url, other_key, "2026-07-28", ["mailer__echo"]))
    assert first == ["secrets__echo"]
    assert isinstance(same_key, MCPError) and same_key.data["code"] == "POLICY_GROUP_ISOLATION"
    assert 0 < same_key.data["retryAfter"] <= 600, "the default window is ten minutes"
    assert str(same_key).startswith(
        "Stateless requests with this API key used another isolated server group in the last 600 seconds, so "
        "'mailer__echo' (group 'outbound') is out of their reach: isolated groups never share a conversation. "
        "Retry after "
    )
    assert str(same_key).endswith(", or use another API key of this agent for group 'outbound'.")
    assert other == ["mailer__echo"], "another key of the same agent is another stateless session"


def test_a_busy_stateless_key_leaves_its_strict_group_when_its_window_ends(short_window_gateway, world):
    """The lock lasts a fixed window (5 s here) from the key's first call into the group: a call into that group
    made meanwhile does not extend it (the wait it is told shrinks), so a key in steady use is not held there for
    ever. (Busy calls stop after one: a call into either group after the window ends starts a new one.)"""
    url = short_window_gateway.url

    async def busy_until_crossed() -> tuple[MCPError, str, MCPError, str]:
        entered = await call(url, key, "secrets__echo", {"text": "in"}, mode="2026-07-28")
        assert entered.content[0].text == "in"
        refused = await call(url, key, "mailer__echo", {"text": "out"}, mode="2026-07-28")
        busy = await call(url, key, "secrets__echo", {"text": "busy"}, mode="2026-07-28")
        again = await call(url, key, "mailer__echo", {"text": "out"}, mode="2026-07-28")
        with anyio.fail_after(12):
            while isinstance(
                crossed := await call(url, key, "mailer__echo", {"text": "out"}, mode="2026-07-28"), MCPError
            ):
                pass
        return refused, busy.content[0].text, again, crossed.content[0].text

    with two_strict_groups(), agent("judy") as (_, key):
        eventually(lambda: "mailer__echo" in run(lambda: tool_names(url, key, "2026-07-28")))
        refused, busy, again, crossed = run(busy_until_crossed)
    assert (refused.code, refused.data["code"]) == (-32001, "POLICY_GROUP_ISOLATION")
    assert 0 < refused.data["retryAfter"] <= 5
    assert busy == "busy"
    assert (again.code, again.data["code"]) == (-32001, "POLICY_GROUP_ISOLATION")
    assert again.data["retryAfter"] < refused.data["retryAfter"], "the busy call did not extend the window"
    assert crossed == "out"


def test_a_websocket_connection_is_its_own_session_for_the_lock(inline_gateway, world):
    async def two_connections():
        async with ws_session(inline_gateway.url, world.key) as ws:
            entered = await ws.request("tools/call", {"name": "secrets__echo", "arguments": {"text": "in"}})
            crossed = await ws.request("tools/call", {"name": "mailer__echo", "arguments": {"text": "out"}})
        async with ws_session(inline_gateway.url, world.key) as ws:
            fresh = await ws.request("tools/call", {"name": "mailer__echo", "arguments": {"text": "out"}})
        return entered, crossed, fresh

    with two_strict_groups():
        eventually(lambda: "mailer__echo" in run(lambda: tool_names(inline_gateway.url, world.key)))
        entered, crossed, fresh = run(two_connections)
    assert entered["result"]["content"][0]["text"] == "in"
    assert crossed["error"]["code"] == -32001 and crossed["error"]["data"]["code"] == "POLICY_GROUP_ISOLATION"
    assert fresh["result"]["content"][0]["text"] == "out"
