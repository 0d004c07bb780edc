"""Traces and metrics: each call's span reaches an OTLP collector with the trace id its audit rows store,
and /metrics counts calls by upstream and shows each circuit."""

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import anyio
import httpx2
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests import servers
from tests.clients import call, sdk_client, ws_session
from tests.helpers import audit_mark, audit_since, eventually, run


class Collector(BaseHTTPRequestHandler):
    """An OTLP/HTTP trace receiver: keeps every span it is sent."""

    spans: list = []

    def do_POST(self) -> None:
        request = ExportTraceServiceRequest()
        request.ParseFromString(self.rfile.read(int(self.headers["Content-Length"])))
        for resource in request.resource_spans:
            for scope in resource.scope_spans:
                Collector.spans.extend(scope.spans)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def traced_gateway(server_env, world, logs) -> Iterator[servers.Running]:
    collector = ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    threading.Thread(target=collector.serve_forever, daemon=True).start()
    otlp = {
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"http://127.0.0.1:{collector.server_port}/v1/traces",
        "OTEL_BSP_SCHEDULE_DELAY": "100",  # ms: export spans at once rather than every 5 s
    }
    with servers.inline_gateway_with(server_env, logs / "gateway-traced.log", **otlp) as running:
        yield running
    collector.shutdown()


def test_a_calls_span_reaches_the_collector_with_the_trace_id_of_its_audit_rows(traced_gateway, world):
    mark = audit_mark()
    run(lambda: call(traced_gateway.url, world.key, "demo__echo", {"text": "traced"}, mode="2026-07-28"))
    [approved, completed] = audit_since(mark)
    span = eventually(lambda: next((s for s in Collector.spans if s.trace_id.hex() == completed.trace_id), None))
    assert span.name == "tools/call demo__echo" and approved.trace_id == completed.trace_id


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
