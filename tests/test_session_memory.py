"""A web process forgets a session once it ends (issue 41: a gateway grew 0.4 MiB a minute under sessions opened and
closed all day). The gateway runs under bench/traced.py, which counts its live objects by type on a signal."""

import asyncio
from contextlib import suppress
from pathlib import Path

import pytest

from bench.traced import census_take, traced_command
from tests import servers
from tests.clients import sdk_client, ws_session
from tests.helpers import eventually

SESSIONS = 25  # of each kind: a leak of one object each stands out from any cache's few
WARM_UP = 3
# What a session is made of in the web process: none may outlive it.
SESSION_TYPES = (
    "handoff.mcp.handle.McpSession",
    "handoff.endpoints.streamable_http.sessions.HttpSession",
    "handoff.endpoints.consumers.McpWebSocketConsumer",
    "mcp.server.connection.Connection",
    "mcp.server.session.ServerSession",
)
CENSUS_BOUND = 30.0  # seconds for a closed socket's disconnect to run before the census is taken as final


async def session_use(url: str, key: str, kind: str, n: int) -> None:
    """Open a session (or socket) of `kind`, make one call, end it."""
    if kind == "ws":
        async with ws_session(url, key) as ws:
            reply = await ws.request("tools/call", {"name": "demo__echo", "arguments": {"text": f"ws {n}"}})
            assert reply["result"]["content"][0]["text"] == f"ws {n}", reply
        return
    async with sdk_client(url, key, kind, timeout=30) as client:
        result = await client.call_tool("demo__echo", {"text": f"{kind} {n}"})
        assert result.content[0].text == f"{kind} {n}", result


def sessions_use(url: str, key: str, kind: str, count: int) -> None:
    async def run() -> None:
        for n in range(count):
            await session_use(url, key, kind, n)

    asyncio.run(run())


class Census:
    def __init__(self, pid: int, out: Path) -> None:
        self.pid, self.out, self.taken = pid, out, 0

    def take(self) -> dict[str, int]:
        self.taken += 1
        counts = census_take(self.pid, Path(f"{self.out}.census.{self.taken}"))
        return {name: counts.get(name, 0) for name in SESSION_TYPES}

    def settled(self, before: dict[str, int]) -> dict[str, int]:
        """What grew since `before`, once nothing has or CENSUS_BOUND has passed (a socket's disconnect runs
        after its client has gone): what is left then is for the test to report, kind by kind."""
        grown: dict[str, int] = {}

        def none_grown() -> bool:
            now = self.take()
            grown.clear()
            grown.update({name: now[name] - before[name] for name in SESSION_TYPES if now[name] > before[name]})
            return not grown

        with suppress(AssertionError):
            eventually(none_grown, timeout=CENSUS_BOUND)
        return grown


@pytest.mark.parametrize("store", ["redis", "process"])
def test_sessions_of_every_kind_leave_nothing_of_theirs_in_the_web_process_once_ended(
    server_env, world, logs, tmp_path, store
):
    env = server_env | {"GATEWAY_EXECUTOR": "inline", "TRACE_OUT": str(tmp_path / "trace"), "TRACE_FRAMES": "1"}
    if store == "process":  # sessions (and the channel layer) in the process, as embedded
        env.pop("REDIS_URL", None)
    port = servers.free_port()
    command = traced_command("daphne", ["-b", "127.0.0.1", "-p", str(port), "gateway_project.asgi:application"])
    log = logs / f"gateway-session-memory-{store}.log"
    process = servers.start(command, env, log)
    gateway = servers.Running(process, log, f"http://127.0.0.1:{port}")
    try:
        servers.wait_for_port(port, process, log)
        census = Census(process.pid, tmp_path / "trace")
        grown = {}
        for kind in ("legacy", "2026-07-28", "ws"):
            sessions_use(gateway.url, world.key, kind, WARM_UP)  # what the first sessions load and cache
            before = census.take()
            sessions_use(gateway.url, world.key, kind, SESSIONS)
            grown[kind] = census.settled(before)
    finally:
        gateway.stop()

    assert grown == {"legacy": {}, "2026-07-28": {}, "ws": {}}
