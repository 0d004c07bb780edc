"""The routing snapshot's version moves with every change that routing reads, however it is made."""

import pytest

from handoff.snapshot import config_version, snapshot_compile
from policy.models import Agent, ServerGroup
from registry.models import Upstream


@pytest.mark.parametrize(
    "change",
    [
        lambda: Agent.objects.create(name="version-probe"),
        lambda: ServerGroup.objects.create(name="version-probe"),
        lambda: Upstream.objects.create(slug="version-probe", transport="stdio", command="x"),
    ],
    ids=["agent", "group", "upstream"],
)
def test_saving_and_deleting_a_routing_row_moves_the_version(db, change):
    before = config_version()
    row = change()
    saved = config_version()
    row.delete()
    assert before < saved < config_version()


def test_a_compiled_snapshot_holds_only_keys_of_enabled_agents_and_reachable_tools(world):
    snap = snapshot_compile()
    names = {entry.agent_name for entry in snap.keys.values()}
    assert "alice" in names and "mallory" not in names
    alice = next(entry.agent_id for entry in snap.keys.values() if entry.agent_name == "alice")
    denial, entry, upstream = snap.decide(alice, "demo__echo")
    assert (denial, entry.route.tool, upstream) == (None, "echo", "demo")
    names = {tool["name"] for tool in snap.visible_for(alice)}
    assert names >= {"demo__echo", "time__get_current_time", "every__echo"}
    assert snap.version == config_version()
