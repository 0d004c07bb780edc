"""A request's span when nothing exports spans (this process sets no OTLP endpoint): its ids alone, in the agent's
trace when the request names one, current for the block and gone after it."""

import re
import secrets

from opentelemetry import trace

from audit.telemetry import current_trace_id, current_traceparent, mcp_span

REQUEST = {"protocol_version": "2025-11-25", "request_id": 7, "session_id": "", "transport": "http"}


def test_a_request_in_the_agents_sampled_trace_continues_it_as_a_child_and_passes_the_flag_on():
    trace_id, parent = secrets.token_hex(16), secrets.token_hex(8)
    with mcp_span(
        "tools/call", meta={"traceparent": f"00-{trace_id}-{parent}-01"}, tool="demo__add", **REQUEST
    ) as span:
        assert current_trace_id() == trace_id
        version, same_trace, own, flags = current_traceparent().split("-")
        assert (version, same_trace, flags) == ("00", trace_id, "01") and own != parent and len(own) == 16
        assert not span.is_recording()
    assert trace.get_current_span() is trace.INVALID_SPAN


def test_a_request_outside_any_trace_starts_one_unsampled():
    with mcp_span("tools/list", meta=None, **REQUEST):
        first = current_traceparent()
    with mcp_span("tools/list", meta={"traceparent": "not a traceparent"}, **REQUEST):
        second = current_traceparent()
    assert re.fullmatch(r"00-[0-9a-f]{32}-[0-9a-f]{16}-00", first) and re.fullmatch(
        r"00-[0-9a-f]{32}-[0-9a-f]{16}-00", second
    )
    assert first.split("-")[1] != second.split("-")[1]  # a trace each
    assert current_trace_id() == ""
