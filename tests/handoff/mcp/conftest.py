import pytest

from handoff.mcp.caller import Caller
from tests.factories import agent, demo_upstream


@pytest.fixture(scope="module")
def caller(db):
    """An agent that may call the demo upstream `layer` (run on this process's pool by the inline executor);
    one per module, since making the upstream syncs its catalog from a server started for it."""
    with demo_upstream("layer"), agent("layer-agent") as (someone, key):
        yield Caller(agent_id=someone.id, agent_name=someone.name, transport="test", key_prefix=key[3:15])
