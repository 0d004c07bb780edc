"""gateway_project/lib/redis_line.py, the line script_run runs a call's scripts over, against real Redis servers:
the shared one for what it answers, one of each test's own for what happens when Redis goes away or hangs."""

import asyncio
import hashlib
import re
import signal
import socket
import uuid
from collections.abc import AsyncIterator
from contextlib import ExitStack, asynccontextmanager

import anyio
import pytest
import redis
import redis.exceptions
from django.conf import settings

from gateway_project.lib import redis_line
from gateway_project.lib.redis_clients import script_run, sync_redis
from tests.conftest import needs
from tests.helpers import own_redis, run, until


@pytest.fixture
def shared() -> None:
    needs(bool(settings.REDIS_URL), "REDIS_URL is not set")


def connection() -> redis_line._Protocol:
    """The loop's line's present connection."""
    return redis_line.line_for(settings.REDIS_URL)._protocol


def test_replies_come_back_as_redis_py_gives_them(shared):
    key = f"{settings.GATEWAY_REDIS_PREFIX}test-line:{uuid.uuid4().hex}"
    sync_redis().set(key, "é", ex=60)
    scripts = {
        "return {7, redis.call('GET', KEYS[1]), {false, 'x', {ARGV[1]}}}": [7, "é".encode(), [None, b"x", [b"1.5"]]],
        "return ARGV[1] + 1": 2,  # Lua numbers come back as integers, truncated
        "return redis.call('GET', KEYS[1] .. ':none')": None,
        "return {ok = 'fine'}": b"fine",
        "return true": 1,
    }
    for script, expected in scripts.items():
        assert anyio.run(script_run, script, [key], [1.5]) == expected == sync_redis().eval(script, 1, key, 1.5)


def test_a_script_s_error_is_redis_py_s_exception_with_redis_s_message(shared):
    script = "return redis.call('INCR', KEYS[1])"
    key = f"{settings.GATEWAY_REDIS_PREFIX}test-line:{uuid.uuid4().hex}"
    sync_redis().set(key, "not a number", ex=60)

    with pytest.raises(redis.exceptions.ResponseError) as raised:
        run(lambda: script_run(script, [key], []))

    assert type(raised.value) is redis.exceptions.ResponseError
    digest = hashlib.sha1(script.encode()).hexdigest()
    assert str(raised.value) == f"value is not an integer or out of range script: {digest}, on @user_script:1."


def test_an_argument_redis_cannot_be_sent_is_a_data_error(shared):
    with pytest.raises(redis.exceptions.DataError, match=r"^A tuple item must be str, int, float or bytes\.$"):
        run(lambda: script_run("return 1", [], [None]))


def test_concurrent_scripts_on_one_line_each_get_their_own_answer(shared):
    async def scenario() -> list:
        return await asyncio.gather(*(script_run("return {ARGV[1], KEYS[1]}", [f"k{i}"], [i]) for i in range(200)))

    assert run(scenario) == [[str(i).encode(), f"k{i}".encode()] for i in range(200)]


def test_a_caller_cancelled_mid_command_leaves_the_line_in_step(shared):
    async def scenario() -> None:
        await script_run("return 0", [], [])  # the line is open: the next script is written at once
        connection().transport.pause_reading()  # its reply stays unread until the caller is cancelled
        cancelled = asyncio.create_task(script_run("return ARGV[1]", [], ["cancelled"]))
        await until(lambda: len(connection().waiters) == 1)  # written, waiting for its reply
        cancelled.cancel()
        connection().transport.resume_reading()
        assert await script_run("return ARGV[1]", [], ["next"]) == b"next"
        assert cancelled.cancelled() and not connection().waiters
        assert asyncio.all_tasks() == {asyncio.current_task()}  # the line runs no task of its own

    run(scenario)


def test_a_url_asking_for_what_only_redis_py_does_gets_no_line(shared):
    async def scenario() -> None:
        assert redis_line.line_for("rediss://127.0.0.1:6379/0") is None
        assert redis_line.line_for("redis://127.0.0.1:6379/0?socket_timeout=3") is None
        assert redis_line.line_for("unix:///run/redis.sock?db=2") is not None

    run(scenario)


def test_each_event_loop_has_its_own_line_and_a_finished_loop_s_is_let_go(shared):
    async def line() -> redis_line.Line:
        await script_run("return 1", [], [])
        return redis_line.line_for(settings.REDIS_URL)

    first, second = run(line), run(line)

    assert first is not second and first.loop.is_closed()
    assert first not in redis_line._lines.values() and second in redis_line._lines.values()


def test_a_connection_that_does_not_open_fails_within_the_bound(settings, monkeypatch):
    monkeypatch.setattr(redis_line, "TIMEOUT_SECONDS", 0.3)
    with socket.socket() as listener, ExitStack() as held:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)  # never accepted: once its queue is full, the kernel leaves new connections unanswered
        port = listener.getsockname()[1]
        for _ in range(10):
            filler = held.enter_context(socket.socket())
            filler.settimeout(0.2)
            try:
                filler.connect(("127.0.0.1", port))
            except TimeoutError:
                break
        settings.REDIS_URL = f"redis://127.0.0.1:{port}"

        with pytest.raises(redis.exceptions.TimeoutError, match=rf"^Timeout connecting to 127\.0\.0\.1:{port}$"):
            run(lambda: script_run("return 1", [], []))


@asynccontextmanager
async def not_redis(settings, answer: bytes) -> AsyncIterator[None]:
    """A server that is not Redis, on a socket of the test's own, as REDIS_URL: each command gets `answer`."""

    async def answer_each(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.read(4096):
            writer.write(answer)

    async with await asyncio.start_server(answer_each, "127.0.0.1", 0) as server:
        settings.REDIS_URL = f"redis://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        yield


def test_garbage_from_redis_fails_the_command_and_drops_the_line(settings):
    error = 'Protocol error from Redis: Protocol error, got "?" as reply type byte'

    async def scenario() -> None:
        async with not_redis(settings, b"?garbage\r\n"):
            with pytest.raises(redis.exceptions.ConnectionError, match=f"^{re.escape(error)}$"):
                await script_run("return 1", [], [])
            assert str(connection().failure) == error

    run(scenario)


def test_a_reply_nobody_asked_for_drops_the_line(settings):
    async def scenario() -> None:
        async with not_redis(settings, b":1\r\n:2\r\n"):
            assert await script_run("return 1", [], []) == 1
            line = connection()
            await until(lambda: line.failure is not None)
            assert str(line.failure) == "Protocol error from Redis: a reply nobody asked for"

    run(scenario)


@pytest.mark.e2e
def test_the_url_s_password_and_database_are_used(settings, tmp_path):
    with own_redis(tmp_path / "redis.log", "--requirepass", "s3cret") as server:
        settings.REDIS_URL = server.url.replace("//", "//:s3cret@") + "/3"
        key = "test-line-db"

        assert run(lambda: script_run("return redis.call('SET', KEYS[1], 'here')", [key], [])) == b"OK"
        assert redis.Redis.from_url(settings.REDIS_URL).get(key) == b"here"

        settings.REDIS_URL = server.url.replace("//", "//:wrong@")
        with pytest.raises(redis.exceptions.AuthenticationError) as raised:
            run(lambda: script_run("return 1", [], []))
        assert str(raised.value) == "invalid username-password pair or user is disabled."


@pytest.mark.e2e
def test_a_flushed_script_is_sent_again_by_its_text(settings, tmp_path):
    with own_redis(tmp_path / "redis.log") as server:
        settings.REDIS_URL = server.url

        async def scenario() -> None:
            assert await script_run("return ARGV[1]", [], ["loaded"]) == b"loaded"
            await redis_line.line_for(settings.REDIS_URL).command("SCRIPT", "FLUSH")
            assert await script_run("return ARGV[1]", [], ["again"]) == b"again"

        run(scenario)


@pytest.mark.e2e
def test_redis_restarted_fails_a_call_at_once_and_the_next_after_it_is_back_succeeds(settings, tmp_path):
    with own_redis(tmp_path / "redis.log") as server:
        settings.REDIS_URL = server.url
        port = server.url.rsplit(":", 1)[1]

        async def scenario() -> None:
            assert await script_run("return 1", [], []) == 1
            server.stop()
            await until(lambda: connection().failure is not None)  # the socket's close is seen, not left for a call
            with pytest.raises(redis.exceptions.ConnectionError) as raised:
                await script_run("return 1", [], [])
            assert str(raised.value) == f"Error 111 connecting to 127.0.0.1:{port}. Connection refused."
            with own_redis(tmp_path / "again.log", port=int(port)):
                assert await script_run("return 2", [], []) == 2

        run(scenario)


@pytest.mark.e2e
def test_commands_waiting_when_redis_dies_fail_with_a_connection_error(settings, tmp_path):
    with own_redis(tmp_path / "redis.log") as server:
        settings.REDIS_URL = server.url
        busy = "local t = redis.call('TIME') repeat until redis.call('TIME')[1] - t[1] > 20 return 1"

        async def scenario() -> None:
            await script_run("return 1", [], [])
            await redis_line.line_for(settings.REDIS_URL).command("SCRIPT", "LOAD", busy)  # no NOSCRIPT answer first
            waiting = [asyncio.create_task(script_run(busy if i == 0 else "return 1", [], [])) for i in range(3)]
            await until(lambda: len(connection().waiters) == 3)
            server.process.send_signal(signal.SIGKILL)
            for task in waiting:
                with pytest.raises(redis.exceptions.ConnectionError, match=r"^Connection closed by server\.$"):
                    await task

        run(scenario)


@pytest.mark.e2e
def test_a_hung_redis_fails_commands_within_the_bound_and_the_line_recovers(settings, tmp_path, monkeypatch):
    monkeypatch.setattr(redis_line, "TIMEOUT_SECONDS", 0.3)
    with own_redis(tmp_path / "redis.log") as server:
        settings.REDIS_URL = server.url

        async def scenario() -> None:
            await script_run("return 1", [], [])
            server.process.send_signal(signal.SIGSTOP)
            try:
                with pytest.raises(redis.exceptions.TimeoutError, match=r"^Timeout reading from Redis$"):
                    await script_run("return 1", [], [])
                settings.REDIS_URL = f"{server.url}/1"  # a new line: it connects (the kernel answers), its SELECT hangs
                with pytest.raises(redis.exceptions.TimeoutError, match=r"^Timeout reading from Redis$"):
                    await script_run("return 1", [], [])
            finally:
                server.process.send_signal(signal.SIGCONT)
            assert await script_run("return 3", [], []) == 3
            settings.REDIS_URL = server.url
            assert await script_run("return 4", [], []) == 4

        run(scenario)
