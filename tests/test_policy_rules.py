"""Rules: allow and deny by agent or agent group, upstream or server group, and tool pattern; deny wins; with no
matching rule the deployment's stance decides. A tool an agent may not call is absent from its tools/list."""

import json
import re
from collections.abc import Iterator
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.core.management import CommandError, call_command
from django.urls import reverse
from mcp.shared.exceptions import MCPError

from policy.models import AgentGroup, Rule, ServerGroup
from policy.services import admin_token_issue
from registry.models import Upstream
from tests import servers
from tests.clients import api, call, sdk_client, tool_names
from tests.factories import agent
from tests.helpers import audit_mark, audit_since, eventually, run, schema_validator


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
    assert not isinstance(allowed, MCPError) and not allowed.is_error, allowed

    async def alice_tools() -> list:
        async with sdk_client(deny_all_gateway.url, world.key, "legacy") as client:
            return (await client.list_tools()).tools

    assert run(alice_tools) == [], "alice has no rule: nothing is offered"


DENIED_ADD = "The gateway's policy does not let this agent use 'demo__add'. Do not retry; choose another tool."


@pytest.fixture
def explained_world(deny_all_gateway) -> Iterator[dict[str, dict]]:
    """Under a deny-all stance, the agent hana: demo allowed by a rule, demo's add denied by another, the rest
    left to the stance; what the check must answer for each."""
    demo = Upstream.objects.get(slug="demo")
    with agent("hana") as (hana, _key):
        allow = Rule.objects.create(effect="allow", agent=hana, upstream=demo, note="hana works the demo")
        deny = Rule.objects.create(effect="deny", agent=hana, upstream=demo, tool_pattern="add", note="no sums")
        try:
            yield {
                "demo__echo": {"allowed": True, "code": "", "message": "",
                               "policy": {"rule": allow.id, "note": "hana works the demo", "effect": "allow"}},
                "demo__add": {"allowed": False, "code": "POLICY_DENIED", "message": DENIED_ADD,
                              "policy": {"rule": deny.id, "note": "no sums", "effect": "deny"}},
                "time__get_current_time": {
                    "allowed": False, "code": "POLICY_DENIED", "policy": {"stance": "deny"},
                    "message": DENIED_ADD.replace("demo__add", "time__get_current_time"),
                },
            }  # fmt: skip
        finally:
            allow.delete()
            deny.delete()


def test_the_explain_check_answers_alike_through_the_api_the_command_and_the_console(
    deny_all_gateway, explained_world, admin_client, admin_token, settings
):
    settings.GATEWAY_POLICY_DEFAULT = "deny"  # as the gateway's: the command and the console answer in this process
    schema = api(deny_all_gateway, "GET", "schema", None, params={"format": "json"}).json()
    valid = schema_validator(schema, "/api/v1/agents/{name}/explain", "get", "200")
    for tool, expected in explained_world.items():
        answer = {"agent": "hana", "person": None, "tool": tool} | expected
        served = api(deny_all_gateway, "GET", "agents/hana/explain", admin_token, params={"tool": tool})
        out = StringIO()
        call_command("policy_explain", "--agent", "hana", "--tool", tool, stdout=out)
        page = admin_client.get(reverse("admin:policy_rule_explain"), {"agent": "hana", "tool": tool})
        assert (served.status_code, served.json()) == (200, answer)
        valid.validate(served.json())
        assert json.loads(out.getvalue()) == answer
        assert page.status_code == 200 and page.context["explained"].shown() == answer
        grounds = re.sub(r"\s+", " ", re.search(r'<p id="explain-grounds">(.*?)</p>', page.text, re.S)[1])
        if "rule" in expected["policy"]:
            rule = expected["policy"]
            assert f"#{rule['rule']}</a>: {rule['note']}." in grounds and f"the {rule['effect']} rule" in grounds
        else:
            assert grounds == "No rule matches: the stance <code>GATEWAY_POLICY_DEFAULT=deny</code> decides."


def test_the_answer_names_the_rule_the_call_itself_is_denied_by(deny_all_gateway, admin_token):
    demo = Upstream.objects.get(slug="demo")
    with agent("ida") as (ida, key):
        rules = [
            Rule.objects.create(effect="allow", agent=ida, upstream=demo),
            Rule.objects.create(effect="deny", agent=ida, tool_pattern="echo", note="ida never echoes"),
        ]
        deny_id = rules[1].id
        try:
            names_of(deny_all_gateway, key, lambda n: "demo__add" in n and "demo__echo" not in n)
            mark = audit_mark()
            refused = run(lambda: call(deny_all_gateway.url, key, "demo__echo", {"text": "x"}))
            answer = api(deny_all_gateway, "GET", "agents/ida/explain", admin_token, params={"tool": "demo__echo"})
        finally:
            for rule in rules:
                rule.delete()
    [row] = audit_since(mark)
    assert isinstance(refused, MCPError) and (row.error_code, row.error_detail) == ("POLICY_DENIED", str(refused))
    assert (answer.json()["code"], answer.json()["message"]) == (row.error_code, row.error_detail)
    assert (
        answer.json()["policy"]
        == row.detail["policy"]
        == {"rule": deny_id, "note": "ida never echoes", "effect": "deny"}
    )


def test_the_explain_check_refuses_an_unknown_agent_tool_or_person_with_the_exact_error(
    deny_all_gateway, explained_world, admin_client, admin_token
):
    schema = api(deny_all_gateway, "GET", "schema", None, params={"format": "json"}).json()
    cases = [
        ("agents/nobody/explain", {"tool": "demo__echo"}, 404, {"detail": "No agent is named 'nobody'."}),
        ("agents/hana/explain", {"tool": "demo__nope"}, 404,
         {"detail": "No tool is exposed as 'demo__nope': name it as tools/list shows it."}),
        ("agents/hana/explain", {"tool": "demo__echo", "person": "nobody"}, 404,
         {"detail": "No person has the subject 'nobody'."}),
        ("agents/hana/explain", {}, 400, {"tool": ["This field is required."]}),
    ]  # fmt: skip
    for path, params, status, body in cases:
        answered = api(deny_all_gateway, "GET", path, admin_token, params=params)
        assert (answered.status_code, answered.json()) == (status, body), path
        schema_validator(schema, "/api/v1/agents/{name}/explain", "get", str(status)).validate(answered.json())
    clerk = get_user_model().objects.create_user("explain-clerk", password="clerk-pw-for-tests")
    clerk.user_permissions.add(Permission.objects.get(codename="view_agent"))
    try:
        blind = api(deny_all_gateway, "GET", "agents/hana/explain", admin_token_issue(user=clerk), params={"tool": "x"})
    finally:
        clerk.delete()
    assert (blind.status_code, blind.json()) == (
        403,
        {"detail": "Explaining a decision needs the permission to view rules."},
    )
    with pytest.raises(CommandError, match=r"^No agent is named 'nobody'\.$"):
        call_command("policy_explain", "--agent", "nobody", "--tool", "demo__echo")
    with pytest.raises(CommandError, match=r"^No tool is exposed as 'demo__nope': name it as tools/list shows it\.$"):
        call_command("policy_explain", "--agent", "hana", "--tool", "demo__nope")
    page = admin_client.get(reverse("admin:policy_rule_explain"), {"agent": "hana", "tool": "demo__nope"})
    assert page.status_code == 400 and page.context["form"].non_field_errors() == [
        "No tool is exposed as 'demo__nope': name it as tools/list shows it."
    ]
    stranger = admin_client.get(reverse("admin:policy_rule_explain"), {"agent": "nobody", "tool": "demo__echo"})
    assert stranger.status_code == 400 and stranger.context["form"].errors == {
        "agent": ["Select a valid choice. That choice is not one of the available choices."]
    }
