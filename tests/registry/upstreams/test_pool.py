"""The upstream pool on its own, in this process, against the real demo server over stdio."""

import os
import signal
import sys
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from django.test import override_settings

from registry.upstreams.pool import UpstreamPool
from registry.upstreams.requests import UpstreamRequest
from registry.upstreams.spec import UpstreamSpec
from tests.factories import DEMO_SPEC
from tests.helpers import until
from tests.servers import demo_started


def with_pool(spec: UpstreamSpec, body: Callable[[UpstreamPool], Awaitable[Any]]) -> Any:
    """Run `body` against a serving pool whose only upstream is `spec`, then stop the pool."""

    async def load_spec(upstream_id: int, person: dict | None = None, catalog: bool = False) -> UpstreamSpec:
        return spec

    async def scenario() -> Any:
        pool = UpstreamPool(load_spec)
        async with anyio.create_task_group() as tg:
            await tg.start(pool.serve)
            try:
                return await body(pool)
            finally:
                tg.cancel_scope.cancel()

    return anyio.run(scenario)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return not open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"


async def _in_flight(pool: UpstreamPool) -> None:
    """Until a call is running on one of the pool's sessions."""
    await until(lambda: any(connection.in_flight for connection in pool._connections.values()))


def test_an_idle_session_is_closed_and_the_next_call_reopens_it():
    async def pid(pool: UpstreamPool) -> int:
        return int((await pool.request(UpstreamRequest.tool_call(1, 1, "pid", {})))["result"]["content"][0]["text"])

    async def body(pool: UpstreamPool) -> tuple[int, int, int]:
        first = await pid(pool)
        pool.close_idle(3600)
        kept = await pid(pool)
        async with anyio.create_task_group() as calls:
            calls.start_soon(pool.request, UpstreamRequest.tool_call(1, 1, "sleep", {"seconds": 0.5}))
            await _in_flight(pool)
            pool.close_idle(0)  # the sleep is in flight: nothing may close under it
            assert _alive(first)
        pool.close_idle(0)
        await until(lambda: not _alive(first))
        return first, kept, await pid(pool)

    first, kept, reopened = with_pool(DEMO_SPEC, body)
    assert kept == first, "a session in use must stay open"
    assert reopened != first and not _alive(first)


@override_settings(GATEWAY_CONNECT_TIMEOUT=1)
def test_an_upstream_that_never_answers_the_handshake_is_a_connect_timeout():
    # It reads its input to the end and never writes: it exits once the pool closes its stdin, which `sleep`
    # would not, so the pool would wait its 2 s grace (registry/upstreams/stdio.py) before ending it.
    never = ["-c", "import sys; sys.stdin.read()"]
    silent = UpstreamSpec(
        id=2, revision=1, slug="silent", transport="stdio", timeout=5, command=sys.executable, args=never
    )
    outcome = with_pool(silent, lambda pool: pool.request(UpstreamRequest.tool_call(2, 1, "anything", {})))
    assert (outcome["ok"], outcome["code"]) == (False, "UPSTREAM_CONNECT_TIMEOUT")
    assert outcome["message"] == "The service did not answer while connecting. Try later."


def test_a_server_killed_during_a_call_is_named_in_the_operators_cause():
    """The model gets the generic words; the operator's cause says how the process ended."""

    mark = f"killed-{uuid.uuid4().hex[:12]}"

    async def body(pool: UpstreamPool) -> dict:
        pid = int((await pool.request(UpstreamRequest.tool_call(1, 1, "pid", {})))["result"]["content"][0]["text"])
        outcome: dict = {}

        async def sleeping() -> None:
            outcome.update(await pool.request(UpstreamRequest.tool_call(1, 1, "sleep", {"seconds": 30, "mark": mark})))

        async with anyio.create_task_group() as tg:
            tg.start_soon(sleeping)
            await until(lambda: demo_started(mark))  # the server is running the call
            os.kill(pid, signal.SIGKILL)
        return outcome

    outcome = with_pool(DEMO_SPEC, body)
    assert outcome["code"] == "UPSTREAM_UNAVAILABLE"
    assert outcome["cause"] == "the connection closed during a call: the server was killed by SIGKILL"


def test_a_change_subscription_lost_after_it_began_leaves_the_connection_standing(caplog):
    """A 2026-07-28 upstream's `subscriptions/listen` stream that ends later (its process killed here) is logged,
    and the connection goes on unlistened until a call finds it broken: no error out of the stream's task."""

    async def changed(upstream_id: int, kind: str) -> None:
        pass

    async def load_spec(upstream_id: int, person: dict | None = None, catalog: bool = False) -> UpstreamSpec:
        return DEMO_SPEC

    def heard(text: str) -> bool:
        return any(text in record.getMessage() for record in caplog.records)

    async def scenario() -> str:
        pool = UpstreamPool(load_spec, on_change=changed)
        async with anyio.create_task_group() as tg:
            await tg.start(pool.serve)
            try:
                answer = await pool.request(UpstreamRequest.tool_call(1, 1, "pid", {}))
                (connection,) = pool._connections.values()
                assert connection.client.protocol_version == "2026-07-28"
                os.kill(int(answer["result"]["content"][0]["text"]), signal.SIGKILL)
                await until(lambda: heard("change subscription ended"), timeout=10)
                return (await pool.request(UpstreamRequest.tool_call(1, 1, "pid", {})))["code"]
            finally:
                tg.cancel_scope.cancel()

    with caplog.at_level("INFO", logger="registry.upstreams.pool"):
        code = anyio.run(scenario)
    assert code == "UPSTREAM_UNAVAILABLE"  # the call that finds it broken says so; the next one reconnects
    assert not heard("called 'started' twice") and not heard("session ended with an error")
