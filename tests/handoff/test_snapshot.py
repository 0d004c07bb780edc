"""The routing snapshot's version moves with every change that routing reads, however it is made."""

import pytest
from asgiref.sync import sync_to_async

from handoff.snapshot import snapshot_compile
from policy.config_version import config_version
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


def test_a_holder_told_to_look_again_looks_however_long_ago_the_machine_started(db, settings):
    """Monotonic time counts from boot: a holder that checks once a day (longer than this machine has been up)
    still reads the new version when asked for a newer one."""
    import anyio

    from handoff.snapshot import SnapshotHolder
    from policy.services import agent_create

    settings.GATEWAY_SNAPSHOT_CHECK_SECONDS = 86_400 * 365 * 100

    async def scenario() -> tuple[int, int, bool]:
        holder = SnapshotHolder()
        first = await holder.get()
        issued = await sync_to_async(agent_create)(name="late-comer")
        later = await holder.at_least(await sync_to_async(config_version)())
        return first.version, later.version, issued.agent.id in later.agents

    first, later, known = anyio.run(scenario)
    assert later > first and known
