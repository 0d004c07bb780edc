"""gateway_project/lib/redis_clients.py's script_run against a real Redis: a script goes by its digest, and by its
text to a Redis that does not hold it."""

import hashlib
import uuid

import anyio
from django.conf import settings

from gateway_project.lib.redis_clients import script_run, sync_redis
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
