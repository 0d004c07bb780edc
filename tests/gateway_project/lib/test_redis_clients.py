"""gateway_project/lib/redis_clients.py's script_run and command against a real Redis: a script goes by its digest,
and by its text to a Redis that does not hold it; a command answers and fails as redis-py does, over the line or over
redis-py's client."""

import hashlib
import uuid

import anyio
import pytest
import redis.exceptions
from django.conf import settings

from gateway_project.lib import redis_clients, redis_line
from gateway_project.lib.redis_clients import command, script_run, sync_redis
from tests.conftest import needs


def test_a_script_redis_does_not_hold_is_sent_once_and_then_held():
    needs(bool(settings.REDIS_URL), "REDIS_URL is not set")
    mark = uuid.uuid4().hex
    script = f"return ARGV[1] .. '{mark}' .. redis.call('GET', KEYS[1])"  # a text this Redis has never seen
    digest = hashlib.sha1(script.encode()).hexdigest()
    key = f"{settings.GATEWAY_REDIS_PREFIX}test-script:{mark}"
    sync_redis().set(key, "!", ex=60)
    assert sync_redis().script_exists(digest) == [False]
    assert anyio.run(script_run, script, [key], ["first-"]) == f"first-{mark}!".encode()  # NOSCRIPT, then its text
    assert sync_redis().script_exists(digest) == [True]
    assert anyio.run(script_run, script, [key], ["again-"]) == f"again-{mark}!".encode()


@pytest.mark.parametrize("query", ["", "?socket_timeout=3"])  # the line; a URL only redis-py's client serves
def test_a_command_answers_and_fails_as_redis_py_does_over_the_line_or_redis_py_s_client(settings, query):
    needs(bool(settings.REDIS_URL), "REDIS_URL is not set")
    key = f"{settings.GATEWAY_REDIS_PREFIX}test-command:{uuid.uuid4().hex}"
    sync_redis().set(key, "here", ex=60)  # before the URL changes: the process keeps its first synchronous client
    settings.REDIS_URL += query

    async def main() -> tuple[object, object, bool]:
        raw, missing = await command("GET", key), await command("GET", f"{key}:missing")
        with pytest.raises(redis.exceptions.ResponseError, match="^value is not an integer or out of range$") as error:
            await command("INCR", key)
        assert isinstance(error.value, redis_clients.RedisError)  # what callers catch
        line = redis_line.line_for(settings.REDIS_URL)
        return raw, missing, line is not None and line._protocol is not None

    assert anyio.run(main) == (b"here", None, not query)
