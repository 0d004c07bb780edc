"""Load shed at the door: past GATEWAY_MAX_IN_FLIGHT POSTs in a web process, a new one is refused at once with
503, Retry-After and SERVER_BUSY (before its body is parsed), the calls in flight finish, and the process serves
again as soon as they have; a client that sends its body slowly holds no place, and is answered 408 after
GATEWAY_BODY_SECONDS; headers over 32 KiB are refused 431, before the key check; with GATEWAY_MAX_LOOP_LAG_MS set,
a POST while the process's event loop runs late is refused too, and served again once it does not. How fast
refusals come and what admitted calls keep under 10x overload is measured in bench/shed.py (docs/reliability.md)."""

import json
import uuid

import anyio
import httpx2
import pytest

from audit.models import AuditEvent
from tests import servers
from tests.clients import (
    ACCEPT,
    INITIALIZE,
    STATELESS_META,
    call,
    refused_socket,
    sdk_client,
    slow_post,
    stateless_call,
    tool_names,
    ws_session,
)
from tests.factories import agent
from tests.helpers import audit_mark, audit_since, eventually, orm, run, until

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def narrow_gateway(server_env, world, logs):
    """Under uvicorn, the production server, which hands a body to the gateway as it arrives (Daphne reads it whole
    first, so a slow body never reaches the gateway there)."""
    narrow = {"GATEWAY_EXECUTOR": "inline", "GATEWAY_MAX_IN_FLIGHT": "2", "GATEWAY_BODY_SECONDS": "1"}
    running = servers.start_gateway_under(servers.UVICORN, server_env | narrow, logs / "gateway-narrow.log")
    yield running
    running.stop()


def test_a_post_past_the_in_flight_cap_is_refused_at_once_and_the_held_calls_finish(narrow_gateway, world):
    marks = [f"shed-{uuid.uuid4().hex[:12]}" for _ in range(2)]

    async def scenario():
        results = []

        async def hold(mark: str) -> None:
            async with sdk_client(narrow_gateway.url, world.key, "2026-07-28") as client:
                # Listed first: the SDK checks a result against the tool's output schema, and would list the tools
                # right after the call, while both places may still be held.
                await client.list_tools()
                results.append(await client.call_tool("demo__sleep", {"seconds": 3, "mark": mark}))

        async with anyio.create_task_group() as tg:
            for mark in marks:
                tg.start_soon(hold, mark)
            await until(lambda: all(servers.demo_started(m) for m in marks), timeout=15)
            async with httpx2.AsyncClient() as http:
                refused = await http.post(
                    f"{narrow_gateway.url}/mcp",
                    json={"jsonrpc": "2.0", "id": 7, "method": "ping"},
                    headers={"authorization": f"Bearer {world.key}", "accept": ACCEPT},
                )
                # Not a POST: a GET (or DELETE) is not shed, whatever it then answers.
                listened = await http.get(f"{narrow_gateway.url}/mcp", headers={"authorization": f"Bearer {world.key}"})
        return refused, listened, results

    refused, listened, results = anyio.run(scenario)
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
    assert json.loads(refused.content) == {
        "jsonrpc": "2.0",
        "id": None,
        "error": {
            "code": -32003,
            "message": "Server busy: this gateway process serves as many requests as it may (GATEWAY_MAX_IN_FLIGHT). "
            "Retry in 1 s.",
            "data": {"code": "SERVER_BUSY", "retryAfter": 1.0},
        },
    }
    assert listened.status_code != 503
    assert len(results) == 2 and not any(result.is_error for result in results)

    async def afterwards():
        async with sdk_client(narrow_gateway.url, world.key, "2026-07-28") as client:
            return await client.call_tool("demo__echo", {"text": "served again"})

    assert anyio.run(afterwards).content[0].text == "served again"


def _whole(answer: bytes) -> bool:
    """Whether an HTTP/1.1 answer has arrived whole: its head, and its body by chunks or Content-Length."""
    head, found, body = answer.partition(b"\r\n\r\n")
    if not found:
        return False
    if b"transfer-encoding: chunked" in head.lower():
        return body.endswith(b"0\r\n\r\n")
    length = next(
        (line.split(b":")[1] for line in head.lower().split(b"\r\n") if line.startswith(b"content-length:")), b"0"
    )
    return len(body) >= int(length)


def test_slow_bodies_hold_no_place_and_are_answered_408(narrow_gateway, world):
    async def scenario():
        slow = [await slow_post(narrow_gateway.url, world.key, b"{") for _ in range(3)]  # more than the two places
        async with sdk_client(narrow_gateway.url, world.key, "2026-07-28") as client:
            served = await client.call_tool("demo__echo", {"text": "past the slow ones"})
        reader, writer = slow[0]
        answer = b""
        with anyio.fail_after(10):  # the head and the body may come in separate reads
            while not _whole(answer):
                answer += await reader.read(4096)
        for _, each in slow:
            each.close()
        return served, answer

    served, answer = anyio.run(scenario)
    assert served.content[0].text == "past the slow ones"
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), answer
    if b"transfer-encoding: chunked" in head.lower():  # one chunk: its size, a line break, the chunk
        body = body.split(b"\r\n")[1]
    assert json.loads(body)["error"] == {"code": -32600, "message": "Request body not received within 1 s"}


def test_headers_over_the_bound_are_refused_431_before_the_key_check(narrow_gateway, world):
    filler = {f"x-filler-{n}": "y" * 1000 for n in range(40)}  # 40 KiB: uvicorn itself would take them

    async def scenario():
        async with httpx2.AsyncClient() as http:
            keyless = await http.post(
                f"{narrow_gateway.url}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"}, headers=filler
            )
            with_key = await http.post(
                f"{narrow_gateway.url}/mcp",
                json={"jsonrpc": "2.0", "id": 2, "method": "ping"},
                headers=filler | {"authorization": f"Bearer {world.key}", "accept": ACCEPT},
            )
        return keyless, with_key

    keyless, with_key = anyio.run(scenario)
    message = "Request Header Fields Too Large: send at most 32768 bytes of headers"
    for answer in (keyless, with_key):
        assert answer.status_code == 431
        assert json.loads(answer.content) == {
            "jsonrpc": "2.0",
            "id": None,
            "error": {"code": -32600, "message": message},
        }


@pytest.fixture(scope="module")
def lag_gateway(server_env, world, logs):
    """The second line alone: no count that a few clients could reach, a loop lag that they can."""
    # 1 ms: on a quiet, fast machine eight clients kept the moving average under 3 ms for a minute (2026-11-28).
    lag = {"GATEWAY_EXECUTOR": "inline", "GATEWAY_MAX_LOOP_LAG_MS": "1"}
    running = servers.start_gateway_under(servers.UVICORN, server_env | lag, logs / "gateway-lag.log")
    yield running
    running.stop()


def test_a_post_while_the_loop_runs_late_is_refused_and_served_again_once_it_does_not(lag_gateway, world):
    big = {"text": "x" * 256 * 1024}  # a quarter MiB each way: parsing, hashing and relaying it holds the loop
    request = {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "demo__echo", "arguments": {}}}
    headers = {
        "authorization": f"Bearer {world.key}",
        "accept": ACCEPT,
        "mcp-protocol-version": "2026-07-28",
        "mcp-method": "tools/call",
        "mcp-name": "demo__echo",
    }

    async def scenario():
        stop = anyio.Event()
        loaded = []

        async def load() -> None:
            while not stop.is_set():
                loaded.append(await stateless_call(lag_gateway.url, world.key, "demo__echo", big))

        async def refused():
            request["params"]["_meta"] = STATELESS_META
            async with httpx2.AsyncClient(timeout=30) as http:
                answer = await http.post(f"{lag_gateway.url}/mcp", json=request, headers=headers)
                return answer if answer.status_code == 503 else None

        async with anyio.create_task_group() as tg:
            for _ in range(8):
                tg.start_soon(load)
            answer = await until(refused, timeout=60)
            stop.set()

        async def served():
            answer = await stateless_call(lag_gateway.url, world.key, "demo__echo", {"text": "again"})
            return answer if "result" in answer else None

        return answer, loaded, await until(served, timeout=10)

    answer, loaded, after = anyio.run(scenario)
    assert answer.headers["retry-after"] == "1"
    assert json.loads(answer.content) == {
        "jsonrpc": "2.0",
        "id": None,
        "error": {
            "code": -32003,
            "message": "Server busy: this gateway process's event loop runs late (past GATEWAY_MAX_LOOP_LAG_MS). "
            "Retry in 1 s.",
            "data": {"code": "SERVER_BUSY", "retryAfter": 1.0},
        },
    }
    # The load's own calls were served or refused alike, and nothing else.
    assert {("result" in each) or each["error"]["data"]["code"] for each in loaded} <= {True, "SERVER_BUSY"}
    assert after["result"]["content"][0]["text"] == "again"


@pytest.fixture(scope="module")
def one_session_gateway(server_env, world, logs):
    """Without Redis, where every 2025-11-25 session lives in the web process, room for one."""
    env = {k: v for k, v in server_env.items() if k != "REDIS_URL"}
    env |= {"GATEWAY_EXECUTOR": "inline", "GATEWAY_MAX_LEGACY_SESSIONS": "1"}
    running = servers.start_gateway_under(servers.UVICORN, env, logs / "gateway-one-session.log")
    yield running
    running.stop()


def test_a_session_past_the_cap_is_refused_503_and_the_open_one_is_served(one_session_gateway, world):
    headers = {"authorization": f"Bearer {world.key}", "accept": ACCEPT}

    async def scenario():
        async with sdk_client(one_session_gateway.url, world.key, "legacy") as client:
            async with httpx2.AsyncClient() as http:
                refused = await http.post(f"{one_session_gateway.url}/mcp", json=INITIALIZE, headers=headers)
            served = await client.call_tool("demo__echo", {"text": "still here"})
        return refused, served

    refused, served = anyio.run(scenario)
    assert refused.status_code == 503 and refused.headers["retry-after"] == "5"
    assert json.loads(refused.content) == {
        "jsonrpc": "2.0",
        "id": 0,
        "error": {
            "code": -32003,
            "message": "Server busy: this gateway process holds as many sessions as it may "
            "(GATEWAY_MAX_LEGACY_SESSIONS). Retry in 5 s.",
        },
    }
    assert served.content[0].text == "still here"


@pytest.fixture(params=["redis", "local"])
def two_per_agent_gateway(request, server_env, logs):
    """Room for two sessions per agent, with them in Redis (any process counts them) or in the process."""
    env = server_env | {"GATEWAY_EXECUTOR": "inline", "GATEWAY_MAX_SESSIONS_PER_AGENT": "2"}
    if request.param == "local":
        env = {k: v for k, v in env.items() if k != "REDIS_URL"}
    elif "REDIS_URL" not in env:
        pytest.skip("REDIS_URL is not set")
    running = servers.start_gateway_under(servers.UVICORN, env, logs / f"gateway-two-per-agent-{request.param}.log")
    yield running
    running.stop()


def test_an_agent_past_its_sessions_is_refused_429_and_others_and_its_open_ones_are_served(
    two_per_agent_gateway, world
):
    gateway = two_per_agent_gateway.url

    async def initialize(key: str) -> httpx2.Response:
        async with httpx2.AsyncClient() as http:
            headers = {"authorization": f"Bearer {key}", "accept": ACCEPT}
            return await http.post(f"{gateway}/mcp", json=INITIALIZE, headers=headers)

    # The other agent is one of the test's own: the world's agent may hold sessions of earlier tests in Redis.
    with agent("two-sessions") as (capped, key), agent("two-sessions-other") as (_, other_key):
        mark = audit_mark()
        eventually(lambda: run(lambda: tool_names(gateway, key)))  # the gateway knows the new keys
        eventually(lambda: run(lambda: tool_names(gateway, other_key)))

        async def scenario():
            async with sdk_client(gateway, key, "legacy") as first:
                async with sdk_client(gateway, key, "legacy") as second:
                    refused = await initialize(key)
                    other = await call(gateway, other_key, "demo__echo", {"text": "another agent"})
                    still = [len((await each.list_tools()).tools) for each in (first, second)]
                # `second` ended with DELETE: its place is free again
                again = await initialize(key)
                await first.list_tools()
            return refused, other, still, again

        refused, other, still, again = anyio.run(scenario)
        denied = [
            (row.agent_id, row.outcome, row.detail)
            for row in audit_since(mark)
            if row.error_code == "AGENT_SESSION_LIMIT"
        ]
        assert denied == [(capped.id, "denied", {"method": "initialize"})]
    retry = int(refused.headers["retry-after"])
    assert refused.status_code == 429 and 1790 <= retry <= 1800
    assert json.loads(refused.content) == {
        "jsonrpc": "2.0",
        "id": 0,
        "error": {
            "code": -32003,
            "message": "Too many sessions: this agent opened 2 in the last 1800 s (GATEWAY_MAX_SESSIONS_PER_AGENT). "
            f"Close one (DELETE /mcp, or close its WebSocket), or retry in {retry} s.",
            "data": {"code": "AGENT_SESSION_LIMIT", "retryAfter": float(retry)},
        },
    }
    assert other.content[0].text == "another agent" and all(still)
    assert again.status_code == 200 and again.headers["mcp-session-id"]


def test_websocket_sessions_count_against_the_same_bound_and_one_past_it_is_told_why(two_per_agent_gateway, world):
    gateway = two_per_agent_gateway.url

    # The other agent is one of the test's own: the world's agent may hold sessions of earlier tests in Redis.
    with agent("two-sockets") as (capped, key), agent("two-sockets-other") as (_, other_key):
        mark = audit_mark()
        eventually(lambda: run(lambda: tool_names(gateway, key)))  # the gateway knows the new keys
        eventually(lambda: run(lambda: tool_names(gateway, other_key)))

        def closed_sockets() -> list[AuditEvent]:
            rows = audit_since(mark, sessions=True)
            return [
                r
                for r in rows
                if r.kind == "session" and r.transport == "ws" and r.detail["action"] == "session_closed"
            ]

        async def scenario():
            async with sdk_client(gateway, key, "legacy") as held:  # an HTTP session counts against the same bound
                async with ws_session(gateway, key) as first:
                    refused = await refused_socket(gateway, key)
                    listed = await first.request("tools/list")
                    other = await call(gateway, other_key, "demo__echo", {"text": "another agent"})
                await until(lambda: orm(closed_sockets))  # the socket's end is recorded once its place is free
                async with ws_session(gateway, key) as again:
                    relisted = await again.request("tools/list")
                await held.list_tools()
            return refused, listed, other, relisted

        (frame, code), listed, other, relisted = anyio.run(scenario)
        denied = [
            (r.agent_id, r.transport, r.outcome) for r in audit_since(mark) if r.error_code == "AGENT_SESSION_LIMIT"
        ]
        assert denied == [(capped.id, "ws", "denied")]
    retry = int(frame["error"]["data"]["retryAfter"])
    assert code == 4429 and 1790 <= retry <= 1800
    assert frame == {
        "jsonrpc": "2.0",
        "id": None,
        "error": {
            "code": -32003,
            "message": "Too many sessions: this agent opened 2 in the last 1800 s (GATEWAY_MAX_SESSIONS_PER_AGENT). "
            f"Close one (DELETE /mcp, or close its WebSocket), or retry in {retry} s.",
            "data": {"code": "AGENT_SESSION_LIMIT", "retryAfter": float(retry)},
        },
    }
    assert listed["result"]["tools"] and relisted["result"]["tools"]
    assert other.content[0].text == "another agent"
