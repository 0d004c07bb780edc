"""The gateway under the other ASGI servers a deployment may choose (docs/internals.md, ASGI servers): uvicorn with
uvloop and httptools, and granian. Daphne, which scripts/demo and every other test run, is the reference; here each
server serves the same Channels router to real clients: the SDK client in both eras, raw Streamable HTTP (POST, GET
stream, DELETE), a WebSocket session, the probes, the console and its static files; and uvicorn drains on SIGTERM.

granian is left out of the drain: its worker stops on a SIGTERM handler it installs with loop.add_signal_handler, which
the drain's own handler (handoff/endpoints/probes.py Drain.watch) replaces and cannot call on, so after the drain the
worker serves on until it is killed."""

import json
import os
import signal
from collections.abc import Iterator

import anyio
import httpx2
import pytest

from tests import servers
from tests.clients import INITIALIZE, sdk_client, stateless_call, ws_session
from tests.helpers import audit_mark, audit_since, eventually, orm, run

pytestmark = pytest.mark.e2e
SERVERS = {"uvicorn": servers.UVICORN, "granian": servers.GRANIAN}
MODES = ["legacy", "2026-07-28"]
RPC = {"jsonrpc": "2.0"}
STREAMABLE = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


@pytest.fixture(scope="module", params=list(SERVERS))
def served(request, server_env, world, logs) -> Iterator[servers.Running]:
    env = server_env | {"GATEWAY_EXECUTOR": "inline"}
    running = servers.start_gateway_under(SERVERS[request.param], env, logs / f"gateway-{request.param}.log")
    yield running
    running.stop()


@pytest.mark.parametrize("mode", MODES)
def test_the_sdk_client_calls_a_tool_and_hears_its_progress(served, world, mode):
    seen: list[float] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append(progress)

    async def scenario():
        async with sdk_client(served.url, world.key, mode) as client:
            echoed = await client.call_tool("demo__echo", {"text": "hi"})
            progressed = await client.call_tool("demo__progress", {"seconds": 0.5}, progress_callback=on_progress)
            return echoed, progressed

    echoed, progressed = run(scenario)
    assert [c.text for c in echoed.content] == ["hi"]
    assert progressed.content[0].text == "done"
    assert seen == [0, 1, 2, 3, 4]


def answer(response: httpx2.Response) -> dict:
    """The JSON-RPC answer to a POST, sent as JSON or as an SSE stream (whose first event may only prime
    resumption, with no data)."""
    if response.headers["content-type"].startswith("application/json"):
        return response.json()
    assert response.headers["content-type"].startswith("text/event-stream")
    data = (line.removeprefix("data:").strip() for line in response.text.splitlines() if line.startswith("data:"))
    return next(json.loads(message) for message in data if message)


def test_a_session_posts_holds_a_get_stream_and_ends_with_delete(served, world):
    auth = {"Authorization": f"Bearer {world.key}"}
    with httpx2.Client(base_url=served.url, headers=auth | STREAMABLE, timeout=5) as http:
        opened = http.post("/mcp", json=INITIALIZE)
        assert opened.status_code == 200, opened.text
        assert answer(opened)["result"]["protocolVersion"] == "2025-11-25"
        session = {"Mcp-Session-Id": opened.headers["mcp-session-id"], "MCP-Protocol-Version": "2025-11-25"}
        initialized = http.post("/mcp", headers=session, json=RPC | {"method": "notifications/initialized"})
        assert initialized.status_code == 202
        # An empty answer says its length: no chunked framing around nothing.
        assert (initialized.headers["content-length"], initialized.headers.get("transfer-encoding")) == ("0", None)
        params = {"name": "demo__echo", "arguments": {"text": "raw"}}
        echoed = http.post("/mcp", headers=session, json=RPC | {"id": 1, "method": "tools/call", "params": params})
        assert answer(echoed)["result"]["content"] == [{"type": "text", "text": "raw"}]
        with http.stream("GET", "/mcp", headers=session | {"Accept": "text/event-stream"}) as stream:
            assert (stream.status_code, stream.headers["content-type"][:17]) == (200, "text/event-stream")
        deleted = http.delete("/mcp", headers=session)
        assert (deleted.status_code, deleted.headers["content-length"], deleted.content) == (200, "0", b"")
        gone = http.post("/mcp", headers=session, json=RPC | {"id": 2, "method": "ping"})
    assert (gone.status_code, gone.headers["content-type"]) == (404, "application/json")
    assert gone.json()["error"]["message"].startswith("Session not found:")


def test_a_websocket_session_calls_a_tool(served, world):
    async def scenario():
        async with ws_session(served.url, world.key) as session:
            return await session.request("tools/call", {"name": "demo__echo", "arguments": {"text": "over ws"}})

    answer = run(scenario)
    assert answer["result"]["content"] == [{"type": "text", "text": "over ws"}]


def test_the_probes_the_console_and_its_static_files_are_served(served):
    with httpx2.Client(base_url=served.url, timeout=5) as http:
        ready = http.get("/readyz")
        login = http.get("/admin/login/")
        stylesheet = http.get("/static/admin/css/base.css")
    assert (ready.status_code, ready.json()["status"]) == (200, "ready")
    assert login.status_code == 200 and 'name="password"' in login.text
    assert (stylesheet.status_code, stylesheet.headers["content-type"][:8]) == (200, "text/css")


def test_on_sigterm_uvicorn_turns_unready_finishes_its_call_in_flight_and_exits(server_env, world, logs):
    env = server_env | {"GATEWAY_EXECUTOR": "inline"}
    gateway = servers.start_gateway_under(servers.UVICORN, env, logs / "gateway-uvicorn-drain.log")
    try:
        mark = audit_mark()
        readiness, outcome, stream_end = run(lambda: call_through_a_drain(gateway, world.key, mark))
        exited = eventually(lambda: gateway.process.poll() is not None or None, timeout=10)
    finally:
        gateway.stop()
    assert readiness == (503, "draining")
    assert outcome["result"]["isError"] is False, "the call in flight finished"
    # A GET stream ends as the drain begins, whole (not cut): its client comes back elsewhere with Last-Event-ID.
    assert stream_end == "ended"
    assert exited
    assert "SIGTERM: draining 1 request(s) for up to 20 s" in gateway.log.read_text()


async def call_through_a_drain(gateway: servers.Running, key: str, mark: int) -> tuple[tuple[int, str], dict, str]:
    outcome: list = []

    async def slow_call() -> None:
        outcome.append(await stateless_call(gateway.url, key, "demo__sleep", {"seconds": 2}))

    async with httpx2.AsyncClient(base_url=gateway.url, headers=STREAMABLE, timeout=30) as http:
        session = await legacy_session(http, key)
        async with http.stream("GET", "/mcp", headers=session | {"Accept": "text/event-stream"}) as stream:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(slow_call)
                with anyio.fail_after(5):
                    while not [row for row in await orm(lambda: audit_since(mark)) if row.kind == "approved"]:
                        await anyio.sleep(0.05)
                os.kill(gateway.process.pid, signal.SIGTERM)
                with anyio.fail_after(5):
                    while (ready := await http.get("/readyz")).status_code != 503:
                        await anyio.sleep(0.05)
            with anyio.fail_after(15):
                stream_end = await read_to_end(stream)
    return (ready.status_code, ready.json()["status"]), outcome[0], stream_end


async def legacy_session(http: httpx2.AsyncClient, key: str) -> dict[str, str]:
    """A 2025-11-25 session opened over raw HTTP: the headers its further requests carry."""
    auth = {"Authorization": f"Bearer {key}"}
    opened = await http.post("/mcp", headers=auth, json=INITIALIZE)
    session = auth | {"Mcp-Session-Id": opened.headers["mcp-session-id"], "MCP-Protocol-Version": "2025-11-25"}
    await http.post("/mcp", headers=session, json=RPC | {"method": "notifications/initialized"})
    return session


async def read_to_end(stream: httpx2.Response) -> str:
    try:
        async for _chunk in stream.aiter_bytes():
            pass
    except httpx2.HTTPError as cut:
        return type(cut).__name__
    return "ended"
