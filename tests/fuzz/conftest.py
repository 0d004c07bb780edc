"""What the fuzzing tests share: their bounds (small for CI, larger through scripts/fuzz) and the agent whose
session they fuzz, calling the demo upstream `fuzz`."""

import asyncio
import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

from handoff.mcp.caller import Caller
from tests.factories import agent, demo_upstream

# scripts/fuzz sets these for a longer run; the defaults are the CI slice.
SECONDS = int(os.environ.get("FUZZ_SECONDS", "0"))  # per atheris target; 0: a fixed number of runs instead
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "0"))  # per hypothesis property and per REST operation

settings.register_profile(
    "fuzz",
    max_examples=EXAMPLES or 40,
    deadline=None,  # the first example of a session warms the snapshot and the upstream's pool
    derandomize=not EXAMPLES,  # CI's slice is the same every run; a longer run explores
    suppress_health_check=[HealthCheck.too_slow],
)
FUZZ = settings.get_profile("fuzz")


@pytest.fixture(scope="session")
def fuzz_agent(db) -> Iterator[Caller]:
    """An agent that may call the demo upstream `fuzz` (run on this process's pool by the inline executor)."""
    # Its own limits well above what every property together sends, so a rate limit never reads as a finding.
    with (
        demo_upstream("fuzz", calls_per_minute=1_000_000),
        agent("fuzz-agent", calls_per_minute=1_000_000) as (
            someone,
            key,
        ),
    ):
        yield Caller(agent_id=someone.id, agent_name=someone.name, transport="test", key_prefix=key[3:15])


@pytest.fixture(scope="session")
def loop() -> Iterator[asyncio.Runner]:
    """One event loop for every example, as a web process has one: a loop per example would leave each of its
    executor's threads holding a database connection, hundreds of them."""
    with asyncio.Runner() as runner:
        yield runner
