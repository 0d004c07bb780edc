"""Every way a request can be refused at /mcp and /mcp/ws, with the exact status and JSON-RPC error."""

import base64
import json
import os
import socket
from urllib.parse import urlsplit

import anyio
import httpx2
import pytest
import websockets
from channels.db import database_sync_to_async
from mcp.shared.exceptions import MCPError
from websockets.exceptions import ConnectionClosed, InvalidStatus

from audit.models import AuditEvent
from tests import servers
from tests.clients import TIMEOUT, sdk_client, ws_session
from tests.conftest import needs
from tests.helpers import audit_mark, audit_since, eventually, run

HEADERS = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
LIST = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}


def post(gateway, body: bytes | str, **headers: str) -> httpx2.Response:
    return httpx2.post(f"{gateway.url}/mcp", content=body, headers=HEADERS | headers, timeout=TIMEOUT)


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def list_status(gateway, key: str) -> int:
    """HTTP status of a complete, stateless (2026-07-28) tools/list."""
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}
    headers = {"mcp-protocol-version": "2026-07-28", "mcp-method": "tools/list"}
    return post(gateway, json.dumps(LIST | {"params": {"_meta": meta}}), **headers, **bearer(key)).status_code


def test_a_request_without_an_api_key_is_401_with_www_authenticate(inline_gateway):
    def challenge() -> str | None:
        return post(inline_gateway, json.dumps(LIST)).headers.get("www-authenticate")

    # With no identity provider the challenge names no metadata: a provider another test's fixture removed last
    # leaves the gateway within GATEWAY_SNAPSHOT_CHECK_SECONDS, not at once.
    eventually(lambda: challenge() == 'Bearer realm="switchboard"')
    response = post(inline_gateway, json.dumps(LIST))
    assert (response.status_code, response.headers["www-authenticate"]) == (401, 'Bearer realm="switchboard"')
    assert response.json()["error"]["code"] == -32600
    assert "Authorization: Bearer" in response.json()["error"]["message"]


@pytest.mark.parametrize("key", ["sb_000000000000_wrong", "not-a-key", "sb_", "sb__x"])
def test_a_wrong_api_key_is_401(inline_gateway, world, key):
    assert post(inline_gateway, json.dumps(LIST), **bearer(key)).status_code == 401


def test_a_right_key_with_a_changed_secret_is_401(inline_gateway, world):
    tampered = world.key[:-4] + ("AAAA" if not world.key.endswith("AAAA") else "BBBB")
    assert post(inline_gateway, json.dumps(LIST), **bearer(tampered)).status_code == 401


def test_the_key_of_a_disabled_agent_is_401(inline_gateway, world):
    assert post(inline_gateway, json.dumps(LIST), **bearer(world.disabled_key)).status_code == 401


def test_a_foreign_origin_is_403(inline_gateway, world):
    response = post(inline_gateway, json.dumps(LIST), origin="http://evil.example", **bearer(world.key))
    assert response.status_code == 403
    assert response.json()["error"] == {"code": -32600, "message": "Origin not allowed"}


def _ws_handshake_status(gateway, host: str, key: str) -> int:
    """The status of a WebSocket handshake sent with this Host header (websockets sets its own)."""
    address = urlsplit(gateway.url)
    nonce = base64.b64encode(os.urandom(16)).decode()
    request = (
        f"GET /mcp/ws HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {nonce}\r\nSec-WebSocket-Version: 13\r\nAuthorization: Bearer {key}\r\n\r\n"
    )
    with socket.create_connection((address.hostname, address.port), timeout=TIMEOUT) as sock:
        sock.sendall(request.encode())
        return int(sock.recv(1024).split()[1])


def test_a_host_the_gateway_does_not_serve_is_refused_on_both_transports(inline_gateway, world):
    """DNS rebinding: a page at evil.example whose name now resolves to the gateway's address reaches it with
    its own Host, and is refused on /mcp and at the WebSocket handshake alike."""
    response = post(inline_gateway, json.dumps(LIST), host="evil.example", **bearer(world.key))
    assert response.status_code == 400
    assert response.json()["error"] == {"code": -32600, "message": "Host not allowed"}
    assert _ws_handshake_status(inline_gateway, "evil.example", world.key) == 403
    assert _ws_handshake_status(inline_gateway, urlsplit(inline_gateway.url).netloc, world.key) == 101


def test_a_local_origin_on_any_port_is_allowed(inline_gateway, world):
    headers = {"origin": "http://localhost:6274", "mcp-protocol-version": "2026-07-28", "mcp-method": "tools/list"}
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}
    body = LIST | {"params": {"_meta": meta}}
    response = post(inline_gateway, json.dumps(body), **headers, **bearer(world.key))
    assert response.status_code == 200, response.text
    assert any(tool["name"] == "demo__echo" for tool in response.json()["result"]["tools"])


def test_an_oversized_body_is_413(inline_gateway, world):
    response = post(inline_gateway, b"x" * (1_048_576 + 1), **bearer(world.key))
    assert response.status_code == 413
    assert response.json()["error"]["message"] == "Request body over 1048576 bytes"


def test_malformed_json_is_a_parse_error(inline_gateway, world):
    response = post(inline_gateway, "{not json", **bearer(world.key))
    assert response.status_code == 400
    assert response.json()["error"] == {"code": -32700, "message": "Parse error: the body is not valid JSON"}


@pytest.mark.parametrize("body", ['{"id": 7, "foo": 1}', '{"jsonrpc": "1.0", "id": 7, "method": "tools/list"}'])
def test_a_json_object_that_is_not_json_rpc_is_an_invalid_request(inline_gateway, world, body):
    error = post(inline_gateway, body, **bearer(world.key)).json()
    assert error["id"] == 7 and error["error"]["code"] == -32600


@pytest.mark.parametrize("request_id", ["{}", "[1]", "true", "1.5"])
def test_a_request_id_that_is_not_a_string_or_integer_is_an_invalid_request(inline_gateway, world, request_id):
    body = f'{{"jsonrpc": "2.0", "id": {request_id}, "method": "tools/list"}}'
    error = post(inline_gateway, body, **bearer(world.key)).json()
    assert error == {
        "jsonrpc": "2.0",
        "id": None,
        "error": {"code": -32600, "message": 'Invalid Request: "id" must be a string or an integer'},
    }


def test_a_batch_is_an_invalid_request(inline_gateway, world):
    error = post(inline_gateway, json.dumps([LIST]), **bearer(world.key)).json()["error"]
    assert error["code"] == -32600 and "batches" in error["message"]


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
def test_an_unknown_tool_is_refused_with_its_own_error_and_an_audit_row(inline_gateway, world, mode):
    mark = audit_mark()

    async def scenario():
        async with sdk_client(inline_gateway.url, world.key, mode) as client:
            with pytest.raises(MCPError) as refused:
                await client.call_tool("demo__no_such_tool", {})
            return refused.value

    error = run(scenario)
    assert error.code == -32602
    assert error.message == "Unknown tool: 'demo__no_such_tool'. Call tools/list for the tools this gateway offers."
    assert error.data["code"] == "TOOL_NOT_FOUND"
    rows = audit_since(mark)
    assert [(r.kind, r.error_code, r.upstream) for r in rows] == [("denied", "TOOL_NOT_FOUND", "demo")]
    assert str(rows[0].request_id) == error.data["requestId"]


def test_a_tool_name_with_nul_and_a_lone_surrogate_is_refused_and_still_audited(inline_gateway, world):
    mark = audit_mark()
    body = '{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"demo__echo\\u0000\\ud800","arguments":{}}}'

    async def scenario():
        async with ws_session(inline_gateway.url, world.key) as ws:
            return await ws.send_raw(body)

    reply = run(scenario)
    assert reply["error"]["code"] == -32602 and reply["error"]["data"]["code"] == "TOOL_NOT_FOUND"
    (row,) = audit_since(mark)
    assert row.kind == "denied" and row.exposed_name == "demo__echo\\u0000\\ud800"


def test_websocket_without_a_key_is_refused_at_the_handshake(inline_gateway):
    async def scenario():
        url = inline_gateway.url.replace("http://", "ws://") + "/mcp/ws"
        with pytest.raises(InvalidStatus) as refused:
            async with websockets.connect(url, open_timeout=TIMEOUT):
                pass
        return refused.value.response.status_code

    assert run(scenario) == 403


def test_websocket_with_a_foreign_origin_is_refused_at_the_handshake(inline_gateway, world):
    async def scenario():
        url = inline_gateway.url.replace("http://", "ws://") + "/mcp/ws"
        with pytest.raises(InvalidStatus) as refused:
            async with websockets.connect(
                url, origin="http://evil.example", open_timeout=TIMEOUT, additional_headers=bearer(world.key)
            ):
                pass
        return refused.value.response.status_code

    assert run(scenario) == 403


def test_websocket_bad_frames_get_errors_and_the_session_goes_on(inline_gateway, world):
    async def scenario():
        async with ws_session(inline_gateway.url, world.key) as ws:
            parse = await ws.send_raw("{not json")
            invalid = await ws.send_raw('{"id": 9, "foo": 1}')
            odd_id = await ws.send_raw('{"jsonrpc": "2.0", "id": {"x": 1}, "method": "tools/list"}')
            works = await ws.request("tools/call", {"name": "demo__add", "arguments": {"a": 2, "b": 3}})
            return parse, invalid, odd_id, works

    parse, invalid, odd_id, works = run(scenario)
    assert parse["error"] == {"code": -32700, "message": "Parse error: the body is not valid JSON"}
    assert invalid["id"] == 9 and invalid["error"]["code"] == -32600
    assert odd_id == {
        "jsonrpc": "2.0",
        "id": None,
        "error": {"code": -32600, "message": 'Invalid Request: "id" must be a string or an integer'},
    }
    assert works["result"]["content"][0]["text"] == "5"


def test_an_oversized_websocket_message_drops_that_socket_only(inline_gateway, world):
    """Daphne refuses messages over its own 1 MiB limit (the gateway's cap) by dropping the connection."""

    async def scenario():
        async with ws_session(inline_gateway.url, world.key) as bystander:
            with pytest.raises(ConnectionClosed):
                async with ws_session(inline_gateway.url, world.key) as ws:
                    await ws.send_raw(
                        json.dumps({"jsonrpc": "2.0", "id": 10, "method": "ping", "params": {"pad": "x" * 1_048_576}})
                    )
            return await bystander.request("tools/call", {"name": "demo__add", "arguments": {"a": 2, "b": 3}})

    assert run(scenario)["result"]["content"][0]["text"] == "5"


def test_a_disabled_agent_is_refused_on_an_open_websocket(inline_gateway, world):
    from policy.models import Agent
    from policy.services import agent_set_enabled

    alice = Agent.objects.get(name="alice")
    add = {"name": "demo__add", "arguments": {"a": 1, "b": 1}}

    async def scenario():
        async with ws_session(inline_gateway.url, world.key) as ws:
            first = await ws.request("tools/call", add)
            await database_sync_to_async(agent_set_enabled)(agent=alice, enabled=False, actor="tests")
            deadline = anyio.current_time() + 5
            while "error" not in (later := await ws.request("tools/call", add)) and anyio.current_time() < deadline:
                await anyio.sleep(0.1)
            return first, later

    try:
        first, later = run(scenario)
    finally:
        agent_set_enabled(agent=alice, enabled=True, actor="tests")
    assert first["result"]["content"][0]["text"] == "2"
    assert later["error"]["code"] == -32001 and later["error"]["data"]["code"] == "AGENT_DISABLED"
    assert AuditEvent.objects.filter(kind="denied", error_code="AGENT_DISABLED", agent_name="alice").exists()
    eventually(lambda: list_status(inline_gateway, world.key) == 200)


def test_a_revoked_key_is_refused_by_the_gateway(inline_gateway, db):
    from policy.models import Agent
    from policy.services import agent_create, agent_key_revoke

    issued = agent_create(name="revokee")
    try:
        eventually(lambda: list_status(inline_gateway, issued.key) == 200)
        agent_key_revoke(prefix=issued.key.split("_")[1], actor="tests")
        eventually(lambda: list_status(inline_gateway, issued.key) == 401)
    finally:
        Agent.objects.filter(name="revokee").delete()


def test_a_session_opened_by_one_agent_cannot_be_used_by_another(inline_gateway, world, db):
    from policy.models import Agent
    from policy.services import agent_create

    bob = agent_create(name="bob")
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
    }
    try:
        opened = post(inline_gateway, json.dumps(init), **bearer(world.key))
        session = {"mcp-session-id": opened.headers["mcp-session-id"], "mcp-protocol-version": "2025-11-25"}
        eventually(lambda: list_status(inline_gateway, bob.key) == 200)
        stolen = post(inline_gateway, json.dumps(LIST), **session, **bearer(bob.key))
        unknown = post(inline_gateway, json.dumps(LIST), **(session | {"mcp-session-id": "f" * 32}), **bearer(bob.key))
        owned = post(inline_gateway, json.dumps(LIST), **session, **bearer(world.key))
    finally:
        Agent.objects.filter(name="bob").delete()
    assert (stolen.status_code, stolen.json()) == (unknown.status_code, unknown.json())
    assert stolen.status_code == 404 and stolen.json()["error"]["message"].startswith("Session not found:")
    assert owned.status_code == 200


def test_an_idle_websocket_is_closed_and_the_gateway_serves_the_next(server_env, world, logs):
    env = server_env | {"GATEWAY_EXECUTOR": "inline", "GATEWAY_SESSION_IDLE_SECONDS": "1"}
    gateway = servers.start_gateway(env, logs / "gateway-idle.log")

    async def scenario():
        async with ws_session(gateway.url, world.key) as ws:
            # Longer than the idle limit, with no frame meanwhile: a pending request keeps the socket open.
            busy = await ws.request("tools/call", {"name": "demo__sleep", "arguments": {"seconds": 2}})
            with anyio.fail_after(5), pytest.raises(ConnectionClosed) as closed:
                await ws.ws.recv()
        async with ws_session(gateway.url, world.key) as ws:
            again = await ws.request("tools/call", {"name": "demo__add", "arguments": {"a": 2, "b": 2}})
        return busy, closed.value, again

    try:
        busy, closed, again = run(scenario)
    finally:
        gateway.stop()
    assert busy["result"]["content"][0]["text"] == "slept"
    assert closed.rcvd.code == 1000  # Daphne passes no close reason on
    assert again["result"]["content"][0]["text"] == "4"


def test_a_websocket_on_the_redis_channel_layer_survives_six_idle_seconds(celery_gateway, world):
    """channels_redis blocks 5 s per receive; redis-py's default 5 s socket timeout used to crash every
    consumer that stayed quiet that long (close code 1011)."""

    async def scenario():
        async with ws_session(celery_gateway.url, world.key) as ws:
            # Six quiet seconds are what is under test: listened to, so a close (ConnectionClosed) fails at once.
            with anyio.move_on_after(6):
                pytest.fail(f"a frame on a quiet socket: {await ws.ws.recv()}")
            return await ws.request("tools/call", {"name": "demo__add", "arguments": {"a": 3, "b": 3}})

    assert run(scenario)["result"]["content"][0]["text"] == "6"


def test_an_executor_that_fails_unforeseen_gives_a_gateway_error_result_and_the_gateway_serves_on(
    server_env, world, logs
):
    """The Celery broker unreachable (a port where nothing listens) while Redis itself is up: publishing raises,
    the call gets GATEWAY_ERROR with its completion row, and the process keeps answering."""
    needs(bool(os.environ.get("REDIS_URL")), "REDIS_URL is not set")
    broker = f"redis://127.0.0.1:{servers.free_port()}/0"
    env = server_env | {"GATEWAY_EXECUTOR": "celery", "CELERY_BROKER_URL": broker}
    gateway = servers.start_gateway(env, logs / "gateway-no-broker.log")

    async def scenario():
        async with sdk_client(gateway.url, world.key, "legacy") as client:
            failed = await client.call_tool("demo__echo", {"text": "x"})
            return failed, len((await client.list_tools()).tools)

    try:
        mark = audit_mark()
        failed, listed = run(scenario)
    finally:
        gateway.stop()
    assert failed.is_error
    assert failed.content[0].text == (
        "demo__echo: The gateway failed while running this call; it may or may not have run."
    )
    assert listed > 0, "the gateway went on serving"
    [completed] = [r for r in audit_since(mark) if r.kind == "completed"]
    assert completed.error_code == "GATEWAY_ERROR" and "ConnectionError" in completed.error_detail
    assert "Traceback" in gateway.log.read_text(), "logged with its traceback"
