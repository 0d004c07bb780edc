"""Teams through live gateways (both executors, both eras): an agent reaches its team's upstreams and those shared
with its team, and nothing of another team's: not listed, and called, as unknown as a tool that does not exist."""

import pytest
from mcp.shared.exceptions import MCPError

from policy.models import Team
from registry.models import Upstream
from tests.clients import call, sdk_client, tool_names
from tests.factories import agent
from tests.helpers import audit_mark, audit_since, eventually, run

MODES = ["legacy", "2026-07-28"]


@pytest.fixture
def ops(db):
    team = Team.objects.create(slug="ops", name="Ops")
    yield team
    Upstream.objects.get(slug="demo").shared_with.remove(team)
    team.delete()


def _instructions(gateway, key: str, mode: str) -> str:
    async def discovered() -> str:
        async with sdk_client(gateway.url, key, "legacy" if mode == "legacy" else "auto") as client:
            return client.instructions or ""

    return run(discovered)


@pytest.mark.parametrize("mode", MODES)
def test_another_teams_upstream_is_unknown_to_an_agent_until_it_is_shared_with_its_team(gateway, world, ops, mode):
    with agent(f"ops-bot-{mode}", team=ops) as (_, key):
        listed = eventually(lambda: run(lambda: tool_names(gateway.url, key, mode)), timeout=10)
        mark = audit_mark()
        refused = run(lambda: call(gateway.url, key, "demo__echo", {"text": "not yours"}, mode))
        told = _instructions(gateway, key, mode)
        [denied] = [row for row in audit_since(mark) if row.exposed_name == "demo__echo"]
        Upstream.objects.get(slug="demo").shared_with.add(ops)
        eventually(lambda: "demo__echo" in run(lambda: tool_names(gateway.url, key, mode)), timeout=10)
        answered = run(lambda: call(gateway.url, key, "demo__echo", {"text": "shared"}, mode))
        told_shared = _instructions(gateway, key, mode)

    assert not {name for name in listed if name.startswith("demo__")}
    assert isinstance(refused, MCPError)
    assert (refused.code, refused.data["code"]) == (-32602, "TOOL_NOT_FOUND")
    assert refused.message == "Unknown tool: 'demo__echo'. Call tools/list for the tools this gateway offers."
    assert (denied.kind, denied.error_code, denied.team) == ("denied", "TOOL_NOT_FOUND", "ops")
    assert answered.content[0].text == "shared"
    # What an upstream says of itself reaches only the agents that may reach it.
    assert told.startswith("This is a gateway to several services.") and "## demo\n" not in told
    assert "## demo\nTools for trying a gateway out" in told_shared
