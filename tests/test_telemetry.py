"""Traces and metrics: each call's span reaches an OTLP receiver (tests/otlp.py) with the trace id its audit
rows store and the OpenTelemetry MCP conventions' attributes and status, and /metrics counts calls by
upstream and shows each circuit."""

import secrets
from collections.abc import Iterator
from typing import Any

import anyio
import httpx2
import pytest
from mcp.shared.exceptions import MCPError
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from tests import servers
from tests.clients import STATELESS_META, call, reply_of, sdk_client, stateless_headers, ws_session
from tests.helpers import audit_mark, audit_since, eventually, metric_value, run, scrape
from tests.otlp import CALLED, Receiver, attributes, otlp_receiver, stages_of


@pytest.fixture(scope="module")
def otlp() -> Iterator[Receiver]:
    with otlp_receiver() as running:
        yield running


@pytest.fixture(scope="module")
def traced_gateway(server_env, world, logs, otlp) -> Iterator[servers.Running]:
    settings = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.endpoint,  # the exporter posts to <endpoint>/v1/traces
        "OTEL_BSP_SCHEDULE_DELAY": "100",  # ms: export spans at once rather than every 5 s
    }
    with servers.inline_gateway_with(server_env, logs / "gateway-traced.log", **settings) as running:
        yield running


def span_of(otlp: Receiver, trace_id: str, name: str) -> Span:
    """The span of that name in that trace, once the gateway has exported it."""
    received = otlp.received

    def found() -> Span | None:
        return next((s for s in received() if s.trace_id.hex() == trace_id and s.name == name), None)

    return eventually(found)


def traced_call(gateway: servers.Running, key: str, name: str, arguments: dict | None = None) -> tuple[Any, Any]:
    """A call in a 2025-11-25 session of its own: what it returned, and its last audit row."""
    mark = audit_mark()
    result = run(lambda: call(gateway.url, key, name, arguments))
    return result, audit_since(mark)[-1]


def call_attributes(row, **more: str) -> dict[str, Any]:
    """What the conventions put on the SERVER span of a tools/call this audit row records."""
    return {
        "mcp.method.name": "tools/call",
        "gen_ai.tool.name": row.exposed_name,
        "gen_ai.operation.name": "execute_tool",
        "mcp.protocol.version": "2025-11-25",
        "mcp.session.id": row.session_id,
        "jsonrpc.request.id": "2",  # the SDK client sends initialize (0) and tools/list (1) first
        "network.transport": "tcp",
        "network.protocol.name": "http",
    } | more


def test_a_calls_span_reaches_the_collector_with_the_trace_id_of_its_audit_rows(traced_gateway, world, otlp):
    mark = audit_mark()
    run(lambda: call(traced_gateway.url, world.key, "demo__echo", {"text": "traced"}, mode="2026-07-28"))
    # This call's two rows: another test's leftover call may be settled by the outcome sweep in the same window.
    approved = next(r for r in audit_since(mark) if r.kind == "approved" and r.exposed_name == "demo__echo")
    [completed] = [r for r in audit_since(mark) if r.request_id == approved.request_id and r.kind != "approved"]
    span = span_of(otlp, completed.trace_id, "tools/call demo__echo")
    assert approved.trace_id == completed.trace_id and span.kind == Span.SPAN_KIND_SERVER


def test_a_successful_calls_span_carries_the_mcp_conventions_and_no_error(traced_gateway, world, otlp):
    result, row = traced_call(traced_gateway, world.key, "demo__echo", {"text": "conventions"})
    span = span_of(otlp, row.trace_id, "tools/call demo__echo")
    assert not result.is_error and row.session_id
    assert attributes(span) == call_attributes(row)
    assert span.status.code == Status.STATUS_CODE_UNSET


def test_an_error_result_fails_the_span_as_a_tool_error(traced_gateway, world, otlp):
    result, row = traced_call(traced_gateway, world.key, "demo__fail")
    span = span_of(otlp, row.trace_id, "tools/call demo__fail")
    assert result.is_error and row.error_code == "TOOL_ERROR"
    assert attributes(span) == call_attributes(row, **{"error.type": "tool_error"})
    assert (span.status.code, span.status.message) == (Status.STATUS_CODE_ERROR, result.content[0].text)


def test_a_denied_call_fails_the_span_with_the_gateways_code_and_the_json_rpc_error(traced_gateway, world, otlp):
    refused, row = traced_call(traced_gateway, world.key, "demo__no_such_tool")
    span = span_of(otlp, row.trace_id, "tools/call demo__no_such_tool")
    assert isinstance(refused, MCPError) and (row.kind, row.error_code) == ("denied", "TOOL_NOT_FOUND")
    expected = {"error.type": "TOOL_NOT_FOUND", "rpc.response.status_code": str(refused.code)}
    assert attributes(span) == call_attributes(row, **expected)
    assert (span.status.code, span.status.message) == (Status.STATUS_CODE_ERROR, refused.message)


def test_an_executor_failure_fails_the_span_with_its_code(traced_gateway, world, otlp):
    result, row = traced_call(traced_gateway, world.key, "slow__sleep", {"seconds": 3})
    span = span_of(otlp, row.trace_id, "tools/call slow__sleep")
    assert result.is_error and row.error_code == "UPSTREAM_TIMEOUT"
    assert attributes(span) == call_attributes(row, **{"error.type": "UPSTREAM_TIMEOUT"})
    assert (span.status.code, span.status.message) == (Status.STATUS_CODE_ERROR, result.content[0].text)


def test_reads_and_prompts_get_spans_of_their_own_and_an_unknown_prompt_fails_its_span(traced_gateway, world, otlp):
    document = "every+demo://resource/static/document/architecture.md"

    async def scenario() -> MCPError:
        async with sdk_client(traced_gateway.url, world.key, "legacy") as client:
            await client.read_resource(document)
            await client.get_prompt("every__args-prompt", {"city": "Lyon"})
            try:
                await client.get_prompt("nowhere__nope")
            except MCPError as refused:
                return refused
        raise AssertionError("an unknown prompt was served")

    mark = audit_mark()
    refused = run(scenario)
    read, _, prompt, _, unknown = [r for r in audit_since(mark) if r.kind != "session"]
    read_span = span_of(otlp, read.trace_id, "resources/read")
    prompt_span = span_of(otlp, prompt.trace_id, "prompts/get every__args-prompt")
    unknown_span = span_of(otlp, unknown.trace_id, "prompts/get nowhere__nope")
    common = {"mcp.protocol.version": "2025-11-25", "network.transport": "tcp", "network.protocol.name": "http"}
    spans = [attributes(span) for span in (read_span, prompt_span, unknown_span)]
    ids = [int(span.pop("jsonrpc.request.id")) for span in spans]  # the client sends requests of its own too
    assert ids == sorted(set(ids))
    assert spans[0] == common | {
        "mcp.method.name": "resources/read",
        "mcp.resource.uri": document,
        "mcp.session.id": read.session_id,
    }
    assert spans[1] == common | {
        "mcp.method.name": "prompts/get",
        "gen_ai.prompt.name": "every__args-prompt",
        "mcp.session.id": prompt.session_id,
    }
    assert (unknown.kind, unknown.error_code, refused.data["code"]) == ("denied", "NOT_FOUND", "NOT_FOUND")
    assert attributes(unknown_span)["error.type"] == "NOT_FOUND"
    assert attributes(unknown_span)["rpc.response.status_code"] == str(refused.code) == "-32602"
    assert (unknown_span.status.code, unknown_span.status.message) == (Status.STATUS_CODE_ERROR, refused.message)


def test_a_tools_list_span_continues_the_agents_trace(traced_gateway, world, otlp):
    trace_id, parent = secrets.token_hex(16), secrets.token_hex(8)
    meta = STATELESS_META | {"traceparent": f"00-{trace_id}-{parent}-01"}
    body = {"jsonrpc": "2.0", "id": "list-7", "method": "tools/list", "params": {"_meta": meta}}
    headers = {
        "authorization": f"Bearer {world.key}",
        "accept": "application/json, text/event-stream",
        "mcp-protocol-version": "2026-07-28",
        "mcp-method": "tools/list",
    }
    assert httpx2.post(f"{traced_gateway.url}/mcp", json=body, headers=headers, timeout=10).status_code == 200
    span = span_of(otlp, trace_id, "tools/list")
    assert span.parent_span_id.hex() == parent and span.kind == Span.SPAN_KIND_SERVER
    assert attributes(span) == {
        "mcp.method.name": "tools/list",
        "mcp.protocol.version": "2026-07-28",
        "jsonrpc.request.id": "list-7",
        "network.transport": "tcp",
        "network.protocol.name": "http",
    }


def _echo_in_trace(gateway: servers.Running, key: str, trace_id: str, flags: str) -> dict:
    """A 2026-07-28 call of demo__echo in the agent's trace, sampled (flags 01) or not (00)."""
    meta = STATELESS_META | {"traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-{flags}"}
    params = {"name": "demo__echo", "arguments": {"text": "staged"}, "_meta": meta}
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}
    headers = stateless_headers(key, "demo__echo")
    return reply_of(httpx2.post(f"{gateway.url}/mcp", json=body, headers=headers, timeout=10))


def test_a_sampled_call_has_a_span_per_stage_and_an_unsampled_one_none(traced_gateway, world, otlp):
    unsampled, sampled = secrets.token_hex(16), secrets.token_hex(16)
    mark = audit_mark()
    assert "result" in _echo_in_trace(traced_gateway, world.key, unsampled, "00")
    assert "result" in _echo_in_trace(traced_gateway, world.key, sampled, "01")
    assert stages_of(otlp, sampled) == {"tools/call demo__echo": CALLED}
    # Spans are exported in the order they end: the unsampled call's, had it any, would have come first.
    assert [span.name for span in otlp.received() if span.trace_id.hex() == unsampled] == []
    assert {row.trace_id for row in audit_since(mark) if row.exposed_name == "demo__echo"} == {unsampled, sampled}


def sample(text: str, name: str) -> float:
    return next((float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + " ")), 0.0)


def test_metrics_count_calls_by_upstream_and_show_circuits(traced_gateway, world):
    ok, count = (
        'switchboard_tool_calls_total{outcome="ok",upstream="demo"}',
        'switchboard_tool_call_seconds_count{upstream="demo"}',
    )
    before = httpx2.get(f"{traced_gateway.url}/metrics").text
    run(lambda: call(traced_gateway.url, world.key, "demo__echo", {"text": "metered"}))
    run(lambda: call(traced_gateway.url, world.key, "demo__fail"))
    after = httpx2.get(f"{traced_gateway.url}/metrics").text
    assert sample(after, ok) - sample(before, ok) == 1.0 and sample(after, count) - sample(before, count) == 2.0
    assert sample(after, 'switchboard_tool_calls_total{outcome="error",upstream="demo"}') >= 1.0
    assert sample(after, 'switchboard_circuit_state{state="closed",upstream="demo"}') == 1.0


def test_metrics_ask_for_the_token_when_one_is_set(traced_gateway):
    from django.test import Client, override_settings

    proxied = httpx2.get(f"{traced_gateway.url}/metrics", headers={"X-Forwarded-For": "203.0.113.9"})
    assert proxied.status_code == 401  # loopback, but on behalf of someone else
    with override_settings(GATEWAY_METRICS_TOKEN="m" * 32):
        refused = Client(HTTP_HOST="localhost").get("/metrics")
        allowed = Client(HTTP_HOST="localhost").get("/metrics", headers={"Authorization": "Bearer " + "m" * 32})
    assert (refused.status_code, refused["WWW-Authenticate"]) == (401, 'Bearer realm="metrics"')
    assert allowed.status_code == 200


def test_open_sessions_are_counted_while_open_on_both_transports(traced_gateway, world):
    http_open, ws_open = 'switchboard_open_sessions{transport="http"}', 'switchboard_open_sessions{transport="ws"}'

    def scrape() -> str:
        return httpx2.get(f"{traced_gateway.url}/metrics").text

    async def scenario() -> tuple[str, str]:
        async with sdk_client(traced_gateway.url, world.key, "legacy") as client:
            await client.list_tools()
            async with ws_session(traced_gateway.url, world.key):
                during = await anyio.to_thread.run_sync(scrape)
        return during, await anyio.to_thread.run_sync(scrape)

    before = scrape()
    during, after = run(scenario)
    assert sample(during, http_open) - sample(before, http_open) == 1.0
    assert sample(during, ws_open) - sample(before, ws_open) == 1.0
    assert eventually(lambda: sample(scrape(), http_open) == sample(before, http_open))
    assert eventually(lambda: sample(scrape(), ws_open) == sample(before, ws_open))


def test_http_requests_are_counted_by_route_method_and_status(traced_gateway, world):
    def count(route: str, method: str, status: str) -> float:
        return metric_value(
            scrape(traced_gateway), "switchboard_http_requests_total", route=route, method=method, status=status
        )

    expected = {
        ("healthz", "GET", "200"): lambda: httpx2.get(f"{traced_gateway.url}/healthz"),
        ("admin", "GET", "200"): lambda: httpx2.get(f"{traced_gateway.url}/admin/login/"),
        ("other", "GET", "404"): lambda: httpx2.get(f"{traced_gateway.url}/wp-login.php"),
        ("mcp", "POST", "401"): lambda: httpx2.post(f"{traced_gateway.url}/mcp", json={}),
    }
    for labels, request in expected.items():
        before = count(*labels)
        assert request().status_code == int(labels[2])
        assert count(*labels) - before == 1.0, labels
    timed = metric_value(scrape(traced_gateway), "switchboard_http_request_seconds_count", route="mcp")
    run(lambda: call(traced_gateway.url, world.key, "demo__echo", {"text": "timed"}))
    assert metric_value(scrape(traced_gateway), "switchboard_http_request_seconds_count", route="mcp") > timed


def test_each_enabled_upstream_is_shown_up_or_down(traced_gateway, world):
    from registry.models import Upstream
    from registry.services import upstream_catalog_sync, upstream_save

    broken = Upstream(slug="gone", transport="stdio", command="/nonexistent/mcp-server")
    upstream_save(upstream=broken, created=True)
    try:
        assert not upstream_catalog_sync(upstream=broken).ok
        families = scrape(traced_gateway)
        assert metric_value(families, "switchboard_upstream_up", upstream="demo") == 1.0
        assert metric_value(families, "switchboard_upstream_up", upstream="time") == 1.0
        gone = [
            s
            for f in families
            for s in f.samples
            if s.name == "switchboard_upstream_up" and s.labels["upstream"] == "gone"
        ]
        assert [s.value for s in gone] == [0.0]
    finally:
        broken.delete()


def test_live_workers_are_counted_in_celery_mode_only(celery_gateway, traced_gateway):
    assert eventually(lambda: metric_value(scrape(celery_gateway), "switchboard_workers_alive") == 1.0)
    embedded = [f.name for f in scrape(traced_gateway)]
    assert "switchboard_workers_alive" not in embedded and "switchboard_upstream_up" in embedded
