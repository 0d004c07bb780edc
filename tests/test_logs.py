"""GATEWAY_LOG_FORMAT=json: every line the gateway's logging writes is one JSON object with time, level, logger
and message, and a line written while a call is served names its request, trace, agent, upstream and tool."""

import json
import re

from tests import servers
from tests.clients import call
from tests.helpers import audit_mark, audit_since, run

# Daphne writes its access log to stdout itself, not through logging (README: --access-log /dev/null).
ACCESS_LINE = re.compile(r'^\S+:\d+ - - \[[^]]+\] "[A-Z]+ [^"]*" \d{3} \S+$')


def test_json_logs_are_one_object_per_line_and_name_the_call(server_env, world, logs):
    log = logs / "gateway-json.log"
    with servers.inline_gateway_with(server_env, log, GATEWAY_LOG_FORMAT="json") as gateway:
        mark = audit_mark()
        result = run(lambda: call(gateway.url, world.key, "demo__echo", {"text": "logged"}))
        [completed] = [row for row in audit_since(mark) if row.kind == "completed"]
    assert result.content[0].text == "logged"
    lines = [line for line in log.read_text().splitlines() if line and not ACCESS_LINE.match(line)]
    records = [json.loads(line) for line in lines]  # any line that is not JSON fails here
    assert all({"time", "level", "logger", "message"} <= set(record) for record in records)
    assert any(record["logger"].startswith("daphne") for record in records), "Daphne's own lines too"
    [served] = [record for record in records if record["message"].startswith("tools/call demo__echo: ok in ")]
    assert served | {"time": "", "message": ""} == {
        "time": "",
        "level": "INFO",
        "logger": "handoff.mcp.tools",
        "message": "",
        "trace_id": completed.trace_id,
        "agent": "alice",
        "tool": "demo__echo",
        "request_id": str(completed.request_id),
        "upstream": "demo",
    }
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+\+00:00", served["time"])
