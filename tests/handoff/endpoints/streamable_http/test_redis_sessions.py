"""2025-11-25 sessions in Redis: what an ended session leaves there lasts no longer than its sweep needs; a request's
read of its session brings the session's handoff entry along."""

import asyncio
import uuid

import pytest
from django.conf import settings

from gateway_project.lib.redis_clients import async_redis
from handoff.endpoints.streamable_http.redis_sessions import SWEPT_WITHIN, RedisSessions
from handoff.mcp.caller import Caller
from handoff.protocol.tunnels import SessionTunnel, index_session, session_index
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


async def _read_with_its_entry(agent_id: int) -> str:
    """A session whose handoff entry its read brought along (as a request's front door reads both), the entry gone
    from Redis since: returns the session's index key. A look that asks Redis finds nothing."""
    store = RedisSessions(10, RedisSessionLimit(10, IDLE), 60, 10)
    caller = Caller(agent_id=agent_id, agent_name="soak", transport="http", key_prefix=f"sb_{agent_id}")
    session = await store.open(caller)
    await store.save(session)
    index = index_session(agent_id, session.id)
    entry = SessionTunnel(tunnel_id=str(uuid.uuid4()), domain="billing", upstream_slug="billing")
    await session_index().put(index, entry)
    assert await store.get(session.id, session.owner) is session  # reads the entry too
    await session_index().forget(index, entry.tunnel_id)
    return index


def test_the_first_look_at_the_index_after_a_session_is_read_takes_the_entry_read_with_it_and_later_ones_ask_redis():
    needs(bool(settings.REDIS_URL), "REDIS_URL is not set: the sessions are in the process")

    async def scenario() -> tuple[SessionTunnel | None, SessionTunnel | None]:
        index = await _read_with_its_entry(42)
        return await session_index().get(index), await session_index().get(index)

    first, later = asyncio.run(scenario())
    assert first is not None and first.domain == "billing"
    assert later is None


def test_the_entry_read_with_a_session_is_taken_once_even_by_a_task_the_request_started():
    needs(bool(settings.REDIS_URL), "REDIS_URL is not set: the sessions are in the process")

    async def scenario() -> tuple[SessionTunnel | None, SessionTunnel | None]:
        index = await _read_with_its_entry(43)
        started = await asyncio.create_task(session_index().get(index))  # a copy of this context takes it
        return started, await session_index().get(index)

    started, later = asyncio.run(scenario())
    assert started is not None and started.domain == "billing"
    assert later is None, "the request's own look took an entry a task it started had taken already"
