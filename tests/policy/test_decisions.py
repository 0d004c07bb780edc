"""The call decision (policy/decisions.py) on its own: which refusal comes first, and how rules combine."""

from dataclasses import replace

import pytest

from policy.decisions import INVALID_PARAMS, POLICY_DENIED, CompiledRule, Denial, Policy, Target, policy_decide

ADD = Target("demo__add", "demo", True, True, upstream_id=1, server_group_id=7, tool="add")


def rule(allow: bool, *, agents=None, upstream_id=None, server_group_id=None, tool_pattern="*") -> CompiledRule:
    return CompiledRule.build(
        allow=allow, agents=agents, upstream_id=upstream_id, server_group_id=server_group_id, tool_pattern=tool_pattern
    )


def code(policy: Policy, target: Target = ADD, *, agent_id: int = 1, enabled: bool = True) -> str | None:
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
