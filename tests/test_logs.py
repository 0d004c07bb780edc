"""GATEWAY_LOG_FORMAT=json: every line the gateway's logging writes is one JSON object with time, level, logger
and message, and a line written while a call is served names its request, trace, agent, upstream and tool.
Each tools/call line carries the outcome and code its audit row holds, and its duration."""

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp.shared.exceptions import MCPError

from policy.models import Rule
from registry.models import Upstream
from tests import servers
from tests.clients import TIMEOUT, call, reply_of, stateless_body, stateless_headers, tool_names
from tests.factories import agent
from tests.helpers import audit_mark, audit_since, eventually, run

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
        "outcome": "ok",
        "code": "",
        "duration_ms": round(completed.duration_ms, 3),
    }
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+\+00:00", served["time"])


@pytest.fixture(scope="module")
def deny_all_json(server_env, world, logs) -> Iterator[tuple[servers.Running, Path]]:
    log = logs / "gateway-json-deny-all.log"
    with servers.inline_gateway_with(
        server_env, log, GATEWAY_LOG_FORMAT="json", GATEWAY_POLICY_DEFAULT="deny"
    ) as running:
        yield running, log


def call_lines(log: Path, request_id: Any) -> list[dict[str, Any]]:
    """The tools/call lines of one call (a line is written once its audit row is)."""
    records = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    return [r for r in records if r.get("request_id") == str(request_id) and r["message"].startswith("tools/call ")]


def offered(gateway: servers.Running, key: str, check) -> set[str]:
    return eventually(lambda: (names := run(lambda: tool_names(gateway.url, key))) and check(names) and names)


def test_a_tool_error_is_logged_with_the_outcome_and_code_of_its_audit_row(deny_all_json, world):
    gateway, log = deny_all_json
    with agent("fran") as (fran, key):
        rule = Rule.objects.create(effect="allow", agent=fran, upstream=Upstream.objects.get(slug="demo"))
        try:
            offered(gateway, key, lambda names: "demo__fail" in names)
            mark = audit_mark()
            result = run(lambda: call(gateway.url, key, "demo__fail"))
        finally:
            rule.delete()
    assert not isinstance(result, MCPError) and result.is_error, result
    [completed] = [row for row in audit_since(mark) if row.kind == "completed"]
    [line] = eventually(lambda: call_lines(log, completed.request_id))
    assert (completed.outcome, completed.error_code) == ("error", "TOOL_ERROR")
    assert (line["level"], line["outcome"], line["code"], line["duration_ms"]) == (
        "INFO", "error", "TOOL_ERROR", round(completed.duration_ms, 3)
    )  # fmt: skip
    assert re.fullmatch(r"tools/call demo__fail: error TOOL_ERROR in \d+ ms", line["message"])


def test_a_denial_by_a_rule_and_one_by_the_stance_are_logged_and_their_rows_name_what_denied_them(deny_all_json, world):
    gateway, log = deny_all_json
    demo = Upstream.objects.get(slug="demo")
    with agent("gwen") as (gwen, key):
        note = "adding is the ledger's job"
        rules = [
            Rule.objects.create(effect="allow", agent=gwen, upstream=demo),
            Rule.objects.create(effect="deny", agent=gwen, upstream=demo, tool_pattern="add", note=note),
        ]
        deny_id = rules[1].id
        try:
            offered(gateway, key, lambda names: "demo__echo" in names and "demo__add" not in names)
            mark = audit_mark()
            by_rule = run(lambda: call(gateway.url, key, "demo__add", {"a": 1, "b": 2}))
            by_stance = run(lambda: call(gateway.url, key, "time__get_current_time", {"timezone": "UTC"}))
        finally:
            for rule in rules:
                rule.delete()
    assert isinstance(by_rule, MCPError) and isinstance(by_stance, MCPError)
    assert (by_rule.code, by_rule.data["code"], by_stance.code, by_stance.data["code"]) == (
        -32001, "POLICY_DENIED", -32001, "POLICY_DENIED"
    )  # fmt: skip
    rows = audit_since(mark)
    assert [(row.kind, row.exposed_name, row.error_code, row.detail) for row in rows] == [
        ("denied", "demo__add", "POLICY_DENIED", {"policy": {"rule": deny_id, "note": note, "effect": "deny"}}),
        ("denied", "time__get_current_time", "POLICY_DENIED", {"policy": {"stance": "deny"}}),
    ]
    for row in rows:
        [line] = eventually(lambda row=row: call_lines(log, row.request_id))
        assert (line["level"], line["outcome"], line["code"], line["tool"]) == (
            "INFO", "denied", "POLICY_DENIED", row.exposed_name
        )  # fmt: skip
        assert line["duration_ms"] >= 0


def test_a_forged_request_state_is_logged_as_the_denial_its_audit_row_records(deny_all_json, world):
    gateway, log = deny_all_json
    body = json.loads(stateless_body("demo__echo", {"text": "x"}))
    body["params"]["requestState"] = "forged"
    mark = audit_mark()
    headers = stateless_headers(world.key, "demo__echo")
    reply = reply_of(httpx2.post(f"{gateway.url}/mcp", content=json.dumps(body), headers=headers, timeout=TIMEOUT))
    [row] = audit_since(mark)
    [line] = eventually(lambda: call_lines(log, row.request_id))
    assert reply["error"]["message"] == row.error_detail
    assert (row.kind, row.error_code) == ("denied", "INVALID_REQUEST_STATE")
    assert (line["level"], line["outcome"], line["code"], line["tool"]) == (
        "INFO", "denied", "INVALID_REQUEST_STATE", "demo__echo"
    )  # fmt: skip
