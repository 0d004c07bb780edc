"""Rules: allow and deny by agent or agent group, upstream or server group, and tool pattern; deny wins; with no
matching rule the deployment's stance decides. A tool an agent may not call is absent from its tools/list."""

from collections.abc import Iterator

import pytest
from mcp.shared.exceptions import MCPError

from policy.models import AgentGroup, Rule, ServerGroup
from registry.models import Upstream
from tests import servers
from tests.clients import call, sdk_client, tool_names
from tests.factories import agent
from tests.helpers import audit_mark, audit_since, eventually, run


def names_of(gateway, key: str, check) -> set[str]:
    """The agent's tools once `check(names)` holds (a gateway sees rule changes within a second)."""
    return eventually(lambda: (names := run(lambda: tool_names(gateway.url, key))) and check(names) and names)


def test_a_deny_rule_hides_the_tool_from_the_list_and_refuses_the_call_with_an_audit_row(inline_gateway, world):
    demo = Upstream.objects.get(slug="demo")
    with agent("carol") as (carol, key):
        rule = Rule.objects.create(effect="deny", agent=carol, upstream=demo, tool_pattern="ad?")
        try:
            names = names_of(inline_gateway, key, lambda n: "demo__add" not in n)
            mark = audit_mark()
            refused = run(lambda: call(inline_gateway.url, key, "demo__add", {"a": 1, "b": 2}))
        finally:
            rule.delete()
        assert "demo__echo" in names and "time__get_current_time" in names
        assert isinstance(refused, MCPError) and refused.code == -32001
        assert refused.data["code"] == "POLICY_DENIED"
        assert str(refused) == (
            "The gateway's policy does not let this agent use 'demo__add'. Do not retry; choose another tool."
        )
        [row] = audit_since(mark)
        assert (row.kind, row.agent_name, row.upstream, row.tool, row.error_code) == (
            "denied", "carol", "demo", "add", "POLICY_DENIED"
        )  # fmt: skip
    assert "demo__add" in run(lambda: tool_names(inline_gateway.url, world.key)), "another agent lost the tool"


def test_deny_wins_over_allow_and_rules_reach_agent_groups_and_server_groups(inline_gateway, world):
    demo = Upstream.objects.get(slug="demo")
    group = ServerGroup.objects.create(name="clocks")
    Upstream.objects.filter(slug="time").update(group=group)
    with agent("dave") as (dave, key):
        team = AgentGroup.objects.create(name="night-shift")
        team.agents.add(dave)
        rules = [
            Rule.objects.create(effect="allow", agent=dave, upstream=demo),
            Rule.objects.create(effect="deny", agent_group=team, upstream=demo, tool_pattern="echo"),
            Rule.objects.create(effect="deny", agent_group=team, server_group=group),
        ]
        try:
            names = names_of(inline_gateway, key, lambda n: "demo__echo" not in n and "demo__add" in n)
        finally:
            for rule in rules:
                rule.delete()
            team.delete()
            Upstream.objects.filter(slug="time").update(group=None)
            group.delete()
    assert not any(name.startswith("time__") for name in names)
    assert "every__echo" in names  # no rule names it: the allow-all stance


@pytest.fixture(scope="module")
def deny_all_gateway(server_env, world, logs) -> Iterator[servers.Running]:
    log = logs / "gateway-deny-all.log"
    with servers.inline_gateway_with(server_env, log, GATEWAY_POLICY_DEFAULT="deny") as running:
        yield running


def test_under_a_deny_all_stance_an_agent_sees_and_calls_only_what_a_rule_allows(deny_all_gateway, world):
    with agent("erin") as (erin, key):
        rule = Rule.objects.create(effect="allow", agent=erin, upstream=Upstream.objects.get(slug="time"))
        try:
            names = names_of(deny_all_gateway, key, lambda n: True)
            refused = run(lambda: call(deny_all_gateway.url, key, "demo__echo", {"text": "hi"}))
            allowed = run(lambda: call(deny_all_gateway.url, key, "time__get_current_time", {"timezone": "UTC"}))
        finally:
            rule.delete()
    assert names == {"time__get_current_time", "time__convert_time"}
    assert isinstance(refused, MCPError) and refused.data["code"] == "POLICY_DENIED"
    assert not allowed.is_error

    async def alice_tools() -> list:
        async with sdk_client(deny_all_gateway.url, world.key, "legacy") as client:
            return (await client.list_tools()).tools

    assert run(alice_tools) == [], "alice has no rule: nothing is offered"
