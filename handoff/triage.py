"""Triage tools written in Python. Put a `triage.py` module in any installed Django app (GATEWAY_EXTRA_APPS
adds yours) and register handlers:

    from handoff.triage import Handoff, triage_tool

    @triage_tool(name="route_by_topic", description="...", input_schema={...})
    def route_by_topic(arguments, agent_name):
        return Handoff(target="mcp://finance.internal", reason="...", carry_over_state={...})

The tool appears to agents as `<gateway><sep><name>`, offered to the agents of the teams it names:
`teams=("payments", "support")`, or `teams=ALL_TEAMS` for every team's. Left out, the default team's only: a
tool written before teams keeps working there, and a team made since gets no tool it was not written for
(docs/teams.md). Another team's agent is told the tool does not exist, as for any tool it may not reach.

A handler (plain or async) returns a `Handoff` to hand the session over, or anything else (text, or a dict sent
as JSON) to answer without one. `target` is a registry key (an upstream's slug) or an `mcp://host[:port]` /
`mcps://host` URI whose host's first label names the upstream.
"""

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from audit.models import DEFAULT_TEAM
from policy.manifest import tool_name_problem


@dataclass(frozen=True)
class Handoff:
    target: str
    reason: str = ""
    carry_over_state: Any = None
    domain: str = ""  # the namespace of the specialist's tools; empty: the target upstream's slug


@dataclass(frozen=True)
class TriageTool:
    name: str
    description: str
    handler: Callable[[dict[str, Any], str], Any]
    input_schema: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})
    teams: frozenset[str] | None = frozenset({DEFAULT_TEAM})  # whose agents it is offered to; None: every team's


ALL_TEAMS = None  # `teams=ALL_TEAMS`: offered to every team's agents
_registered: dict[str, TriageTool] = {}


def triage_tool(
    *,
    name: str,
    description: str,
    input_schema: dict[str, Any] | None = None,
    teams: Iterable[str] | None = (DEFAULT_TEAM,),
) -> Callable:
    """Register the decorated function as a triage tool, offered to the agents of `teams` (slugs; ALL_TEAMS:
    every team's)."""
    if problem := tool_name_problem(name):
        raise ValueError(f"triage tool name {name!r}: {problem}")
    if isinstance(teams, str):
        raise ValueError(f"triage tool {name!r}: teams is a list of team slugs, e.g. teams=({teams!r},)")
    offered = None if teams is ALL_TEAMS else frozenset(teams)

    def register(handler: Callable[[dict[str, Any], str], Any]) -> Callable[[dict[str, Any], str], Any]:
        schema = input_schema or {"type": "object", "properties": {}}
        tool = TriageTool(name=name, description=description, handler=handler, input_schema=schema, teams=offered)
        _registered[name] = tool
        return handler

    return register


def triage_tools() -> dict[str, TriageTool]:
    return dict(_registered)
