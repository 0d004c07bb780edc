"""Hostile input, in agents' frames and in upstreams' replies: a specific error, and the gateway (and the
agent's connection) serves on. The frame checks are shared by every transport, so each frame test runs over
/mcp and /mcp/ws alike."""

import json

import httpx2
import pytest

from registry.models import Upstream
from registry.services import upstream_catalog_sync, upstream_save
from tests import servers
from tests.clients import TIMEOUT, call, tool_names, ws_session
from tests.helpers import audit_mark, audit_since, eventually, run
from tests.test_mcp_errors import HEADERS, LIST, bearer, list_status, post

DEPTH = 64  # GATEWAY_MAX_JSON_DEPTH's default
TOO_DEEP = {"code": -32700, "message": f"Parse error: JSON nested deeper than {DEPTH} levels"}
ADD = {"name": "demo__add", "arguments": {"a": 2, "b": 3}}
TRANSPORTS = pytest.mark.parametrize("transport", ["http", "ws"])


def nested(levels: int) -> str:
    return "[" * levels + "]" * levels


def echo_frame(text: str, request_id: int = 5) -> str:
    """A tools/call of demo__echo with the JSON `text` as its text, under three levels of envelope."""
    params = f'{{"name":"demo__echo","arguments":{{"text":{text}}}}}'
    return f'{{"jsonrpc":"2.0","id":{request_id},"method":"tools/call","params":{params}}}'


def answer(gateway, key: str, transport: str, frame: str) -> tuple[int | None, dict]:
    """The HTTP status (None over WebSocket) and the reply a frame gets. Over WebSocket the socket must go on
    serving: a ping and a call after the frame are answered on it."""
    if transport == "http":
        response = post(gateway, frame, **bearer(key))
        assert response.headers["content-type"] == "application/json"
        return response.status_code, response.json()

    async def scenario():
        async with ws_session(gateway.url, key) as ws:
            reply = await ws.send_raw(frame)
            assert await ws.request("ping") == {"jsonrpc": "2.0", "id": 1, "result": {}}
            works = await ws.request("tools/call", ADD)
            assert works["result"]["content"][0]["text"] == "5", works
            return reply

    return None, run(scenario)


@TRANSPORTS
@pytest.mark.parametrize(
    "frame", [nested(100_000), echo_frame(nested(1_000))], ids=["an array 10^5 deep", "arguments 1,000 deep"]
)
def test_a_frame_nested_far_too_deep_is_a_parse_error_and_the_gateway_serves_on(gateway, world, transport, frame):
    status, reply = answer(gateway, world.key, transport, frame)
    assert (status, reply) == (400 if transport == "http" else None, {"jsonrpc": "2.0", "id": None, "error": TOO_DEEP})
    assert list_status(gateway, world.key) == 200


@TRANSPORTS
def test_a_frame_one_level_over_the_limit_is_refused_and_one_at_the_limit_is_served(inline_gateway, world, transport):
    over = echo_frame(nested(DEPTH - 2))  # 3 levels of envelope
    assert answer(inline_gateway, world.key, transport, over)[1]["error"] == TOO_DEEP
    at_limit = echo_frame(nested(DEPTH - 3))
    if transport == "http":  # a 2026-07-28 request: one exchange, no session
        body = json.loads(at_limit)
        body["params"]["_meta"] = {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {},
        }
        headers = {"mcp-protocol-version": "2026-07-28", "mcp-method": "tools/call", "mcp-name": "demo__echo"}
        served = post(inline_gateway, json.dumps(body), **headers, **bearer(world.key)).json()
    else:
        served = answer(inline_gateway, world.key, transport, at_limit)[1]
    assert served["result"]["content"][0]["text"] == str(json.loads(nested(DEPTH - 3)))


@TRANSPORTS
@pytest.mark.parametrize(
    ("frame", "request_id", "member"),
    [
        ('{"jsonrpc":"2.0","id":4,"method":"\\ud800"}', 4, "method"),
        ('{"jsonrpc":"2.0","id":"\\ud800","method":"ping"}', None, "id"),
    ],
    ids=["method", "id"],
)
def test_a_method_or_id_holding_a_lone_surrogate_is_an_invalid_request_and_the_connection_serves_on(
    gateway, world, transport, frame, request_id, member
):
    status, reply = answer(gateway, world.key, transport, frame)
    assert status == (400 if transport == "http" else None)
    message = f'Invalid Request: "{member}" holds a lone UTF-16 surrogate'
    assert reply == {"jsonrpc": "2.0", "id": request_id, "error": {"code": -32600, "message": message}}
    assert list_status(gateway, world.key) == 200


@TRANSPORTS
@pytest.mark.parametrize("text", ['"a\\ud800b"', '{"\\udfff": 1}'], ids=["in a value", "in a key"])
def test_arguments_holding_a_lone_surrogate_are_invalid_params_and_the_connection_serves_on(
    gateway, world, transport, text
):
    status, reply = answer(gateway, world.key, transport, echo_frame(text, request_id=6))
    assert status == (400 if transport == "http" else None)
    message = (
        "Invalid params: the arguments hold a lone UTF-16 surrogate (a \\ud800-\\udfff escape without its pair); "
        "send the text as valid Unicode"
    )
    assert reply == {"jsonrpc": "2.0", "id": 6, "error": {"code": -32602, "message": message}}
    assert list_status(gateway, world.key) == 200


def test_a_reply_that_would_repeat_a_lone_surrogate_is_an_error_and_the_socket_serves_on(gateway, world):
    """Over WebSocket only: the SDK's HTTP transport refuses such text as it parses the body."""
    frame = '{"jsonrpc":"2.0","id":7,"method":"resources/read","params":{"uri":"every+demo://x\\ud800"}}'
    message = (
        "Invalid params: the request holds a lone UTF-16 surrogate (a \\ud800-\\udfff escape without its pair) "
        "that its reply would repeat; send the text as valid Unicode"
    )
    assert answer(gateway, world.key, "ws", frame) == (
        None,
        {"jsonrpc": "2.0", "id": 7, "error": {"code": -32602, "message": message}},
    )


@pytest.mark.parametrize("accept", ["text/event-stream", "application/json", "text/html", ""])
@pytest.mark.parametrize("era", ["2025-11-25", "2026-07-28"])
def test_a_post_not_accepting_both_json_and_event_streams_is_406_with_what_to_send(inline_gateway, world, accept, era):
    """Both eras of the SDK's transport demand both types of a POST; its 2026-07-28 one said so with no body."""
    headers = HEADERS | bearer(world.key) | {"accept": accept, "mcp-protocol-version": era, "mcp-method": "tools/list"}
    response = httpx2.post(f"{inline_gateway.url}/mcp", content=json.dumps(LIST), headers=headers, timeout=TIMEOUT)
    assert response.status_code == 406
    assert response.headers["content-type"] == "application/json"
    assert response.json() == {
        "jsonrpc": "2.0",
        "id": None,
        "error": {"code": -32600, "message": "Not Acceptable: send 'Accept: application/json, text/event-stream'"},
    }


@pytest.fixture(scope="module")
def deep_http(world, logs):
    """The demo server over Streamable HTTP, as upstream `deep-http`."""
    demo = servers.start_demo_http(logs / "demo-deep-http.log")
    upstream = Upstream(slug="deep-http", transport="streamable_http", url=demo.url)
    upstream_save(upstream=upstream, created=True)
    assert upstream_catalog_sync(upstream=upstream).ok
    yield upstream.slug
    upstream.delete()
    demo.stop()


@pytest.mark.parametrize("slug", ["demo", "deep-http"], ids=["stdio", "streamable http"])
@pytest.mark.parametrize("levels", [DEPTH - 2, 230], ids=["one level over", "beyond what the SDK parses"])
def test_an_upstream_reply_nested_too_deep_is_a_tool_error_naming_the_upstream_and_the_next_call_works(
    gateway, world, deep_http, slug, levels
):
    """The reply's structured content holds lists `levels` deep, under three levels of envelope."""
    # A gateway sees the upstream the fixture just made within a snapshot check, not at once.
    eventually(lambda: f"{slug}__nested" in run(lambda: tool_names(gateway.url, world.key)))
    mark = audit_mark()
    refused = run(lambda: call(gateway.url, world.key, f"{slug}__nested", {"levels": levels}))
    message = (
        f"The upstream {slug!r} answered with JSON nested deeper than {DEPTH} levels, "
        "which the gateway does not pass on."
    )
    assert refused.is_error and refused.content[0].text == f"{slug}__nested: {message}"
    [completed] = [row for row in audit_since(mark) if row.kind == "completed"]
    assert (completed.error_code, completed.error_detail) == ("UPSTREAM_INVALID_RESPONSE", message)
    served = run(lambda: call(gateway.url, world.key, f"{slug}__nested", {"levels": DEPTH - 3}))
    assert not served.is_error and served.structured_content == {"value": json.loads(nested(DEPTH - 3))}
