"""The audit trail: one approval and one completion per call, sharing a request id; any text is storable."""

import json
import uuid
from collections import Counter
from datetime import timedelta

import httpx2
from mcp.shared.exceptions import MCPError

from audit.models import SEAL_SERVERS, AuditEvent
from audit.outcomes import outcomes_settle
from audit.services import audit_record, canonical_sha256
from policy.models import Team
from registry.models import Upstream
from tests import servers
from tests.clients import INITIALIZE, call, sdk_client, tool_names, ws_session
from tests.conftest import needs
from tests.factories import agent
from tests.helpers import audit_mark, audit_since, eventually, metric_value, run, scrape, until

CALLS = [
    ("demo__add", {"a": 1, "b": 2}),
    ("demo__fail", {}),
    ("time__get_current_time", {"timezone": "UTC"}),
    ("every__get-sum", {"a": 3, "b": 4}),
    ("demo__echo", {"text": "x"}),
]


def test_every_call_has_exactly_one_approval_and_one_completion_sharing_a_request_id(gateway, world):
    mark = audit_mark()

    async def scenario():
        async with sdk_client(gateway.url, world.key, "2026-07-28") as client:
            for name, arguments in CALLS:
                await client.call_tool(name, arguments)
            try:
                await client.call_tool("nowhere__tool", {})
            except MCPError:
                pass

    run(scenario)
    rows = [r for r in audit_since(mark) if r.kind != "admin_change"]
    by_request = {}
    for row in rows:
        by_request.setdefault(row.request_id, []).append(row.kind)
    assert sorted(Counter(tuple(kinds) for kinds in by_request.values()).items()) == [
        (("approved", "completed"), len(CALLS)),
        (("denied",), 1),
    ]
    completed = [r for r in rows if r.kind == "completed"]
    assert [r.exposed_name for r in completed] == [name for name, _ in CALLS]
    assert all(r.agent_name == "alice" and r.duration_ms > 0 and r.response_bytes > 0 for r in completed)
    assert completed[0].arguments_sha256 == canonical_sha256({"a": 1, "b": 2})


def test_nul_characters_and_lone_surrogates_do_not_break_an_audit_write(db):
    nasty = "tool\x00name\ud800end"
    row = audit_record(kind="denied", tool=nasty, error_detail=nasty, detail={"k\x00": [nasty, {"x": "\udfff"}]})
    stored = AuditEvent.objects.get(pk=row.pk)
    assert stored.tool == "tool\\u0000name\\ud800end"
    assert stored.detail == {"k\\u0000": ["tool\\u0000name\\ud800end", {"x": "\\udfff"}]}


def test_canonical_hash_ignores_key_order_and_spacing():
    assert canonical_sha256({"b": 1, "a": [1, 2]}) == canonical_sha256({"a": [1, 2], "b": 1})
    assert canonical_sha256({"a": 1}) != canonical_sha256({"a": "1"})


def test_a_lost_audit_connection_fails_one_call_closed_and_the_next_works(inline_gateway, world):
    from django.db import connection

    needs(connection.vendor == "postgresql", "the async audit writer's own connections exist on PostgreSQL only")
    mark = audit_mark()

    async def call(text):  # stateless: no session row takes the broken connection first
        async with sdk_client(inline_gateway.url, world.key, "2026-07-28") as client:
            try:
                return await client.call_tool("demo__echo", {"text": text})
            except MCPError as refused:
                return refused

    assert run(lambda: call("before")).content[0].text == "before"
    failures_before = metric_value(scrape(inline_gateway), "switchboard_audit_write_failures_total", kind="approved")
    with connection.cursor() as cursor:  # what a database restart does to the gateway's audit connections
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = %s",
            [f"switchboard-audit-{inline_gateway.process.pid}"],
        )
        assert cursor.fetchone()[0] >= 1
    refused = run(lambda: call("lost"))
    after = run(lambda: call("after"))
    assert isinstance(refused, MCPError) and refused.code == -32002 and refused.data["code"] == "AUDIT_UNAVAILABLE"
    assert refused.message == "The gateway could not record this call, so it was not run. Try again shortly."
    assert after.content[0].text == "after"
    failures = metric_value(scrape(inline_gateway), "switchboard_audit_write_failures_total", kind="approved")
    assert failures - failures_before == 1.0  # what the "audit unavailable" alert watches
    lost = canonical_sha256({"text": "lost"})
    assert not [r for r in audit_since(mark) if r.arguments_sha256 == lost], "an unrecorded call must not run"


def test_a_call_whose_client_leaves_still_gets_its_completion_row(inline_gateway, world):
    mark, started = audit_mark(), f"leaves-{uuid.uuid4().hex[:12]}"

    async def scenario():
        async with ws_session(inline_gateway.url, world.key) as ws:
            await ws.ws.send(
                json.dumps(
                    {
                        "jsonrpc": "2.0",
                        "id": 7,
                        "method": "tools/call",
                        "params": {"name": "demo__sleep", "arguments": {"seconds": 3, "mark": started}},
                    }
                )
            )
            # Leave without waiting, once the call has reached the upstream (the demo's sleep marks its start).
            await until(lambda: servers.demo_started(started), timeout=10)

    def both_rows():
        rows = [r for r in audit_since(mark) if r.tool == "sleep"]
        return rows if len(rows) == 2 else None

    run(scenario)
    rows = eventually(both_rows)
    assert [(r.kind, r.error_code) for r in rows] == [("approved", ""), ("completed", "CANCELLED")]
    assert rows[0].request_id == rows[1].request_id


def test_a_call_continues_the_agents_trace_and_its_rows_carry_the_trace_id(gateway, world):
    mark = audit_mark()
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"

    async def scenario():
        async with sdk_client(gateway.url, world.key, "2026-07-28") as client:
            await client.call_tool(
                "demo__add", {"a": 1, "b": 1}, meta={"traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"}
            )
            await client.call_tool("demo__add", {"a": 2, "b": 2})

    run(scenario)
    traced, fresh = [[r for r in audit_since(mark) if r.arguments_sha256 == canonical_sha256(a)] for a in (
        {"a": 1, "b": 1}, {"a": 2, "b": 2})]  # fmt: skip
    assert [r.trace_id for r in traced] == [trace_id, trace_id]
    assert len({r.trace_id for r in fresh}) == 1 and fresh[0].trace_id not in ("", trace_id, "0" * 32)


def test_sessions_opening_and_closing_are_recorded_on_both_transports(inline_gateway, world):
    mark = audit_mark()

    async def scenario():
        async with sdk_client(inline_gateway.url, world.key, "legacy") as client:
            await client.list_tools()
        async with ws_session(inline_gateway.url, world.key):
            pass

    run(scenario)
    rows = eventually(lambda: (r := audit_since(mark, sessions=True)) and len(r) == 4 and r)
    assert [(r.transport, r.detail["action"], r.agent_name) for r in rows] == [
        ("http", "session_opened", "alice"),
        ("http", "session_closed", "alice"),
        ("ws", "session_opened", "alice"),
        ("ws", "session_closed", "alice"),
    ]
    assert rows[0].session_id == rows[1].session_id and rows[2].session_id == rows[3].session_id
    assert rows[1].detail["reason"] == "deleted by the client"


def test_a_session_the_gateway_lets_expire_is_recorded_as_closed(server_env, world, logs):
    log = logs / "gateway-short-sessions.log"
    with servers.inline_gateway_with(server_env, log, GATEWAY_SESSION_IDLE_SECONDS="1") as gateway:
        mark = audit_mark()
        headers = {"Authorization": f"Bearer {world.key}", "Accept": "application/json, text/event-stream"}
        opened = httpx2.post(f"{gateway.url}/mcp", json=INITIALIZE, headers=headers, timeout=5)
        session_id = opened.headers["mcp-session-id"]  # and then the client goes quiet, without a DELETE
        rows = eventually(lambda: (r := audit_since(mark, sessions=True)) and len(r) == 2 and r)
    assert [(r.session_id, r.detail["action"]) for r in rows] == [
        (session_id, "session_opened"), (session_id, "session_closed")
    ]  # fmt: skip
    assert rows[1].detail["reason"] == "expired (idle)"


def test_the_upstream_receives_the_calls_trace_in_its_meta(gateway, world):
    mark = audit_mark()
    result = eventually(lambda: (r := run(lambda: call(gateway.url, world.key, "demo__trace"))) and not
                        isinstance(r, MCPError) and r)  # fmt: skip
    version, trace_id, span_id, flags = result.content[0].text.split("-")
    [completed] = [r for r in audit_since(mark) if r.kind == "completed" and r.tool == "trace"]
    assert (version, trace_id, len(span_id)) == ("00", completed.trace_id, 16) and int(flags, 16) & 1  # sampled


def test_a_calls_rows_carry_the_team_of_the_agent_that_called(inline_gateway, world):
    """By value, under seal version 4: the approval, the completion and the session's rows."""
    team = Team.objects.create(slug="payments", name="Payments")
    Upstream.objects.get(slug="demo").shared_with.add(team)  # the default team's, lent; the share goes with the team
    try:
        with agent("penny", team=team) as (_, key):
            eventually(lambda: "demo__echo" in run(lambda: tool_names(inline_gateway.url, key)))
            mark = audit_mark()
            run(lambda: call(inline_gateway.url, key, "demo__echo", {"text": "hi"}))
            rows = [r for r in audit_since(mark, sessions=True) if r.agent_name == "penny"]
    finally:
        team.delete()
    kinds = [(r.kind, r.detail.get("action", "")) for r in rows]
    assert kinds == [("session", "session_opened"), ("approved", ""), ("completed", ""), ("session", "session_closed")]
    assert {(r.team, r.seal) for r in rows} == {("payments", SEAL_SERVERS)}


def test_an_outcome_the_sweep_writes_carries_its_approvals_team(db):
    """An approval from before teams is the default team's, and so is the outcome-unknown row written for it."""
    detail = {"deadline_seconds": 1.0}
    new = audit_record(kind="approved", request_id=uuid.uuid4(), tool="stalled", team="payments", detail=detail)
    old = audit_record(kind="approved", request_id=uuid.uuid4(), tool="stalled", seal=0, detail=detail)
    outcomes_settle(now=new.created_at + timedelta(minutes=10))
    settled = AuditEvent.objects.filter(kind="completed", request_id__in=[new.request_id, old.request_id])
    assert {r.request_id: (r.outcome, r.team, r.seal) for r in settled} == {
        new.request_id: ("unknown", "payments", SEAL_SERVERS),
        old.request_id: ("unknown", "default", SEAL_SERVERS),
    }
