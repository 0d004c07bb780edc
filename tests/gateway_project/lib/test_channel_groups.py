"""gateway_project/lib/channel_groups.py against a Redis server of the test's own, which it flushes and stops:
a listener whose group Redis forgot is heard again within the renewal, and Redis away does not end the renewal."""

import asyncio
import logging

import pytest
import redis
from channels_redis.core import RedisChannelLayer

from gateway_project.lib.channel_groups import membership_kept
from tests.helpers import own_redis, run, until

GROUP = "switchboard.test-group"


def _members(url: str) -> list[bytes]:
    """Every channel in GROUP, straight from Redis (channels_redis keeps a group as a sorted set)."""
    client = redis.Redis.from_url(url)
    return [m for key in client.keys(f"*{GROUP}*") for m in client.zrange(key, 0, -1)]


@pytest.mark.e2e
def test_a_listener_a_flushed_redis_forgot_is_in_its_group_again_and_hears_it(tmp_path):
    with own_redis(tmp_path / "redis.log") as server:

        async def scenario() -> dict:
            layer = RedisChannelLayer(hosts=[server.url])
            channel = await layer.new_channel()
            await layer.group_add(GROUP, channel)
            redis.Redis.from_url(server.url).flushdb()
            assert _members(server.url) == []  # forgotten: a group_send now would reach nobody
            kept = asyncio.create_task(membership_kept(layer, GROUP, channel, every=0.05))
            try:
                await until(lambda: _members(server.url) == [channel.encode()])
                await layer.group_send(GROUP, {"type": "test.heard", "n": 1})
                return await asyncio.wait_for(layer.receive(channel), 5)
            finally:
                kept.cancel()
                await layer.flush()

        assert run(scenario) == {"type": "test.heard", "n": 1}


@pytest.mark.e2e
def test_redis_away_is_logged_and_the_membership_is_renewed_once_it_is_back(tmp_path, caplog):
    with own_redis(tmp_path / "redis.log") as server:
        port = int(server.url.rsplit(":", 1)[1])

        async def scenario() -> None:
            layer = RedisChannelLayer(hosts=[server.url])
            channel = await layer.new_channel()
            kept = asyncio.create_task(membership_kept(layer, GROUP, channel, every=0.05))
            try:
                await until(lambda: _members(server.url) == [channel.encode()])
                server.stop()
                await until(lambda: "membership not renewed" in caplog.text)
                assert not kept.done()
                with own_redis(tmp_path / "again.log", port=port):  # started empty
                    await until(lambda: _members(server.url) == [channel.encode()], timeout=10)
            finally:
                kept.cancel()

        with caplog.at_level(logging.WARNING, logger="gateway_project.lib.channel_groups"):
            run(scenario)
        assert caplog.records[0].getMessage() == (
            f"channel group {GROUP}: membership not renewed (tried again shortly)"
        )
