"""Traces and metrics of tool calls, beside the audit trail.

Every tools/call runs in an OpenTelemetry span whose trace id is the one its audit rows store, so a trace
in a tracing backend and a request in the audit browser find each other. The span continues the agent's
trace when the request's `_meta` carries a W3C `traceparent`, and the upstream's call carries the span's own
`traceparent` in its `_meta` in turn (both executors). Spans go to an OTLP collector when
OTEL_EXPORTER_OTLP_ENDPOINT (or ..._TRACES_ENDPOINT) is set; without one they are made (for their ids)
and dropped.

Prometheus metrics are per web process, which is where every call completes, whichever executor ran it.
"""

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Span, SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from prometheus_client import Counter, Gauge, Histogram

CALLS = Counter("switchboard_tool_calls", "Tool calls completed, by upstream and outcome", ["upstream", "outcome"])
DENIALS = Counter("switchboard_tool_denials", "Tool calls denied, by error code", ["code"])
LATENCY = Histogram(
    "switchboard_tool_call_seconds",
    "Duration of tool calls, by upstream",
    ["upstream"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, float("inf")),
)
SESSIONS = Gauge("switchboard_open_sessions", "Stateful MCP sessions open in this process", ["transport"])

_propagator = TraceContextTextMapPropagator()
# What is known of the call the current task serves, for its log lines: request_id, trace_id, agent,
# upstream, tool. Each request runs in a task of its own, whose context ends with it.
_log_fields: ContextVar[dict[str, str] | None] = ContextVar("switchboard_log_fields", default=None)


def log_fields_add(**fields: str) -> None:
    """Name these in every log line the current task writes from now on (empty values are left out)."""
    _log_fields.set((_log_fields.get() or {}) | {name: value for name, value in fields.items() if value})


class LogFields(logging.Filter):
    """Puts the current call's fields on every record (the JSON format writes them; the text one does not)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.__dict__.update(_log_fields.get() or {})
        return True


def _provider() -> TracerProvider:
    service = os.environ.get("OTEL_SERVICE_NAME", "switchboard")
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return provider


_tracer = _provider().get_tracer("switchboard")


@contextmanager
def call_span(name: str, meta: dict[str, Any] | None) -> Iterator[Span]:
    """The span of one tools/call, child of the agent's trace if its `_meta` names one."""
    carrier = {"traceparent": meta["traceparent"]} if meta and isinstance(meta.get("traceparent"), str) else {}
    with _tracer.start_as_current_span(
        f"tools/call {name}", context=_propagator.extract(carrier), kind=SpanKind.SERVER
    ) as span:
        yield span


def trace_id_of(span: Span) -> str:
    return format(span.get_span_context().trace_id, "032x")


def current_traceparent() -> str:
    """The W3C traceparent of the span this task runs in ("" outside any), for the upstream's `_meta`."""
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)
    return carrier.get("traceparent", "")


def call_observe(*, upstream: str, outcome: str, duration_ms: float) -> None:
    CALLS.labels(upstream, outcome).inc()
    LATENCY.labels(upstream).observe(duration_ms / 1000)
