"""Python triage tools are offered to the agents of the teams they name (the default team's when they name none),
in tools/list and tools/call, as the admin routes are to their own team's."""

import anyio
import pytest
from mcp import types
from mcp.shared.exceptions import MCPError

from handoff import triage
from handoff.mcp.caller import Caller
from handoff.mcp.tools import call_tool, list_tools
from handoff.snapshot import snapshot_compile
from handoff.triage import ALL_TEAMS, triage_tool
from tests.factories import agent, team
from tests.handoff.mcp.test_tools import _ctx
from tests.helpers import snapshot_current


@pytest.fixture
def offered(monkeypatch) -> None:
    """Three triage tools: one for team triage-a, one for every team, one naming no team."""
    monkeypatch.setattr(triage, "_registered", {})
    for name, teams in (("for_a", {"teams": ("triage-a",)}), ("for_all", {"teams": ALL_TEAMS}), ("for_default", {})):
        triage_tool(name=name, description=f"Triage {name}.", **teams)(lambda arguments, agent_name: "triaged")


def _listed_and_called(caller: Caller, name: str) -> tuple[set[str], dict | MCPError]:
    async def asking() -> tuple[set[str], dict | MCPError]:
        await snapshot_current()
        listed = {tool["name"] for tool in (await list_tools(_ctx(caller), None))["tools"]}
        try:
            return listed, await call_tool(_ctx(caller), types.CallToolRequestParams(name=name, arguments={}))
        except MCPError as refused:
            return listed, refused

    return anyio.run(asking)


def test_a_triage_tool_offered_to_team_a_is_unknown_to_team_bs_agent(db, offered):
    with team("triage-a") as a, team("triage-b") as b, agent("triager-a", team=a) as (ours, _):
        with agent("triager-b", team=b) as (theirs, _):
            callers = [
                Caller(someone.id, someone.name, "test", "", team=t.slug) for someone, t in ((ours, a), (theirs, b))
            ]
            [(listed_a, called_a), (listed_b, refused)] = [_listed_and_called(c, "switchboard__for_a") for c in callers]
    assert {"switchboard__for_a", "switchboard__for_all"} <= listed_a and "switchboard__for_default" not in listed_a
    assert called_a["content"] == [{"type": "text", "text": "triaged"}]
    assert "switchboard__for_a" not in listed_b and "switchboard__for_all" in listed_b
    assert (refused.error.code, refused.error.data["code"], refused.error.message) == (
        types.INVALID_PARAMS,
        "TOOL_NOT_FOUND",
        "Unknown tool: 'switchboard__for_a'. Call tools/list for the tools this gateway offers.",
    )


def test_a_triage_tool_naming_no_team_is_the_default_teams_as_before_teams(db, offered):
    with agent("triager-default") as (someone, _):
        snap = snapshot_compile()
        ours = ("switchboard__for_a", "switchboard__for_all", "switchboard__for_default")  # not another test's routes
        offered_to = {name: getattr(snap.gateway_denial(someone.id, name), "code", None) for name in ours}
    assert offered_to == {
        "switchboard__for_a": "TOOL_NOT_FOUND",
        "switchboard__for_all": None,
        "switchboard__for_default": None,
    }


def test_teams_named_by_one_string_are_refused_at_registration():
    with pytest.raises(ValueError, match=r"teams is a list of team slugs, e.g. teams=\('payments',\)"):
        triage_tool(name="by_string", description="Oops.", teams="payments")
