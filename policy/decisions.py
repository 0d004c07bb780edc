"""The call decision: a pure function of the compiled policy, the caller and the target."""

import fnmatch
import re
from dataclasses import dataclass
from typing import Any

from mcp import types

# JSON-RPC codes: unknown tools are invalid params (the spec's choice); refusals sit in the server range:
# a policy refusal will not change by retrying, a limit or an open circuit will, after `retryAfter`.
INVALID_PARAMS = types.INVALID_PARAMS
POLICY_DENIED = -32001
RETRY_LATER = -32003


@dataclass(frozen=True)
class SignOffTerms:
    """What a sign-off rule asks: who may sign off (a console group's members in the caller's team; None: the
    caller themself), whether they must be someone else, how long a request waits and a sign-off stays usable."""

    rule_id: int
    rule_version: int
    signers: int | None
    four_eyes: bool
    wait: float
    valid: float
    by_form: bool


@dataclass(frozen=True)
class Grounds:
    """What the rules' answer rests on: the rule that decided (its id and note), or, with none matching,
    the deployment's stance. `sign_off`: the call may go ahead once a person signs it off."""

    allow: bool
    rule_id: int | None = None
    note: str = ""
    sign_off: SignOffTerms | None = None

    def detail(self) -> dict[str, Any]:
        """As an audit row's `detail.policy` and the explain check's answer show it."""
        effect = "sign_off" if self.sign_off else "allow" if self.allow else "deny"
        if self.rule_id is None:
            return {"stance": effect}
        return {"rule": self.rule_id, "note": self.note, "effect": effect}


@dataclass(frozen=True)
class Denial:
    code: str
    message: str
    jsonrpc_code: int = POLICY_DENIED
    retry_after: float | None = None  # seconds, for refusals that lift with time
    connect_url: str = ""  # for refusals that lift once the person acts there (connects an account, signs off)
    grounds: Grounds | None = None  # a policy refusal's: for the audit and the operator, not the model
    sign_off: str = ""  # the sign-off request the call waits for, or that refused it

    def data(self) -> dict[str, Any]:
        data: dict[str, Any] = {"code": self.code}
        if self.sign_off:
            data["signOffId"] = self.sign_off
        if self.retry_after is not None:
            data["retryAfter"] = round(self.retry_after, 3)
        if self.connect_url:
            data["connectUrl"] = self.connect_url
        return data


class ToolRefused(Exception):
    """A gateway tool (a handoff move, code mode) refusing its call: the agent gets the denial's error."""

    def __init__(self, denial: Denial) -> None:
        super().__init__(denial.message)
        self.denial = denial


READ_ONLY, WRITES, DESTRUCTIVE, UNANNOTATED = "read_only", "writes", "destructive", "unannotated"
# MCP's defaults for a tool that says nothing: not read-only, destructive (a specialist's tool, seen by name only).
UNSAID = frozenset({WRITES, DESTRUCTIVE, UNANNOTATED})


def tool_classes(annotations: dict[str, Any] | None) -> frozenset[str]:
    """The classes a rule's `tool_class` may name that a tool with these annotations is in."""
    if not annotations:
        return UNSAID
    if annotations.get("readOnlyHint") is True:
        return frozenset({READ_ONLY})
    return frozenset({WRITES, DESTRUCTIVE} if annotations.get("destructiveHint") is not False else {WRITES})


@dataclass(frozen=True)
class Target:
    """What the router found for an exposed tool name (None fields: nothing found)."""

    exposed_name: str
    upstream_slug: str | None
    upstream_enabled: bool
    tool_known: bool
    upstream_id: int | None = None
    server_group_id: int | None = None
    tool: str = ""  # the upstream's own name for it
    approved: bool = True
    teams: frozenset[str] | None = None  # whose agents may reach it (its owner's, those it is shared with); None: all
    classes: frozenset[str] = UNSAID  # by its annotations (tool_classes)


@dataclass(frozen=True)
class Who:
    """Whom a decision is for: the agent, and when a token named someone, the person (issuer, subject) and
    the agent groups their IdP groups count them in; and the endpoint they came through."""

    agent_id: int
    person: tuple[str, str] | None = None
    groups: frozenset[int] = frozenset()
    teams: frozenset[str] = frozenset()  # the teams the person's groups make them an admin or member of
    server: str = ""  # the virtual server they came through: it names the tools they see, and decides nothing


def who_of(principal: "int | Who") -> Who:
    return principal if isinstance(principal, Who) else Who(principal)


@dataclass(frozen=True)
class CompiledRule:
    allow: bool
    agents: frozenset[int] | None  # None: anyone (the rule names no agent, agent group or person)
    upstream_id: int | None
    server_group_id: int | None
    pattern: re.Pattern[str]
    groups: frozenset[int] = frozenset()  # the agent group it names, which people may be counted in
    people: frozenset[tuple[str, str]] = frozenset()
    rule_id: int | None = None  # the Rule it was compiled from, and its note: what a decision names
    note: str = ""
    team_agents: frozenset[int] | None = None  # its team's agents, the only calls it governs (None: every agent's)
    tool_class: str = ""  # "": any tool
    sign_off: SignOffTerms | None = None  # a sign-off rule's (which also allows)

    @classmethod
    def build(cls, *, allow: bool, agents: frozenset[int] | None, upstream_id: int | None,
              server_group_id: int | None, tool_pattern: str, groups: frozenset[int] = frozenset(),
              people: frozenset[tuple[str, str]] = frozenset(), rule_id: int | None = None,
              note: str = "", team_agents: frozenset[int] | None = None, tool_class: str = "",
              sign_off: SignOffTerms | None = None) -> "CompiledRule":  # fmt: skip
        pattern = re.compile(fnmatch.translate(tool_pattern))
        return cls(
            allow, agents, upstream_id, server_group_id, pattern, groups, people, rule_id, note, team_agents,
            tool_class, sign_off,
        )  # fmt: skip

    def names(self, who: Who) -> bool:
        """Whether it is about this caller: one of its team's agents (a team's rules govern only its own agents'
        calls), and its subject (anyone, the agent, an agent group they count in, the person)."""
        if self.team_agents is not None and who.agent_id not in self.team_agents:
            return False
        return (
            self.agents is None
            or who.agent_id in self.agents
            or who.person in self.people
            or not self.groups.isdisjoint(who.groups)
        )

    def matches(self, principal: "int | Who", target: Target) -> bool:
        return (
            self.names(who_of(principal))
            and (self.upstream_id is None or self.upstream_id == target.upstream_id)
            and (self.server_group_id is None or self.server_group_id == target.server_group_id)
            and self.pattern.match(target.tool) is not None
            and (not self.tool_class or self.tool_class in target.classes)
        )


@dataclass(frozen=True)
class Policy:
    rules: tuple[CompiledRule, ...] = ()
    default_allow: bool = True

    def grounds(self, principal: "int | Who", target: Target) -> Grounds:
        """Deny wins (the first matching deny); then a sign-off rule lets through once signed off (the first
        matching); then an allow (the first matching); with none, the deployment's stance decides."""
        who = who_of(principal)
        allowed: CompiledRule | None = None
        asked: CompiledRule | None = None
        for rule in self.rules:
            if rule.matches(who, target):
                if not rule.allow:
                    return Grounds(False, rule.rule_id, rule.note)
                if rule.sign_off:
                    asked = asked or rule
                else:
                    allowed = allowed or rule
        if chosen := asked or allowed:
            return Grounds(True, chosen.rule_id, chosen.note, chosen.sign_off)
        return Grounds(self.default_allow)


@dataclass(frozen=True)
class Explanation:
    """A decision and what it rests on: `grounds` is None when it was made before the rules were looked at
    (the agent disabled, the tool unknown, its upstream disabled)."""

    denial: Denial | None
    grounds: Grounds | None = None


def reaches(team: str, teams: frozenset[str] | None) -> bool:
    """Whether an agent of `team` may reach an upstream reached by `teams` (its owner's and those it is shared with;
    None: shared with all)."""
    return teams is None or team in teams


def policy_decide(
    *, policy: Policy, agent_id: "int | Who", agent_enabled: bool, target: Target, team: str = "", member: bool = True
) -> Denial | None:
    """None when the call may go ahead, else the reason it may not, written for the model."""
    return policy_explain(
        policy=policy, agent_id=agent_id, agent_enabled=agent_enabled, target=target, team=team, member=member
    ).denial


def policy_explain(
    *, policy: Policy, agent_id: "int | Who", agent_enabled: bool, target: Target, team: str = "", member: bool = True
) -> Explanation:
    """The decision, with the rule or stance it rests on (what the explain check shows an operator). `team` is the
    agent's: another team's tool, not shared with it, is unknown to it (it may not learn that the tool exists).
    `member`: the person calling, if any, may call as one of that team (their groups say so, when it asks)."""
    name = target.exposed_name
    if not agent_enabled:
        return Explanation(Denial("AGENT_DISABLED", "This agent has been disabled by an administrator."))
    if not member:
        message = (
            f"You are not a member of team {team!r}, which this agent belongs to, so you may call none of its "
            "tools: ask the team's admin to map one of your groups to it."
        )
        return Explanation(Denial("TEAM_MEMBERSHIP_REQUIRED", message))
    if target.upstream_slug is None or not target.tool_known or not reaches(team, target.teams):
        message = f"Unknown tool: {name!r}. Call tools/list for the tools this gateway offers."
        return Explanation(Denial("TOOL_NOT_FOUND", message, INVALID_PARAMS))
    if not target.upstream_enabled:
        message = (
            f"The tool {name!r} belongs to the service {target.upstream_slug!r}, "
            "which an administrator has disabled. Do not retry; choose another tool."
        )
        return Explanation(Denial("UPSTREAM_DISABLED", message))
    grounds = policy.grounds(agent_id, target)
    if not grounds.allow:
        message = f"The gateway's policy does not let this agent use {name!r}. Do not retry; choose another tool."
        return Explanation(Denial("POLICY_DENIED", message, grounds=grounds), grounds)
    if not target.approved:
        message = (
            f"The tool {name!r} changed since an administrator approved it and is held until they review "
            "the change. Choose another tool."
        )
        return Explanation(Denial("TOOL_PENDING_APPROVAL", message), grounds)
    return Explanation(None, grounds)
