"""tools/list and tools/call: a call is routed (a handoff move, code mode, or an upstream's tool), decided,
audited and executed (call_path.py). The SDK server (server.py) calls these handlers for every transport."""

import json
import logging
import time
import uuid
from collections.abc import Awaitable
from typing import Any

import anyio
from django.conf import settings
from django.db import Error as DatabaseError
from mcp import types
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from audit.telemetry import DENIALS, log_fields_add, span_failed, trace_id_of
from gateway_project.lib.database import database_async
from handoff.codemode.run import code_detail, execute, tools_search
from handoff.codemode.tools import EXECUTE
from handoff.mcp.agent_relay import AgentRelay
from handoff.mcp.audit_rows import record
from handoff.mcp.call_path import (
    Decision,
    admit,
    approval,
    conclude,
    decide,
    denial_error,
    denial_record,
    error_result,
    error_text,
    for_model,
    key_denial,
    request_audit,
    route_execute,
    run_admitted,
    timed,
)
from handoff.mcp.caller import Caller, caller_of, request_span
from handoff.mcp.input_required import (
    InvalidRequestState,
    ParkedCall,
    UndeclaredAsk,
    park,
    parked_call,
    passed_through,
    responses_of,
    state_load,
)
from handoff.mcp.paging import list_page
from handoff.mcp.personal_access import CONNECT_AGAIN, CONNECT_ROUND, CONNECTED, connect_ask, connect_refusal
from handoff.protocol.moves import (
    HANDOFF_FAILED,
    connecting,
    handoff_activate,
    handoff_return,
    return_tool_name,
    tunnel_gone,
)
from handoff.protocol.tunnels import SessionStateUnavailable, SessionTunnel, index_session, session_index, tunnel_touch
from handoff.session_limit import STATE_UNAVAILABLE
from handoff.snapshot import Route, Snapshot, snapshot
from policy.decisions import INVALID_PARAMS, RETRY_LATER, Denial, ToolRefused
from policy.limits.stores import limit_store
from policy.redaction import redact
from registry.upstreams.outcome import MISSING_CLIENT_CAPABILITY, TUNNEL_GONE, Outcome, failure
from registry.upstreams.relay import LOGGING, Relay

logger = logging.getLogger(__name__)
# What a gateway tool's deadline is reckoned from: the longest it waits, for an execution or a specialist.
GATEWAY_TOOL_TIMEOUT = max(settings.GATEWAY_SANDBOX_TIMEOUT, settings.GATEWAY_HANDOFF_CONNECT_TIMEOUT)
AFTER_EXECUTE_FAILED = (
    "The gateway failed after the service answered: this call ran, but its result is withheld. "
    "Check before repeating it."
)


def finish(ctx: ServerRequestContext, result: dict[str, Any]) -> dict[str, Any]:
    """The SDK fills cache hints and validates, but a plain-dict result must carry its own 2026 `resultType`."""
    if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
        return {"resultType": "complete"} | result  # an input-required result keeps its own
    return result


async def _decide_tunnelled(
    snap: Snapshot, caller: Caller, tunnel: SessionTunnel, name: str, request_id: str
) -> Decision:
    """During a handoff only the specialist's tools exist: anything else is refused, never routed elsewhere."""
    if not tunnel.is_open:
        return Decision(tunnel.upstream_slug, denial=connecting())
    sep = settings.GATEWAY_TOOL_SEPARATOR
    tool, target = tunnel.tools.get(name), snap.targets.get(tunnel.upstream_slug)
    if tool is None or target is None:
        if name.startswith(f"{tunnel.domain}{sep}"):
            message = f"Unknown tool: {name!r}. Call tools/list for the {tunnel.domain} specialist's tools."
            return Decision(tunnel.upstream_slug, denial=Denial("TOOL_NOT_FOUND", message, INVALID_PARAMS))
        message = (
            f"This session is handed off to {tunnel.domain!r}: only its tools ({tunnel.domain}{sep}*) and "
            f"{return_tool_name()} can be called now. Call {return_tool_name()} first to use {name!r}."
        )
        return Decision(tunnel.upstream_slug, denial=Denial("HANDOFF_NAMESPACE_MISMATCH", message, INVALID_PARAMS))
    if denial := snap.permits(caller.who, target, name, tool):
        return Decision(tunnel.upstream_slug, denial=denial)
    route = Route(target.id, target.slug, target.revision, target.timeout, tool, target.limits)
    return await admit(snap, caller, name, route, request_id, tunnel=tunnel)


async def _route(
    ctx: ServerRequestContext,
    snap: Snapshot,
    caller: Caller,
    tunnel: SessionTunnel | None,
    name: str,
    arguments: dict[str, Any],
    request_id: uuid.UUID,
    trace_id: str,
) -> Decision | dict[str, Any]:
    """Where the call goes: a handoff move (run here, its result returned), or a decision on a tool."""
    if denial := key_denial(caller, name):
        return Decision("", denial=denial)
    if tunnel is not None:
        if name == return_tool_name():
            move = handoff_return(ctx, caller, snap, tunnel, arguments)
            return await _gateway_tool(caller, name, request_id, trace_id, arguments, _completed(move))
        return await _decide_tunnelled(snap, caller, tunnel, name, str(request_id))
    if triage := snap.triage.get(name):
        if denial := snap.gateway_denial(caller.who, name):
            return Decision(settings.GATEWAY_NAME, denial=denial)
        move = handoff_activate(ctx, caller, snap, triage, arguments)
        return await _gateway_tool(caller, name, request_id, trace_id, arguments, _completed(move))
    if builtin := snap.builtins.get(name):
        if denial := snap.gateway_denial(caller.who, name):
            return Decision(settings.GATEWAY_NAME, denial=denial)
        decision = await admit(snap, caller, name, builtin.route, str(request_id))
        if decision.denial:
            return decision
        try:
            if builtin.policy_target.tool == EXECUTE:
                run = execute(caller, arguments, request_id, trace_id)
                return await _gateway_tool(caller, name, request_id, trace_id, arguments, run, code_detail(arguments))
            found = tools_search(snap, caller, arguments)
            return await _gateway_tool(caller, name, request_id, trace_id, arguments, _completed(found))
        finally:
            with anyio.CancelScope(shield=True):
                await limit_store().release(decision.admission, "none", False)
    return await decide(snap, caller, name, str(request_id))


def _state_unavailable(name: str) -> Denial:
    return Denial(
        STATE_UNAVAILABLE,
        f"The gateway cannot read this session's state right now, so {name!r} was not run. Retry after 1 second.",
        RETRY_LATER,
        1.0,
    )


async def _session_tunnel(caller: Caller) -> SessionTunnel | None:
    return await session_index().get(index_session(caller.agent_id, caller.session_key))


async def call_tool(ctx: ServerRequestContext, params: types.CallToolRequestParams) -> Any:
    with request_span(ctx, "tools/call", tool=params.name) as span:
        trace_id, caller, relay = trace_id_of(span), caller_of(ctx), AgentRelay(ctx)
        log_fields_add(trace_id=trace_id, agent=caller.agent_name, tool=params.name)
        if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            return await _call_tool(ctx, params, trace_id, relay)
        # A 2026-07-28 agent: what an upstream asks comes back as input-required results (input_required.py).
        entry = (await snapshot.get()).tools.get(params.name)
        upstream = entry.route.upstream_slug if entry else ""
        # Answers the agent sends unasked go to the upstream too (it may know what to do with them).
        rounds: dict[str, Any] = {"inputResponses": responses_of(params)} if params.input_responses else {}
        if params.request_state is not None:  # it answers what an upstream asked
            arguments = params.arguments or {}
            state = await request_state_verified(
                caller, params.name, upstream, params.request_state, arguments, trace_id
            )
            if "c" in state:
                parked = parked_call(state, params.name)
                parked.answer(responses_of(params))
                return await parked.respond(ctx)
            # After connecting an account the call runs afresh; else the answers go to the upstream that asked.
            fresh = state.get("k") == CONNECT_ROUND
            rounds = {} if fresh else {"requestState": state.get("s"), "inputResponses": responses_of(params)}
        if not relay.capabilities - {LOGGING}:  # nothing it could be asked: no need to park
            return await _call_tool(ctx, params, trace_id, relay, rounds)

        def run(parked: ParkedCall) -> Awaitable[dict[str, Any]]:
            return _call_tool(ctx, params, trace_id, parked, rounds)

        return await park(ctx, caller, params.name, upstream, relay.capabilities, run)


async def request_state_verified(
    caller: Caller, name: str, upstream: str, request_state: str, arguments: dict[str, Any], trace_id: str = ""
) -> dict[str, Any]:
    """A retry's verified requestState; a forged, foreign or expired one is refused, audited and logged."""
    started = time.perf_counter()
    try:
        return state_load(caller, name, upstream, request_state)
    except InvalidRequestState as refused:
        DENIALS.labels("INVALID_REQUEST_STATE").inc()
        request_id = uuid.uuid4()
        log_fields_add(request_id=str(request_id))
        audit = request_audit(caller, name, request_id, arguments, upstream, "", trace_id)
        message = refused.error.message
        await record(kind="denied", outcome="denied", error_code="INVALID_REQUEST_STATE", error_detail=message, **audit)
        call_logged(name, "denied", "INVALID_REQUEST_STATE", (time.perf_counter() - started) * 1000)
        raise


async def _call_tool(
    ctx: ServerRequestContext,
    params: types.CallToolRequestParams,
    trace_id: str,
    relay: Relay,
    rounds: dict[str, Any] | None = None,
) -> dict[str, Any]:
    started = time.perf_counter()
    caller = caller_of(ctx)
    arguments = params.arguments or {}
    request_id = uuid.uuid4()
    snap = await snapshot.get()
    try:
        tunnel = await _session_tunnel(caller)
    except SessionStateUnavailable:
        logger.exception("session state unavailable")
        tunnel, decision = None, Decision("", denial=_state_unavailable(params.name))
    else:
        decision = await _route(ctx, snap, caller, tunnel, params.name, arguments, request_id, trace_id)
    if isinstance(decision, dict):  # a handoff move, audited on its own
        return finish(ctx, decision)
    route, denial, admission = decision.route, decision.denial, decision.admission
    tool = route.tool if route else ""
    log_fields_add(request_id=str(request_id), upstream=decision.upstream)
    audit = request_audit(caller, params.name, request_id, arguments, decision.upstream, tool, trace_id)
    if tunnel is not None:
        audit["detail"] = {"domain": tunnel.domain, "tunnel_id": tunnel.tunnel_id, "token_id": tunnel.token_id}
    if denial:
        await denial_record(denial, audit, arguments)
        call_logged(params.name, "denied", denial.code, (time.perf_counter() - started) * 1000)
        if not denial.connect_url:
            raise denial_error(denial, audit)
        asked = connect_ask(ctx, caller, params.name, decision.upstream, denial, str(request_id))
        if isinstance(asked, MCPError):
            raise asked
        return finish(ctx, asked.model_dump(mode="json", by_alias=True, exclude_none=True))
    assert route is not None and admission is not None

    def run() -> Awaitable[Outcome]:
        return route_execute(route, arguments, decision.tunnel, relay, rounds, decision.credential)

    outcome, duration_ms = await run_admitted(decision, audit, arguments, run)
    touched = [_touch(decision.tunnel.tunnel_id)] if decision.tunnel else []
    try:
        result = for_model(params.name, outcome)
        if result.get("resultType") == "input_required":
            try:
                result = passed_through(caller, params.name, decision.upstream, result, relay.capabilities)
            except UndeclaredAsk as undeclared:  # the model reads why the call ended
                result = error_result(undeclared.error.message)
    except Exception as exc:  # the call ran: it gets its completion row all the same, and the agent an error
        logger.exception("request %s: failed after the upstream answered", request_id)
        outcome, result = failure("GATEWAY_ERROR", AFTER_EXECUTE_FAILED, repr(exc)), error_result(AFTER_EXECUTE_FAILED)
        call_logged(params.name, *await conclude(decision, audit, outcome, result, duration_ms, *touched), duration_ms)
        raise MCPError(
            types.INTERNAL_ERROR, AFTER_EXECUTE_FAILED, {"code": "GATEWAY_ERROR", "requestId": str(request_id)}
        ) from None
    call_logged(params.name, *await conclude(decision, audit, outcome, result, duration_ms, *touched), duration_ms)
    if decision.tunnel and outcome.get("code") == TUNNEL_GONE:
        await tunnel_gone(caller, decision.tunnel, TUNNEL_GONE)
        message = (
            f"The {decision.tunnel.domain} specialist's connection was lost, so the handoff has ended and your "
            "own tools are restored (call tools/list). The call may not have run."
        )
        raise MCPError(HANDOFF_FAILED, message, {"code": TUNNEL_GONE, "requestId": str(request_id)})
    if route.per_person in CONNECTED and (code := outcome.get("code", "")) in CONNECT_AGAIN:  # unusable after all
        asked = connect_ask(
            ctx,
            caller,
            params.name,
            decision.upstream,
            connect_refusal(code, caller, route, params.name),
            str(request_id),
        )
        if isinstance(asked, MCPError):
            raise asked
        return finish(ctx, asked.model_dump(mode="json", by_alias=True, exclude_none=True))
    if outcome.get("rpc_code") == MISSING_CLIENT_CAPABILITY:  # the agent's client, not its model, must act
        raise MCPError(MISSING_CLIENT_CAPABILITY, redact(outcome["message"]), outcome.get("rpc_data"))
    return finish(ctx, result)


def call_logged(name: str, outcome: str, code: str, duration_ms: float) -> None:
    """One line for a tools/call, with the outcome and code its audit row holds, as fields of their own (the
    JSON format writes them) and in the message (for the text one)."""
    fields = {"outcome": outcome, "code": code, "duration_ms": round(duration_ms, 3)}
    logger.info("tools/call %s: %s in %.0f ms", name, f"{outcome} {code}".strip(), duration_ms, extra=fields)


async def _touch(tunnel_id: str) -> None:
    """Note the tunnel's use. Only its idle time depends on it: a database that cannot take it now costs
    the call nothing."""
    try:
        await database_async(tunnel_touch)(tunnel_id)
    except DatabaseError:
        logger.exception("tunnel %s: its last use could not be noted", tunnel_id)


async def _completed(move: Awaitable[dict[str, Any]]) -> Outcome:
    """A handoff move's or search's outcome; one whose state the database could not take is a failure the
    model reads (and the audit records), not an internal error."""
    try:
        return {"ok": True, "result": await move}
    except DatabaseError as exc:
        logger.exception("gateway tool failed on the database")
        message = "The gateway could not reach its database just now, so this may not have taken effect. Retry shortly."
        return failure("STATE_UNAVAILABLE", message, repr(exc))


async def _gateway_tool(
    caller: Caller,
    name: str,
    request_id: uuid.UUID,
    trace_id: str,
    arguments: dict[str, Any],
    move: Awaitable[Outcome],
    detail: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A gateway tool (handoff moves, code mode) under the same audit as any call: approved, then
    completed. A refusal is a JSON-RPC error; a failed outcome, an error result the model reads."""
    audit = request_audit(caller, name, request_id, arguments, settings.GATEWAY_NAME, name, trace_id)
    if detail:
        audit["detail"] = detail
    await record(kind="approved", **approval(audit, arguments, GATEWAY_TOOL_TIMEOUT))
    started = time.perf_counter()
    try:
        outcome, duration_ms = await timed(lambda: move, audit)
    except ToolRefused as refusal:
        denial = refusal.denial
        duration_ms = (time.perf_counter() - started) * 1000
        await record(
            kind="completed",
            outcome="error",
            error_code=denial.code,
            error_detail=denial.message,
            duration_ms=duration_ms,
            **audit,
        )
        call_logged(name, "error", denial.code, duration_ms)
        raise denial_error(denial, audit) from None
    result = for_model(name, outcome)
    if not outcome["ok"]:
        span_failed(outcome["code"], error_text(result))
    status, code = "ok" if outcome["ok"] else "error", outcome.get("code", "")
    await record(
        kind="completed",
        outcome=status,
        error_code=code,
        error_detail=outcome.get("detail", ""),
        duration_ms=duration_ms,
        response_bytes=len(json.dumps(result)),
        **audit,
    )
    call_logged(name, status, code, duration_ms)
    return result


async def list_tools(ctx: ServerRequestContext, params: types.PaginatedRequestParams | None) -> dict[str, Any]:
    with request_span(ctx, "tools/list"):
        return await _list_tools(ctx, params)


async def _list_tools(ctx: ServerRequestContext, params: types.PaginatedRequestParams | None) -> dict[str, Any]:
    caller = caller_of(ctx)
    try:
        tunnel = await _session_tunnel(caller)
    except SessionStateUnavailable:
        denial = _state_unavailable("tools/list")
        raise MCPError(denial.jsonrpc_code, denial.message, denial.data()) from None
    if tunnel is not None and tunnel.is_open:
        tools: list[Any] | tuple[Any, ...] = tunnel.definitions
    else:
        tools = [tool for tool in (await snapshot.get()).visible_for(caller.who) if caller.may_call(tool["name"])]
    page, following = list_page("tools/list", tools, params.cursor if params else None)
    return finish(ctx, {"tools": page} | ({"nextCursor": following} if following else {}))
