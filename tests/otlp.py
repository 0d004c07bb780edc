"""An OTLP/HTTP trace receiver on loopback, standing in for a collector: it decodes what a gateway exports
(POST /v1/traces, protobuf) and keeps every span."""

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span


class Receiver:
    def __init__(self) -> None:
        self.spans: list[Span] = []
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


def attributes(span: Span) -> dict[str, Any]:
    """A span's attributes as plain values (each OTLP value says which kind it holds)."""
    return {item.key: getattr(item.value, item.value.WhichOneof("value")) for item in span.attributes}


@contextmanager
def otlp_receiver() -> Iterator[tuple[Receiver, str]]:
    """A receiver and the OTEL_EXPORTER_OTLP_ENDPOINT that reaches it."""
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
    try:
        yield receiver, f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
