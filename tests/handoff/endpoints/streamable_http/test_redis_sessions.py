"""2025-11-25 sessions in Redis: what an ended session leaves there lasts no longer than its sweep needs."""

import asyncio

import pytest
from django.conf import settings

from gateway_project.lib.redis_clients import async_redis
from handoff.endpoints.streamable_http.redis_sessions import SWEPT_WITHIN, RedisSessions
from handoff.mcp.caller import Caller
from handoff.session_limit import RedisSessionLimit
from tests.conftest import needs
from tests.helpers import until

IDLE = 1  # seconds: a record that expires while the test waits
BOUND = 10.0


def ended_mark_ttl(how: str) -> int:
    """Open a session in Redis, end it `how` (deleted by its client, or expired for want of use and swept), and
    return how long its end's mark has left to live."""

    async def scenario() -> int:
        store = RedisSessions(10, RedisSessionLimit(10, IDLE), IDLE, 10)
        session = await store.open(Caller(agent_id=41, agent_name="soak", transport="http", key_prefix="sb_41"))
        await store.save(session)
        if how == "deleted":
            await store.pop(session)
        else:
            record = f"{settings.GATEWAY_REDIS_PREFIX}mcp-session:{session.id}"

            async def gone() -> bool:
                return not await async_redis().exists(record)

            await until(gone, timeout=BOUND)  # it expires for want of use
            session.seen -= IDLE  # unused for longer than its idle time, as the reaper sees it
            assert [swept.id async for swept in store.expired()] == [session.id]
        return await async_redis().ttl(f"{settings.GATEWAY_REDIS_PREFIX}mcp-ended:{session.id}")

    return asyncio.run(scenario())


@pytest.mark.parametrize("how", ["deleted", "expired"])
def test_an_ended_sessions_mark_in_redis_lasts_its_idle_time_and_a_sweep_not_an_hour(how):
    needs(bool(settings.REDIS_URL), "REDIS_URL is not set: the sessions are in the process")

    assert 0 < ended_mark_ttl(how) <= IDLE + SWEPT_WITHIN
