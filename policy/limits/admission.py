"""Admission against shared state: group isolation, circuit breakers, call limits and rates.

These checks need state that every web process must see (which strict group a session entered, how many
calls an agent made in the last minute, whether an upstream's circuit is open). With REDIS_URL they are one
Lua script per call in Redis, atomic across processes; the embedded default is a single process, and keeps
the same state in its memory (policy/limits/stores.py). Both apply the same rules in the same order.
"""

import math
from dataclasses import dataclass
from typing import Literal, Protocol

from django.conf import settings

from policy.decisions import POLICY_DENIED, RETRY_LATER, Denial

# What an outcome says about the upstream's health: it answered, it failed (timeout, dead connection), or
# nothing either way (the caller left, the executor was lost).
Health = Literal["ok", "fail", "none"]
FAILURE_CODES = frozenset({"UPSTREAM_TIMEOUT", "UPSTREAM_UNAVAILABLE", "UPSTREAM_CONNECT_TIMEOUT"})
# A lost handoff tunnel is neutral: its specialist's connection broke, or the worker holding it died, and
# the two cannot be told apart; either way the handoff ends, so no further call would be paced by it.
NEUTRAL_CODES = frozenset(
    {"EXECUTOR_UNAVAILABLE", "GATEWAY_ERROR", "CANCELLED", "UPSTREAM_INVALID_RESPONSE", "HANDOFF_UPSTREAM_UNAVAILABLE"}
)
WINDOW_SECONDS = 60.0
# Not a refusal: a key the call's admission was to find unchanged had changed (`Admission.expected`), so nothing
# was taken; the caller reads the state again and decides anew.
STATE_CHANGED = "STATE_CHANGED"
LIMITS_UNAVAILABLE = "LIMITS_UNAVAILABLE"  # the store could not be asked: nothing was checked
# Keys that must still hold these values (None: absent), each renewed for its seconds (0: not).
Expected = tuple[tuple[str, bytes | None, int], ...]


def health_of(code: str | None) -> Health:
    """The breaker's reading of an outcome's error code (None or "" for a call that went through)."""
    if code in FAILURE_CODES:
        return "fail"
    return "none" if code in NEUTRAL_CODES else "ok"


@dataclass(frozen=True)
class TeamLimits:
    """A team's limits over all its agents' calls together (docs/teams.md)."""

    id: int
    slug: str
    calls_per_minute: int
    max_concurrent: int
    daily_calls: int  # in one UTC day


@dataclass(frozen=True)
class AgentLimits:
    calls_per_minute: int
    max_calls_per_session: int
    team: TeamLimits | None = None  # the agent's team, whose limits its calls count against too


@dataclass(frozen=True)
class UpstreamLimits:
    """What admission needs of an upstream; compiled once per snapshot and shared by the routes of its tools."""

    id: int
    slug: str
    strict_group: int | None  # its group, when that group is strict
    group_name: str
    calls_per_minute: int
    max_concurrent: int
    breaker_failures: int
    breaker_recovery: float
    probe_seconds: float  # how long a half-open probe may take before another may go
    team: int | None = None  # the owning team's id; None for the gateway's own tools

    @property
    def share(self) -> int:
        """How many of its calls at once one borrowing team may hold: half, so the owner keeps the rest."""
        return max(1, self.max_concurrent // 2)


@dataclass(frozen=True)
class Admission:
    """One call's claim on shared state, with the limits that apply to it."""

    request_id: str
    session: str  # unique across agents
    agent_id: int
    agent: AgentLimits
    upstream: UpstreamLimits
    # A 2026-07-28 request, which has no session: its API key stands for one, over a window of fixed length
    # from the key's first call (GATEWAY_STATELESS_WINDOW_SECONDS) that busy use does not extend.
    stateless: bool = False
    person: str = ""  # who a token named (a digest of issuer and subject): each person has the agent's rate
    # Checked first, in the admission's own round trip (Redis only): the session's state as the caller last read
    # it, which it did not read again for this call.
    expected: Expected = ()

    @property
    def rate_key(self) -> str:
        """Whose calls a minute this call counts against: the agent's, or for a person, their own."""
        return f"{self.agent_id}:{self.person}" if self.person else str(self.agent_id)

    @property
    def borrowed(self) -> bool:
        """Whether the agent's team calls an upstream another team owns (and shares): its share of the
        upstream's concurrency applies."""
        team, owner = self.agent.team, self.upstream.team
        return team is not None and owner is not None and team.id != owner

    @property
    def term(self) -> float:
        """How long session state lasts: idle time for a session, the fixed window for a stateless key."""
        return settings.GATEWAY_STATELESS_WINDOW_SECONDS if self.stateless else settings.GATEWAY_SESSION_IDLE_SECONDS


@dataclass(frozen=True)
class Verdict:
    code: str  # "" when admitted
    retry_after: float = 0.0
    probing: bool = False  # admitted as the half-open circuit's one probe


@dataclass(frozen=True)
class BreakerStatus:
    state: Literal["closed", "open", "half-open"]
    failures: int
    retry_after: float  # seconds until an open circuit lets a probe through


class LimitStore(Protocol):
    async def admit(self, a: Admission) -> Verdict: ...

    async def release(self, a: Admission, health: Health, probing: bool) -> None: ...

    def breaker(self, upstream_id: int) -> BreakerStatus: ...

    def breaker_reset(self, upstream_id: int) -> None: ...


def _seconds(value: float) -> str:
    whole = max(1, math.ceil(value))
    return f"{whole} second{'s' if whole != 1 else ''}"


def limits_denial(a: Admission, verdict: Verdict, tool: str) -> Denial:
    """The refusal for a verdict, written for the model."""
    wait = _seconds(verdict.retry_after)
    match verdict.code:
        case "POLICY_GROUP_ISOLATION" if a.stateless:
            return Denial(
                "POLICY_GROUP_ISOLATION",
                f"Stateless requests with this API key used another isolated server group in the last "
                f"{_seconds(a.term)}, so {tool!r} (group {a.upstream.group_name!r}) is out of their reach: "
                f"isolated groups never share a conversation. Retry after {wait}, or use another API key of "
                f"this agent for group {a.upstream.group_name!r}.",
                POLICY_DENIED,
                verdict.retry_after,
            )
        case "POLICY_GROUP_ISOLATION":
            return Denial(
                "POLICY_GROUP_ISOLATION",
                f"This session already used another isolated server group, so {tool!r} (group "
                f"{a.upstream.group_name!r}) is out of its reach: isolated groups never share a session. "
                "Use a new session for it.",
            )
        case "UPSTREAM_CIRCUIT_OPEN":
            return Denial(
                "UPSTREAM_CIRCUIT_OPEN",
                f"The service {a.upstream.slug!r} failed repeatedly and is paused. Retry after {wait}.",
                RETRY_LATER,
                verdict.retry_after,
            )
        case "SESSION_CALL_LIMIT":
            return Denial(
                "SESSION_CALL_LIMIT",
                f"This session has made the {a.agent.max_calls_per_session} tool calls it may make. "
                "Start a new session.",
                POLICY_DENIED,
            )
        case "KEY_CALL_LIMIT":
            return Denial(
                "KEY_CALL_LIMIT",
                f"Stateless requests with this API key may make {a.agent.max_calls_per_session} tool calls in "
                f"{_seconds(a.term)}, and have made them. Retry after {wait}.",
                RETRY_LATER,
                verdict.retry_after,
            )
        case "AGENT_RATE_LIMITED":
            return Denial(
                "AGENT_RATE_LIMITED",
                f"{'You' if a.person else 'This agent'} may make {a.agent.calls_per_minute} tool calls a minute. "
                f"Retry after {wait}.",
                RETRY_LATER,
                verdict.retry_after,
            )
        case "UPSTREAM_RATE_LIMITED":
            return Denial(
                "UPSTREAM_RATE_LIMITED",
                f"The service {a.upstream.slug!r} takes {a.upstream.calls_per_minute} calls a minute. "
                f"Retry after {wait}.",
                RETRY_LATER,
                verdict.retry_after,
            )
        case "UPSTREAM_BUSY":
            return Denial(
                "UPSTREAM_BUSY",
                f"The service {a.upstream.slug!r} is running its maximum of {a.upstream.max_concurrent} calls "
                f"at once. Retry after {wait}.",
                RETRY_LATER,
                verdict.retry_after,
            )
        case "TEAM_RATE_LIMITED" | "TEAM_BUSY" | "TEAM_DAILY_BUDGET" | "UPSTREAM_SHARE_BUSY":
            return _team_denial(a, verdict)
        case "LIMITS_UNAVAILABLE":
            return Denial(
                "LIMITS_UNAVAILABLE",
                f"The gateway cannot check its limits right now, so {tool!r} was not run. Retry after {wait}.",
                RETRY_LATER,
                verdict.retry_after,
            )
    raise ValueError(f"unknown verdict {verdict.code!r}")


def _team_denial(a: Admission, verdict: Verdict) -> Denial:
    team = a.agent.team
    assert team is not None
    wait = _seconds(verdict.retry_after)
    messages = {
        "TEAM_RATE_LIMITED": f"Team {team.slug!r} may make {team.calls_per_minute} tool calls a minute, all its "
        f"agents together. Retry after {wait}.",
        "TEAM_BUSY": f"Team {team.slug!r} is running its maximum of {team.max_concurrent} calls at once. "
        f"Retry after {wait}.",
        "TEAM_DAILY_BUDGET": f"Team {team.slug!r} has made the {team.daily_calls} tool calls it may make today; "
        f"its budget renews at 00:00 UTC. Retry after {wait}.",
        "UPSTREAM_SHARE_BUSY": f"The service {a.upstream.slug!r} is shared with team {team.slug!r}, which may run "
        f"{a.upstream.share} of its calls at once and is running them. Retry after {wait}.",
    }
    return Denial(verdict.code, messages[verdict.code], RETRY_LATER, verdict.retry_after)
