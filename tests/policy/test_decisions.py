"""The call decision (policy/decisions.py) on its own: which refusal comes first, and how rules combine."""

from dataclasses import replace

import pytest

from policy.decisions import (
    INVALID_PARAMS,
    POLICY_DENIED,
    CompiledRule,
    Denial,
    Policy,
    Target,
    Who,
    policy_decide,
    policy_explain,
)

ADD = Target("demo__add", "demo", True, True, upstream_id=1, server_group_id=7, tool="add")


def rule(allow: bool, *, agents=None, upstream_id=None, server_group_id=None, tool_pattern="*") -> CompiledRule:
    return CompiledRule.build(
        allow=allow, agents=agents, upstream_id=upstream_id, server_group_id=server_group_id, tool_pattern=tool_pattern
    )


def code(policy: Policy, target: Target = ADD, *, agent_id: int | Who = 1, enabled: bool = True) -> str | None:
    denial = policy_decide(policy=policy, agent_id=agent_id, agent_enabled=enabled, target=target)
    return denial and denial.code


def test_each_refusal_goes_before_the_next():
    deny_all, held = Policy((rule(False),)), replace(ADD, approved=False)
    off = replace(held, upstream_enabled=False)
    assert code(deny_all, replace(off, tool_known=False), enabled=False) == "AGENT_DISABLED"
    assert code(deny_all, replace(off, tool_known=False)) == "TOOL_NOT_FOUND"
    assert code(deny_all, replace(off, upstream_slug=None, tool_known=True)) == "TOOL_NOT_FOUND"
    assert code(deny_all, off) == "UPSTREAM_DISABLED"
    assert code(deny_all, held) == "POLICY_DENIED"
    assert code(Policy(), held) == "TOOL_PENDING_APPROVAL"
    assert code(Policy(), ADD) is None


def test_a_tool_of_another_team_not_shared_with_the_agents_is_as_unknown_to_it_as_a_tool_that_does_not_exist():
    owned, shared = replace(ADD, teams=frozenset({"payments"})), replace(ADD, teams=frozenset({"payments", "ops"}))

    def decided(target: Target, team: str) -> Denial | None:
        return policy_decide(policy=Policy(), agent_id=1, agent_enabled=True, target=target, team=team)

    unknown, elsewhere = decided(replace(ADD, tool_known=False), "ops"), decided(owned, "ops")
    assert (elsewhere.code, elsewhere.jsonrpc_code, elsewhere.message) == (
        unknown.code,
        INVALID_PARAMS,
        unknown.message,
    )
    assert [decided(owned, "payments"), decided(shared, "ops"), decided(ADD, "ops")] == [None, None, None]
    # Before anything else but a disabled agent: another team's rules and pins are none of its business.
    held = replace(owned, approved=False, upstream_enabled=False)
    assert code(Policy((rule(False),)), held, enabled=False) == "AGENT_DISABLED"
    assert decided(held, "ops").code == "TOOL_NOT_FOUND"


def test_a_rule_of_a_team_names_only_that_teams_agents_whatever_its_subject():
    anyone = CompiledRule.build(
        allow=False, agents=None, upstream_id=None, server_group_id=None, tool_pattern="*", team_agents=frozenset({1})
    )
    person = replace(anyone, agents=frozenset(), people=frozenset({("iss", "ada")}))
    assert [code(Policy((anyone,)), agent_id=agent_id) for agent_id in (1, 2)] == ["POLICY_DENIED", None]
    assert [code(Policy((person,)), agent_id=Who(agent_id, ("iss", "ada"))) for agent_id in (1, 2)] == [
        "POLICY_DENIED",
        None,
    ]


def test_an_unknown_tool_is_invalid_params_and_a_policy_refusal_is_not():
    unknown = policy_decide(policy=Policy(), agent_id=1, agent_enabled=True, target=replace(ADD, tool_known=False))
    denied = policy_decide(policy=Policy(default_allow=False), agent_id=1, agent_enabled=True, target=ADD)
    assert (unknown.jsonrpc_code, unknown.message) == (
        INVALID_PARAMS,
        "Unknown tool: 'demo__add'. Call tools/list for the tools this gateway offers.",
    )
    assert (denied.jsonrpc_code, denied.data()) == (POLICY_DENIED, {"code": "POLICY_DENIED"})


@pytest.mark.parametrize(
    ("rules", "default_allow", "allowed"),
    [
        ((rule(True), rule(False, tool_pattern="ad?")), True, False),  # deny wins, in any order
        ((rule(False, tool_pattern="ad?"), rule(True)), False, False),
        ((rule(True, upstream_id=1),), False, True),  # an allow lets through a deny-all stance
        ((rule(True, upstream_id=2),), False, False),  # ... only where it matches
        ((rule(False, agents=frozenset({2, 3})),), True, True),  # another agent's (or group's) rule
        ((rule(False, agents=frozenset({1, 3})),), True, False),  # this agent's group's rule
        ((rule(False, server_group_id=7),), True, False),
        ((rule(False, tool_pattern="a"),), True, True),  # a pattern matches the whole name
        ((rule(False, tool_pattern="a*"), rule(True)), False, False),
        ((rule(False, tool_pattern="[!a]*"),), True, True),
    ],
    ids=["deny-after-allow", "deny-before-allow", "allow-in-deny-all", "allow-elsewhere", "other-agents",
         "agent-in-group", "server-group", "whole-name", "glob", "negated-class"],
)  # fmt: skip
def test_rules_match_agent_upstream_group_and_pattern_and_deny_wins(rules, default_allow, allowed):
    assert (code(Policy(rules, default_allow)) is None) is allowed


def test_a_refusal_that_lifts_with_time_says_when_in_milliseconds():
    assert Denial("X", "m", retry_after=1.23456).data() == {"code": "X", "retryAfter": 1.235}
    assert Denial("X", "m").data() == {"code": "X"}


GRACE = ("https://idp.test", "grace")


def test_a_rule_naming_a_person_applies_to_them_only_and_a_rule_naming_their_agent_to_them_too():
    people_agent = 5
    deny_grace = CompiledRule.build(
        allow=False, agents=frozenset(), upstream_id=None, server_group_id=None, tool_pattern="*", people={GRACE}
    )
    deny_agent = rule(False, agents=frozenset({people_agent}), tool_pattern="delete_*")
    policy = Policy((deny_grace, deny_agent))
    assert code(policy, agent_id=Who(people_agent, GRACE)) == "POLICY_DENIED"
    assert code(policy, agent_id=Who(people_agent, ("https://idp.test", "hopper"))) is None
    assert code(policy, agent_id=people_agent) is None  # the agent itself, through an API key
    delete = replace(ADD, exposed_name="demo__delete_all", tool="delete_all")
    assert code(policy, delete, agent_id=Who(people_agent, ("https://idp.test", "hopper"))) == "POLICY_DENIED"


def test_a_rule_naming_an_agent_group_applies_to_people_their_groups_count_in():
    readers = 9
    allow_readers = CompiledRule.build(
        allow=True, agents=frozenset({3}), upstream_id=None, server_group_id=None, tool_pattern="*",
        groups=frozenset({readers}),
    )  # fmt: skip
    policy = Policy((allow_readers,), default_allow=False)
    assert code(policy, agent_id=Who(5, GRACE, frozenset({readers}))) is None
    assert code(policy, agent_id=Who(5, GRACE)) == "POLICY_DENIED"
    assert code(policy, agent_id=3) is None  # a member agent


def test_a_decision_names_the_rule_that_made_it_or_else_the_stance():
    allow_all = CompiledRule.build(
        allow=True, agents=None, upstream_id=1, server_group_id=None, tool_pattern="*", rule_id=4, note="demo is open"
    )
    deny_add = CompiledRule.build(
        allow=False, agents=None, upstream_id=1, server_group_id=None, tool_pattern="add", rule_id=9, note="no sums"
    )
    policy = Policy((allow_all, deny_add), default_allow=False)
    denied = policy_explain(policy=policy, agent_id=1, agent_enabled=True, target=ADD)
    echo = replace(ADD, exposed_name="demo__echo", tool="echo")
    allowed = policy_explain(policy=policy, agent_id=1, agent_enabled=True, target=echo)
    elsewhere = policy_explain(policy=policy, agent_id=1, agent_enabled=True, target=replace(echo, upstream_id=2))
    disabled = policy_explain(policy=policy, agent_id=1, agent_enabled=False, target=ADD)
    assert (denied.denial.code, denied.denial.grounds.detail()) == (
        "POLICY_DENIED", {"rule": 9, "note": "no sums", "effect": "deny"}
    )  # fmt: skip
    assert (allowed.denial, allowed.grounds.detail()) == (None, {"rule": 4, "note": "demo is open", "effect": "allow"})
    assert (elsewhere.denial.code, elsewhere.denial.grounds.detail()) == ("POLICY_DENIED", {"stance": "deny"})
    assert (disabled.denial.code, disabled.grounds) == ("AGENT_DISABLED", None)
    assert policy_decide(policy=policy, agent_id=1, agent_enabled=True, target=ADD) == denied.denial
