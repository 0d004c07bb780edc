"""Handoff end to end: real Daphne gateways (inline and Celery executor), real specialist servers guarded
by require_gateway_clearance (examples/specialist_server.py), the official SDK client in both eras."""

import json
import re

import pytest
from mcp.shared.exceptions import MCPError

from audit.models import AuditEvent
from handoff.models import Tunnel
from tests.clients import call, sdk_client, tool_names, watched_client, ws_session
from tests.factories import agent
from tests.helpers import audit_mark, audit_since, eventually, run
from tests.otlp import CALLED, REFUSED_AT_ROUTE, stages_of

MODES = ["legacy", "2026-07-28"]
TRIAGE = "switchboard__handoff_to_finance"
RETURN = "switchboard__return_to_triage"
TRACEPARENT = re.compile(r"00-[0-9a-f]{32}-[0-9a-f]{16}-01")


def text(result) -> str:
    return result.content[0].text


@pytest.mark.parametrize("mode", MODES)
def test_triage_hands_off_to_a_specialist_and_return_restores_the_tools(gateway, specialists, mode, traces):
    with agent(f"traveller-{mode}") as (_, key):
        eventually(lambda: TRIAGE in run(lambda: tool_names(gateway.url, key, mode)), timeout=10)
        mark = audit_mark()

        async def scenario():
            # Told that the list may change: in the handshake (2025-11-25), or in server/discover (2026-07-28).
            async with sdk_client(gateway.url, key, "legacy" if mode == "legacy" else "auto") as probe:
                assert probe.protocol_version == ("2025-11-25" if mode == "legacy" else "2026-07-28")
                assert probe.server_capabilities.tools.list_changed
            async with watched_client(gateway.url, key, mode) as (client, changes):
                before = {t.name for t in (await client.list_tools()).tools}
                handed = await client.call_tool(TRIAGE, {"reason": "a budget question", "context": {"account": "A-1"}})
                await changes.next()
                during = {t.name: t for t in (await client.list_tools()).tools}
                context = json.loads(text(await client.call_tool("finance__handoff_context", {})))
                try:
                    await client.call_tool("time__get_current_time", {"timezone": "UTC"})
                except MCPError as refused:
                    mismatch = refused
                back = await client.call_tool(RETURN, {"note": "budget approved"})
                await changes.next()
                after = {t.name for t in (await client.list_tools()).tools}
                return before, handed, during, context, mismatch, back, after

        before, handed, during, context, mismatch, back, after = run(scenario)
        rows = audit_since(mark)
        [activated] = [r for r in rows if r.kind == "handoff" and r.detail["event"] == "activated"]
        tunnel = Tunnel.objects.get(pk=activated.detail["tunnel_id"])

    assert TRIAGE in before and "time__get_current_time" in before and "finance__ask" not in before
    assert text(handed).startswith("Handed off to the finance specialist.")
    assert set(during) == {"finance__handoff_context", "finance__ask", RETURN}
    assert during["finance__ask"].title == "[finance] ask"
    assert during["finance__ask"].description == "(finance specialist) Ask the finance specialist a question."
    assert context["state"] == {"account": "A-1"} and context["reason"] == "a budget question"
    assert context["domain"] == "finance" and TRACEPARENT.fullmatch(context["traceparent"])
    assert (mismatch.code, mismatch.data["code"]) == (-32602, "HANDOFF_NAMESPACE_MISMATCH")
    assert str(mismatch) == (
        "This session is handed off to 'finance': only its tools (finance__*) and switchboard__return_to_triage "
        "can be called now. Call switchboard__return_to_triage first to use 'time__get_current_time'."
    )
    assert '<upstream_report source="finance" trusted="false">\nfinance specialist summary: budget approved\n' in text(
        back
    )
    assert after == before

    events = [r.detail["event"] for r in rows if r.kind == "handoff"]
    assert events == ["activated", "returned"]
    token_id = activated.detail["token_id"]
    assert activated.upstream == "finance" and activated.detail["domain"] == "finance" and len(token_id) == 32
    # The specialist saw the handoff's trace (the id the audit keeps), in a span of the request's own.
    assert context["traceparent"].split("-")[1] == activated.detail["traceparent"].split("-")[1]
    assert context["traceparent"] != activated.detail["traceparent"]
    tunnelled = [r for r in rows if r.kind == "completed" and r.exposed_name == "finance__handoff_context"]
    assert [(r.upstream, r.tool, r.detail["token_id"], r.detail["domain"]) for r in tunnelled] == [
        ("finance", "handoff_context", token_id, "finance")
    ]
    assert [r.error_code for r in rows if r.kind == "denied"] == ["HANDOFF_NAMESPACE_MISMATCH"]
    assert (tunnel.state, tunnel.close_reason) == ("closed", "returned")
    # Each move and each call during the handoff is one pass through the pipeline, the tunnel a branch of execute.
    ends = {r.exposed_name: r.trace_id for r in rows if r.kind in ("completed", "denied")}
    stages = {name: stages_of(traces, trace_id) for name, trace_id in ends.items()}
    assert stages == {
        TRIAGE: {f"tools/call {TRIAGE}": CALLED},
        "finance__handoff_context": {"tools/call finance__handoff_context": CALLED},
        "time__get_current_time": {"tools/call time__get_current_time": REFUSED_AT_ROUTE},
        RETURN: {f"tools/call {RETURN}": CALLED},
    }


@pytest.mark.parametrize("mode", MODES)
def test_a_python_triage_tool_hands_off_with_state_too_large_for_the_token(gateway, specialists, mode):
    """The example triage tool routes "infrastructure" to devops; 5 KB of details go by claim check."""
    details = "disk full on db-7; " * 300
    with agent(f"operator-{mode}") as (_, key):
        eventually(lambda: "switchboard__route_by_topic" in run(lambda: tool_names(gateway.url, key, mode)), timeout=10)

        async def scenario():
            async with watched_client(gateway.url, key, mode) as (client, changes):
                await client.call_tool("switchboard__route_by_topic", {"topic": "infrastructure", "details": details})
                await changes.next()
                names = {t.name for t in (await client.list_tools()).tools}
                context = json.loads(text(await client.call_tool("devops__handoff_context", {})))
                again = json.loads(text(await client.call_tool("devops__handoff_context", {})))
                await client.call_tool(RETURN, {})
                return names, context, again

        names, context, again = run(scenario)
    assert names == {"devops__handoff_context", "devops__ask", RETURN}
    assert context["state"] == {"topic": "infrastructure", "details": details}
    assert context["reason"].endswith("asked about infrastructure")
    # Hydrated once, then kept for the delegation's life; each request is a span of its own in one trace.
    assert again | {"traceparent": ""} == context | {"traceparent": ""}
    assert again["traceparent"].split("-")[1] == context["traceparent"].split("-")[1]


def test_a_triage_tool_that_hands_nothing_off_just_answers(inline_gateway, specialists, world):
    result = run(lambda: call(inline_gateway.url, world.key, "switchboard__route_by_topic", {"topic": "weather"}))
    assert text(result) == "No specialist handles 'weather'; known topics: clock, infrastructure, money, payroll."


@pytest.mark.parametrize(
    ("topic", "code", "message"),
    [
        ("payroll", "REGISTRY_LOOKUP_FAILED", "No specialist named 'hr' is registered and enabled."),
        (
            "clock",
            "REGISTRY_INVALID_URI",
            "The specialist 'time' has no URI to hand a session to (it is not an HTTP server).",
        ),
    ],
)
def test_an_unresolvable_target_is_refused(inline_gateway, specialists, world, topic, code, message):
    mark = audit_mark()
    refused = run(lambda: call(inline_gateway.url, world.key, "switchboard__route_by_topic", {"topic": topic}))
    assert isinstance(refused, MCPError)
    assert (refused.code, refused.data["code"], str(refused)) == (-32004, code, message)
    [completed] = [r for r in audit_since(mark) if r.kind == "completed"]
    assert (completed.outcome, completed.error_code, completed.tool) == ("error", code, "switchboard__route_by_topic")
    assert not Tunnel.objects.filter(session_key__startswith="key-", state__in=Tunnel.LIVE, agent__name="alice")


def test_handoff_rows_name_the_operator_facing_events(inline_gateway, specialists):
    """Every handoff row carries the domain and the token id that the specialist saw."""
    with agent("auditor-check") as (_, key):
        eventually(lambda: TRIAGE in run(lambda: tool_names(inline_gateway.url, key)), timeout=10)
        mark = audit_mark()

        async def scenario():
            async with watched_client(inline_gateway.url, key, "legacy") as (client, _changes):
                await client.call_tool(TRIAGE, {"reason": "check"})
                seen = json.loads(text(await client.call_tool("finance__handoff_context", {})))
                await client.call_tool(RETURN, {})
                return seen

        seen = run(scenario)
    rows = [r for r in audit_since(mark) if r.kind == AuditEvent.Kind.HANDOFF]
    assert {r.detail["token_id"] for r in rows} == {seen["token_id"]}


def test_a_websocket_session_hands_off_and_is_told_its_tools_changed(inline_gateway, specialists):
    with agent("socket") as (_, key):
        eventually(lambda: TRIAGE in run(lambda: tool_names(inline_gateway.url, key)), timeout=10)

        async def scenario():
            async with ws_session(inline_gateway.url, key) as ws:
                handed, told = await _request(ws, "tools/call", {"name": TRIAGE, "arguments": {"reason": "socket"}})
                told = told or [await ws.receive()]  # the notification may follow the response
                listed, _ = await _request(ws, "tools/list")
                back, told_back = await _request(ws, "tools/call", {"name": RETURN, "arguments": {}})
                told_back = told_back or [await ws.receive()]
                return handed, told, listed, back, told_back

        handed, told, listed, back, told_back = run(scenario)
    assert handed["result"]["content"][0]["text"].startswith("Handed off to the finance specialist.")
    assert [n["method"] for n in told] == ["notifications/tools/list_changed"]
    assert {t["name"] for t in listed["result"]["tools"]} == {"finance__handoff_context", "finance__ask", RETURN}
    assert "<upstream_report" in back["result"]["content"][0]["text"]
    assert [n["method"] for n in told_back] == ["notifications/tools/list_changed"]


async def _request(ws, method: str, params: dict | None = None) -> tuple[dict, list[dict]]:
    """The response to one request, and the notifications that arrived before it."""
    await ws.ws.send(json.dumps({"jsonrpc": "2.0", "id": method + "-1", "method": method, "params": params or {}}))
    notifications = []
    while "id" not in (frame := await ws.receive()):
        notifications.append(frame)
    return frame, notifications


def test_rules_apply_to_handoffs_and_to_the_specialists_tools(inline_gateway, specialists):
    """A deny on the finance upstream's `ask` hides it during the handoff; a deny on its handoff tool hides
    the way in for another agent."""
    from policy.models import Rule
    from registry.models import Upstream

    finance = Upstream.objects.get(slug="finance")
    with agent("restricted") as (restricted, key), agent("shut-out") as (shut_out, other_key):
        rules = [
            Rule.objects.create(effect="deny", agent=restricted, upstream=finance, tool_pattern="ask"),
            Rule.objects.create(effect="deny", agent=shut_out, upstream=finance, tool_pattern="handoff_to_*"),
        ]
        try:
            eventually(lambda: TRIAGE in run(lambda: tool_names(inline_gateway.url, key)), timeout=10)
            # The gateway knows the agent (it is offered tools) and the rule (not the way in).
            eventually(
                lambda: (names := run(lambda: tool_names(inline_gateway.url, other_key))) and TRIAGE not in names
            )
            shut = run(lambda: call(inline_gateway.url, other_key, TRIAGE, {"reason": "let me in"}))

            async def scenario():
                async with sdk_client(inline_gateway.url, key, "legacy") as client:
                    await client.call_tool(TRIAGE, {"reason": "restricted"})
                    names = {t.name for t in (await client.list_tools()).tools}
                    try:
                        await client.call_tool("finance__ask", {"question": "may I?"})
                    except MCPError as refused:
                        return names, refused

            names, refused = run(scenario)
        finally:
            for rule in rules:
                rule.delete()
    assert names == {"finance__handoff_context", RETURN}
    assert (refused.code, refused.data["code"]) == (-32602, "TOOL_NOT_FOUND")
    assert isinstance(shut, MCPError) and (shut.code, shut.data["code"]) == (-32001, "POLICY_DENIED")
