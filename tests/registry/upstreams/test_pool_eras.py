"""Which connection a plain call takes by its agent's era (the pool on its own, against the real demo server over
stdio): a 2025-11-25 agent's goes in that era, on a connection of its own, where the upstream speaks both; where the
upstream speaks one era, both eras' calls share its one connection."""

from dataclasses import replace

from registry.upstreams.pool import UpstreamPool
from registry.upstreams.requests import UpstreamRequest
from tests.factories import DEMO_SPEC
from tests.helpers import server_pid, until, with_pool

LEGACY, MODERN = "2025-11-25", "2026-07-28"


async def _pid(pool: UpstreamPool, legacy: bool) -> int:
    outcome = await pool.request(UpstreamRequest.tool_call(1, 1, "pid", {}, legacy=legacy))
    assert outcome["ok"], outcome
    return server_pid(outcome["result"]["content"][0]["text"])


def _eras(pool: UpstreamPool) -> dict[tuple[str, ...], str]:
    """The pool's open connections: the capabilities each is keyed by, and the era it speaks."""
    return {tuple(sorted(key[1])): c.client.protocol_version for key, c in pool._connections.items() if c.alive}


def test_a_legacy_agents_plain_call_to_a_dual_era_upstream_goes_in_its_era_and_hears_the_upstreams_changes():
    heard: list[tuple[int, str]] = []

    async def changed(upstream_id: int, kind: str) -> None:
        heard.append((upstream_id, kind))

    async def body(pool: UpstreamPool):
        legacy = await _pid(pool, legacy=True)
        # No shared connection is open yet: the legacy one hears the change its own call announced.
        announced = await pool.request(UpstreamRequest.tool_call(1, 1, "announce", {}, legacy=True))
        await until(lambda: heard == [(1, "tools")])
        return announced, legacy, await _pid(pool, legacy=False), await _pid(pool, legacy=True), _eras(pool)

    announced, legacy, modern, again, eras = with_pool(DEMO_SPEC, body, on_change=changed)
    assert announced["result"]["content"][0]["text"] == "announced"
    assert eras == {(): MODERN, ("legacy",): LEGACY}
    assert legacy != modern and again == legacy, "each era its own connection, each kept"


def test_an_upstream_that_speaks_only_2025_11_25_serves_both_eras_plain_calls_on_one_connection():
    spec = replace(DEMO_SPEC, env={"DEMO_LEGACY_ONLY": "1"}, legacy=True)  # as its last sync found it

    async def body(pool: UpstreamPool):
        return await _pid(pool, legacy=True), await _pid(pool, legacy=False), _eras(pool), dict(pool._one_era)

    legacy, modern, eras, one_era = with_pool(spec, body)
    assert (legacy, eras, one_era) == (modern, {(): LEGACY}, {1: 1})


def test_an_upstream_that_speaks_only_2026_07_28_serves_a_legacy_agents_plain_calls_on_the_shared_connection():
    spec = replace(DEMO_SPEC, env={"DEMO_MODERN_ONLY": "1"})  # a sync cannot tell it from one that speaks both

    async def body(pool: UpstreamPool):
        first = await _pid(pool, legacy=True)  # its own connection turned out 2026-07-28: stopped for the shared one
        return first, await _pid(pool, legacy=False), await _pid(pool, legacy=True), _eras(pool), dict(pool._one_era)

    first, modern, again, eras, one_era = with_pool(spec, body)
    assert (first, again, eras, one_era) == (modern, modern, {(): MODERN}, {1: 1})
