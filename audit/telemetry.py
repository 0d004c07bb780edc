"""Traces and metrics of tool calls, beside the audit trail.

Every tools/call (and tools/list, resources/read, prompts/get) runs in an OpenTelemetry SERVER span named
and described by the OpenTelemetry MCP semantic conventions (`mcp.method.name`, `gen_ai.tool.name`, ...),
status ERROR with `error.type` the gateway's stable code when it fails. A call's trace id is the one its
audit rows store, so a trace in a tracing backend and a request in the audit browser find each other. The
span continues the agent's trace when the request's `_meta` carries a W3C `traceparent`, and the upstream's
call carries the span's own `traceparent` in its `_meta` in turn (both executors). Spans go to an OTLP collector
when OTEL_EXPORTER_OTLP_ENDPOINT (or ..._TRACES_ENDPOINT) is set; without one a request's span is only its ids
(a child's of the agent's trace, its sampled flag passed on), never recorded. A call exported and sampled
(OTEL_TRACES_SAMPLER) also gets a span per pipeline stage, "stage <name>", children of its own span; every call's
stages are timed into a histogram whatever is exported.

Prometheus metrics are per web process, which is where every call completes, whichever executor ran it.
"""

import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar
from functools import cache, lru_cache
from typing import Any

from mcp.shared.exceptions import MCPError
from opentelemetry import context, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import NonRecordingSpan, Span, SpanContext, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from prometheus_client import Counter, Gauge, Histogram

from audit.stage_histogram import StageHistogram

CALLS = Counter("switchboard_tool_calls", "Tool calls completed, by upstream and outcome", ["upstream", "outcome"])
DENIALS = Counter("switchboard_tool_denials", "Tool calls denied, by error code", ["code"])
LATENCY = Histogram(
    "switchboard_tool_call_seconds",
    "Duration of tool calls, by upstream",
    ["upstream"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, float("inf")),
)
STAGE_LATENCY = StageHistogram(
    "switchboard_call_stage_seconds",
    "Time each stage of a tools/call took (handoff/mcp/pipeline/), by stage",
    buckets=(0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 0.5, 2.5, 10, 60, float("inf")),
)
AUDIT_FAILURES = Counter(
    "switchboard_audit_write_failures",
    "Call rows the audit could not write (the call refused, or its result withheld), by row kind",
    ["kind"],
)
SIGN_OFF_NOTIFICATIONS = Counter(
    "switchboard_sign_off_notifications",
    "Sign-off notifications to approvers (registry/sign_off_notify.py), by outcome: delivered, failed (after its "
    "retries, or an answer not worth retrying) or refused (by the egress guard)",
    ["outcome"],
)
SESSIONS = Gauge("switchboard_open_sessions", "Stateful MCP sessions open in this process", ["transport"])
HTTP_REQUESTS = Counter(
    "switchboard_http_requests", "HTTP requests answered, by route, method and status", ["route", "method", "status"]
)
HTTP_LATENCY = Histogram(
    "switchboard_http_request_seconds",
    "Time from an HTTP request to the end of its response, by route (an SSE stream's is its whole life)",
    ["route"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, float("inf")),
)
# Route labels: the first path segment when it is one of these, else "other" (so a scanner's paths cannot
# make a label each).
HTTP_ROUTES = frozenset({"mcp", "healthz", "readyz", "metrics", "admin", "api", "static", "handoff"})

STATUS_TEXT = 512  # of a failed span's description: a tool's error text can be long

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


_EXPORTING = bool(os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
_NO_SPAN = nullcontext()


def _provider() -> TracerProvider:
    service = os.environ.get("OTEL_SERVICE_NAME", "switchboard")
    # Nothing exported: nothing recorded (mcp_span makes a request's span without the tracer).
    sampler = None if _EXPORTING else ALWAYS_OFF
    provider = TracerProvider(resource=Resource.create({"service.name": service}), sampler=sampler)
    if _EXPORTING:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return provider


_tracer = _provider().get_tracer("switchboard")


class _Current:
    """Makes a span the current one for a block. A request's span when nothing is exported: its ids alone, set
    without the tracer's three generator context managers (a call held for sign-off keeps them for its whole wait:
    about 5 KiB a call)."""

    __slots__ = ("_span", "_token")

    def __init__(self, span: Span) -> None:
        self._span = span

    def __enter__(self) -> Span:
        self._token = context.attach(trace.set_span_in_context(self._span))
        return self._span

    def __exit__(self, *exc: object) -> None:
        context.detach(self._token)


_ids = RandomIdGenerator()


def mcp_span(
    method: str,
    *,
    meta: dict[str, Any] | None,
    protocol_version: str | None,
    request_id: Any,
    session_id: str,
    transport: str,
    **names: str,
) -> AbstractContextManager[Span]:
    """The SERVER span of one MCP request, child of the agent's trace if its `_meta` names one. `names` are
    the semantic conventions' `tool`, `prompt` or `uri`; a JSON-RPC error raised inside fails the span."""
    meta = meta or {}
    carrier = {"traceparent": meta["traceparent"]} if isinstance(meta.get("traceparent"), str) else {}
    parent = _propagator.extract(carrier)
    if not _EXPORTING:
        agents = trace.get_current_span(parent).get_span_context()
        trace_id = agents.trace_id if agents.is_valid else _ids.generate_trace_id()
        own = SpanContext(trace_id, _ids.generate_span_id(), is_remote=False, trace_flags=agents.trace_flags)
        return _Current(NonRecordingSpan(own))
    target = names.get("tool") or names.get("prompt")  # a URI would make span names unbounded
    attributes = {
        "mcp.method.name": method,
        "mcp.protocol.version": protocol_version,
        "network.transport": "tcp",
        "network.protocol.name": "websocket" if transport == "ws" else "http",
        "gen_ai.tool.name": names.get("tool"),
        "gen_ai.operation.name": "execute_tool" if method == "tools/call" else None,
        "gen_ai.prompt.name": names.get("prompt"),
        "mcp.resource.uri": names.get("uri"),
        "mcp.session.id": session_id or None,
        "jsonrpc.request.id": None if request_id is None else str(request_id),
    }
    name = f"{method} {target}" if target else method
    return _recorded(name, parent, {key: value for key, value in attributes.items() if value is not None})


@contextmanager
def _recorded(name: str, parent: context.Context, attributes: dict[str, Any]) -> Iterator[Span]:
    with _tracer.start_as_current_span(
        name,
        context=parent,
        kind=SpanKind.SERVER,
        attributes=attributes,
        set_status_on_exception=False,  # the conventions want the JSON-RPC message, not the exception's repr
    ) as span:
        try:
            yield span
        except MCPError as error:
            data = error.data if isinstance(error.data, dict) else {}
            span.set_attribute("rpc.response.status_code", str(error.code))
            span_failed(str(data.get("code") or error.code), error.message)
            raise
        except Exception as unforeseen:
            span_failed(type(unforeseen).__qualname__, "")
            raise


def span_failed(code: str, message: str, span: Span | None = None) -> None:
    """Marks the request's span (by default the current one) failed: `code` is the gateway's stable code (or the
    conventions' `tool_error` for an upstream's own error result)."""
    span = span or trace.get_current_span()
    span.set_attribute("error.type", code)
    span.set_status(Status(StatusCode.ERROR, message[:STATUS_TEXT]))


def current_span() -> Span:
    return trace.get_current_span()


def trace_id_of(span: Span) -> str:
    return format(span.get_span_context().trace_id, "032x")


def current_trace_id() -> str:
    """The trace id of the span this task runs in ("" outside any), for audit rows."""
    context = trace.get_current_span().get_span_context()
    return format(context.trace_id, "032x") if context.is_valid else ""


def current_traceparent() -> str:
    """The W3C traceparent of the span this task runs in ("" outside any), for the upstream's `_meta`."""
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)
    return carrier.get("traceparent", "")


def code_call_span(name: str, traceparent: str) -> AbstractContextManager[Span]:
    """The span of a call made by code: a child of the stage that runs the code, found by its traceparent, since
    a worker may run the code for the web process that holds that stage."""
    carrier = {"traceparent": traceparent} if traceparent else {}
    return _tracer.start_as_current_span(
        f"tools/call {name}",
        context=_propagator.extract(carrier),
        kind=SpanKind.INTERNAL,
        attributes={"gen_ai.tool.name": name, "gen_ai.operation.name": "execute_tool"},
        record_exception=False,
        set_status_on_exception=False,
    )


def stage_spans_wanted() -> bool:
    """Spans per stage only where someone will read them: an exporter is set and this task's trace is sampled."""
    return _EXPORTING and trace.get_current_span().is_recording()


def stage_span(name: str, wanted: bool) -> AbstractContextManager[Any]:
    """The span of one stage, child of the call's (or a stage's, for a call made by code); the call's own span
    carries its outcome, so a stage's exception is neither recorded nor made its status (its text may quote one)."""
    if not wanted:
        return _NO_SPAN
    return _tracer.start_as_current_span(f"stage {name}", record_exception=False, set_status_on_exception=False)


def stage_span_ended(name: str, seconds: float) -> None:
    """The span of a stage timed before anyone knew the call (the frame): it ended now, `seconds` long."""
    _tracer.start_span(f"stage {name}", start_time=time.time_ns() - int(seconds * 1e9)).end()


def stages_observe(timers: dict[str, float]) -> None:
    STAGE_LATENCY.observe(timers)


# A metric's labelled child, looked up once: `labels()` takes a lock and checks its arguments every time (about
# 1.5 µs, twice a call and twice an HTTP request). No child of these is ever removed.
@cache
def _call_metrics(upstream: str, outcome: str) -> tuple[Any, Any]:
    return CALLS.labels(upstream, outcome), LATENCY.labels(upstream)


@lru_cache(maxsize=1024)  # bounded: a client names the method
def _http_metrics(route: str, method: str, status: str) -> tuple[Any, Any]:
    return HTTP_REQUESTS.labels(route, method, status), HTTP_LATENCY.labels(route)


def call_observe(*, upstream: str, outcome: str, duration_ms: float) -> None:
    calls, latency = _call_metrics(upstream, outcome)
    calls.inc()
    latency.observe(duration_ms / 1000)


def http_route(path: str) -> str:
    first = path.strip("/").split("/", 1)[0]
    return first if first in HTTP_ROUTES else "other" if first else "root"


AsgiApp = Callable[[dict, Any, Any], Awaitable[None]]


def http_metered(app: AsgiApp) -> AsgiApp:
    """Counts and times every HTTP request `app` answers, Django's views and the raw ASGI apps alike."""

    async def metered(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await app(scope, receive, send)
        started, status = time.perf_counter(), "500"  # what an app that fails before answering amounts to

        async def watched(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = str(message["status"])
            await send(message)

        try:
            await app(scope, receive, watched)
        finally:
            requests, latency = _http_metrics(http_route(scope["path"]), scope["method"], status)
            requests.inc()
            latency.observe(time.perf_counter() - started)

    return metered
