"""An OTLP/HTTP trace receiver on loopback, standing in for a collector: it decodes what a gateway exports
(POST /v1/traces, protobuf) and keeps every span."""

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from tests.helpers import eventually


class Receiver:
    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.endpoint = ""  # the OTEL_EXPORTER_OTLP_ENDPOINT that reaches it
        self._lock = threading.Lock()

    def keep(self, body: bytes) -> None:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        with self._lock:
            for resource in request.resource_spans:
                for scope in resource.scope_spans:
                    self.spans.extend(scope.spans)

    def received(self) -> list[Span]:
        with self._lock:
            return list(self.spans)


# The stages of a call, as their spans name them (handoff/mcp/pipeline/run.py): one that runs, one refused.
CALLED = ["frame", "caller", "route", "decide", "sign_off", "admit", "before_execute", "approval_row", "execute"]
CALLED += ["result", "completion_row", "answer"]
REFUSED_AT_ROUTE = ["frame", "caller", "route", "denial_row", "answer"]
REFUSED_AT_DECIDE = ["frame", "caller", "route", "decide", "denial_row", "answer"]


def stages_of(receiver: Receiver, trace_id: str, calls: int = 1) -> dict[str, list[str]]:
    """The stages each call in that trace ran (its "stage <name>" spans), in the order they started, by the name
    of the span they are children of (the call's own), once `calls` calls have answered: a call's answer is its
    last stage to end, so the others have been exported before it or with it."""

    def answered() -> list[Span] | None:
        spans = [s for s in receiver.received() if s.trace_id.hex() == trace_id]
        names = {s.span_id for s in spans}
        stages = [s for s in spans if s.name.startswith("stage ")]
        if sum(s.name == "stage answer" for s in stages) < calls or any(s.parent_span_id not in names for s in stages):
            return None
        return spans

    spans = eventually(answered)
    names = {s.span_id: s.name for s in spans}
    ran: dict[str, list[str]] = {}
    for stage in sorted(spans, key=lambda s: s.start_time_unix_nano):
        if stage.name.startswith("stage "):
            ran.setdefault(names[stage.parent_span_id], []).append(stage.name.removeprefix("stage "))
    return ran


def attributes(span: Span) -> dict[str, Any]:
    """A span's attributes as plain values (each OTLP value says which kind it holds)."""
    return {item.key: getattr(item.value, item.value.WhichOneof("value")) for item in span.attributes}


@contextmanager
def otlp_receiver() -> Iterator[Receiver]:
    """A receiver listening on 127.0.0.1 (its `endpoint`)."""
    receiver = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            if self.path != "/v1/traces":
                self.send_error(404)
                return
            receiver.keep(body)
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    receiver.endpoint = f"http://127.0.0.1:{server.server_port}"
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
