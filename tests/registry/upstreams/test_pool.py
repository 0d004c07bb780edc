"""The upstream pool on its own, in this process, against the real demo server over stdio."""

import os
import signal
import sys
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
from django.test import override_settings

from registry.upstreams.pool import UpstreamPool
from registry.upstreams.requests import UpstreamRequest
from registry.upstreams.spec import UpstreamSpec
from tests.factories import DEMO, DEMO_SPEC
from tests.helpers import server_pid, transports_settle, until, with_pool
from tests.servers import demo_started


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"


def _reaped(pid: int) -> bool:
    """Whether a killed process is wholly gone. Its main thread shows as a zombie while its other threads are
    still ending, and until they have, its input is still open: a request written then may yet be read."""
    return not os.path.exists(f"/proc/{pid}")


async def _in_flight(pool: UpstreamPool) -> None:
    """Until a call is running on one of the pool's sessions."""
    await until(lambda: any(connection.in_flight for connection in pool._connections.values()))


def test_an_idle_session_is_closed_and_the_next_call_reopens_it():
    async def body(pool: UpstreamPool) -> tuple[int, int, int]:
        first = await _pid(pool)
        pool.close_idle(3600)
        kept = await _pid(pool)
        async with anyio.create_task_group() as calls:
            calls.start_soon(pool.request, UpstreamRequest.tool_call(1, 1, "sleep", {"seconds": 0.5}))
            await _in_flight(pool)
            pool.close_idle(0)  # the sleep is in flight: nothing may close under it
            assert _alive(first)
        pool.close_idle(0)
        await until(lambda: not _alive(first))
        return first, kept, await _pid(pool)

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


def test_a_server_killed_during_a_call_is_named_in_the_calls_error_and_the_operators_cause():
    """The call may have run: the agent is told how the server ended and to retry only what is safe to repeat."""

    mark = f"killed-{uuid.uuid4().hex[:12]}"

    async def body(pool: UpstreamPool) -> dict:
        pid = await _pid(pool)
        outcome: dict = {}

        async def sleeping() -> None:
            outcome.update(await pool.request(UpstreamRequest.tool_call(1, 1, "sleep", {"seconds": 30, "mark": mark})))

        async with anyio.create_task_group() as tg:
            tg.start_soon(sleeping)
            await until(lambda: demo_started(mark))  # the server is running the call
            os.kill(pid, signal.SIGKILL)
        return outcome

    outcome = with_pool(DEMO_SPEC, body)
    assert (outcome["code"], outcome["message"]) == (
        "UPSTREAM_UNAVAILABLE",
        "The service's process was killed by SIGKILL during the call; it is being restarted. "
        "The call may or may not have run: retry only if it is safe to repeat.",
    )
    assert outcome["cause"] == "the connection closed during a call: the server was killed by SIGKILL"
    assert "unsent" not in outcome


async def _pid(pool: UpstreamPool, legacy: bool = False) -> int:
    """The PID of the server that answered a call (of a 2025-11-25 agent's, with `legacy`)."""
    outcome = await pool.request(UpstreamRequest.tool_call(1, 1, "pid", {}, legacy=legacy))
    assert outcome["ok"], outcome
    return server_pid(outcome["result"]["content"][0]["text"])


def _health_pool(spec: UpstreamSpec, body: Callable[[UpstreamPool, list], Awaitable[Any]]) -> Any:
    """`with_pool` for a pool that keeps every health it stores in a list, and hears changes (so a 2026-07-28
    server's change subscription runs, as in the gateway)."""
    stored: list[tuple[str, str]] = []

    async def on_health(upstream_id: int, health: str, cause: str) -> None:
        stored.append((health, cause))

    async def changed(upstream_id: int, kind: str) -> None:
        pass

    return with_pool(spec, lambda pool: body(pool, stored), on_change=changed, on_health=on_health)


def test_a_server_killed_between_calls_is_failing_at_once_and_started_again_without_a_call(caplog):
    """Its exit is one log line with its status, not a traceback; the server is back before anyone calls."""

    async def body(pool: UpstreamPool, stored: list) -> tuple[int, int]:
        killed = await _pid(pool)
        (connection,) = pool._connections.values()
        assert connection.client.protocol_version == "2026-07-28"  # its change subscription is open
        os.kill(killed, signal.SIGKILL)
        await until(lambda: stored and stored[-1][0] == "failing", timeout=10)
        assert stored[-1][1] == "the server was killed by SIGKILL"
        await until(lambda: stored[-1] == ("ok", ""), timeout=30)  # the restart, which no call asked for
        (restarted,) = pool._connections.values()
        assert restarted.alive and restarted is not connection
        return killed, await _pid(pool)

    with caplog.at_level("INFO"):
        killed, served = _health_pool(DEMO_SPEC, body)
    assert served != killed
    said = [r for r in caplog.records if r.name.startswith("registry.upstreams")]
    assert [r.getMessage() for r in said if r.levelname == "WARNING"] == [
        "upstream demo: its server was killed by SIGKILL; starting it again in 1 s"
    ]
    assert not [r for r in said if r.exc_info], "an expected exit is no traceback"


@override_settings(GATEWAY_BREAKER_FIRST_OPEN_SECONDS=0.05, GATEWAY_BREAKER_RECOVERY_SECONDS=30)
def test_a_server_that_keeps_ending_soon_after_its_start_waits_twice_as_long_each_time(caplog):
    async def body(pool: UpstreamPool, stored: list) -> None:
        for _ in range(3):
            crashed = await pool.request(UpstreamRequest.tool_call(1, 1, "crash", {}))
            assert crashed["code"] == "UPSTREAM_UNAVAILABLE"

    with caplog.at_level("WARNING", logger="registry.upstreams.pool"):
        _health_pool(DEMO_SPEC, body)
    assert [r.getMessage() for r in caplog.records] == [
        f"upstream demo: its server exited with status 3; starting it again in {wait} s" for wait in (0.05, 0.1, 0.2)
    ]


# The demo server behind a shell whose background child keeps the server's output open (as a wrapper's
# helper may): when the server dies, its output does not end, so nothing is noticed until a request finds
# its input closed. Unconfined (GATEWAY_STDIO_SANDBOX=off): in a sandbox the helper ends with its server.
HELD = UpstreamSpec(
    id=1,
    revision=1,
    slug="held",
    transport="stdio",
    timeout=5,
    command="/bin/sh",
    args=["-c", f"sleep 120 </dev/null & exec {sys.executable} {DEMO[0]}"],
)


def _helpers_killed(server: int) -> None:
    """Kill what shares the server's process group but the server (HELD's helper, holding its output): the pool
    then stops the server as any, and its transport closes while the loop runs."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            group = int(stat.read_text().rsplit(")", 1)[1].split()[2])
        except OSError:  # gone meanwhile
            continue
        if group == server and int(stat.parent.name) != server:
            os.kill(int(stat.parent.name), signal.SIGKILL)


def test_a_call_that_finds_its_server_gone_before_it_was_sent_is_sent_again_to_a_new_one(settings):
    settings.GATEWAY_STDIO_SANDBOX = "off"

    async def body(pool: UpstreamPool, stored: list) -> tuple[int, dict]:
        killed = await _pid(pool)
        try:
            os.kill(killed, signal.SIGKILL)
            await until(lambda: _reaped(killed))
            again = await _pid(pool)
            _helpers_killed(again)
            return killed, again
        finally:
            os.killpg(killed, signal.SIGKILL)  # the helper that held its output

    killed, again = _health_pool(HELD, body)
    assert again != killed


def test_a_call_that_never_reached_a_server_and_cannot_be_sent_again_says_it_is_safe_to_retry(settings):
    settings.GATEWAY_STDIO_SANDBOX = "off"
    spec = HELD

    async def load_spec(upstream_id: int, person: dict | None = None, catalog: bool = False) -> UpstreamSpec:
        return spec

    async def body() -> dict:
        nonlocal spec
        pool = UpstreamPool(load_spec)
        try:
            async with anyio.create_task_group() as tg:
                await tg.start(pool.serve)
                killed = await _pid(pool)
                try:
                    spec = replace(HELD, command="/nonexistent/mcp-server")  # its restart fails
                    os.kill(killed, signal.SIGKILL)
                    await until(lambda: _reaped(killed))
                    return await pool.request(UpstreamRequest.tool_call(1, 1, "pid", {}))
                finally:
                    os.killpg(killed, signal.SIGKILL)
                    tg.cancel_scope.cancel()
        finally:
            await transports_settle()

    outcome = anyio.run(body)
    assert (outcome["code"], outcome["message"], outcome["unsent"]) == (
        "UPSTREAM_UNAVAILABLE",
        "The service could not be reached. Try later. The call never reached the service, so it is safe to retry.",
        True,
    )
    assert outcome["cause"] == "command not found: /nonexistent/mcp-server"


# Which connection a plain call takes by its agent's era: a 2025-11-25 agent's goes in that era, on a connection of
# its own, where the upstream speaks both; where the upstream speaks one era, both eras' calls share its one connection.
LEGACY, MODERN = "2025-11-25", "2026-07-28"


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


def test_an_upstream_that_speaks_only_2026_07_28_serves_a_legacy_agents_plain_calls_on_the_shared_connection(
    settings, tmp_path
):
    settings.GATEWAY_STDIO_SANDBOX = "off"  # the shell that runs the server counts its starts in tmp_path
    starts = tmp_path / "starts"
    command = f"echo $$ >> {starts}; exec {sys.executable} {DEMO[0]}"
    # A sync cannot tell it from one that speaks both.
    spec = replace(DEMO_SPEC, command="/bin/sh", args=["-c", command], env={"DEMO_MODERN_ONLY": "1"})

    async def body(pool: UpstreamPool):
        first = await _pid(pool, legacy=True)  # it refused 2025-11-25: the shared connection serves the call
        return first, await _pid(pool, legacy=False), await _pid(pool, legacy=True), _eras(pool), dict(pool._one_era)

    first, modern, again, eras, one_era = with_pool(spec, body)
    assert (first, again, eras, one_era) == (modern, modern, {(): MODERN}, {1: 1})
    assert len(starts.read_text().split()) == 2, "started once to be refused 2025-11-25, once for the shared connection"
