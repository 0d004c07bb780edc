"""The transport-free MCP layer: one SDK `Server` whose handlers route, decide, audit and execute.
Every transport (Streamable HTTP in both eras, WebSocket) feeds this same server."""

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

import anyio
from django.conf import settings
from mcp import types
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from audit.services import canonical_sha256
from audit.telemetry import DENIALS, call_observe, call_span, current_traceparent, trace_id_of
from handoff.caller import Caller, caller_of
from handoff.cursors import list_page
from handoff.db import database_async
from handoff.handoffs import (
    HANDOFF_FAILED,
    HandoffRefused,
    connecting,
    handoff_activate,
    handoff_return,
    return_tool_name,
    tunnel_gone,
)
from handoff.parking import (
    InvalidRequestState,
    ParkedCall,
    UndeclaredAsk,
    park,
    parked_call,
    passed_through,
    responses_of,
    state_load,
)
from handoff.recording import record
from handoff.relaying import AgentRelay
from handoff.snapshot import Route, Snapshot, snapshot
from handoff.tunnels import SessionStateUnavailable, SessionTunnel, index_session, session_index, tunnel_touch
from policy.decisions import INVALID_PARAMS, RETRY_LATER, Denial
from policy.limits import Admission, health_of, limit_store, limits_denial
from policy.redaction import redact, redact_error_result
from registry.executor import get_executor
from registry.pool import MISSING_CLIENT_CAPABILITY, TUNNEL_GONE, Outcome, failure
from registry.relay import LOGGING, Relay

logger = logging.getLogger(__name__)

CANCELLED = "cancelled before the upstream answered"


async def _execute(
    route: Route, arguments: dict[str, Any], tunnel: SessionTunnel | None, relay: Relay, rounds: dict[str, Any] | None
) -> Outcome:
    """The executor's outcome; if it fails in a way it did not foresee, an outcome all the same, so that
    every approved call gets its completion row."""
    executor = get_executor()
    try:
        if tunnel is not None:
            return await executor.tunnel_call(
                tunnel_id=tunnel.tunnel_id,
                queue=tunnel.queue,
                tool=route.tool,
                arguments=arguments,
                timeout=route.timeout,
            )
        return await executor.call_tool(
            upstream_id=route.upstream_id,
            revision=route.revision,
            tool=route.tool,
            arguments=arguments,
            timeout=route.timeout,
            traceparent=current_traceparent(),
            relay=relay,
            rounds=rounds,
        )
    except Exception as exc:
        logger.exception("executor failed on %s/%s", route.upstream_slug, route.tool)
        return failure(
            "GATEWAY_ERROR", "The gateway failed while running this call; it may or may not have run.", repr(exc)
        )


def finish(ctx: ServerRequestContext, result: dict[str, Any]) -> dict[str, Any]:
    """The SDK fills cache hints and validates, but a plain-dict result must carry its own 2026 `resultType`."""
    if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
        return {"resultType": "complete"} | result  # an input-required result keeps its own
    return result


def _for_model(name: str, outcome: Outcome) -> dict[str, Any]:
    """What the model sees: results as the upstream sent them, errors redacted (the audit has them whole)."""
    if outcome["ok"]:
        result = outcome["result"]
        return redact_error_result(result) if result.get("isError") else result
    message = outcome["message"] if outcome.get("validation") else redact(outcome["message"])
    return {"content": [{"type": "text", "text": f"{name}: {message}"}], "isError": True}


def _error_text(result: dict[str, Any]) -> str:
    return "\n".join(item.get("text", "") for item in result.get("content") or [] if item.get("type") == "text")


@dataclass(frozen=True)
class Decision:
    upstream: str  # the upstream the name points at, for the audit
    route: Route | None = None
    denial: Denial | None = None
    admission: Admission | None = None  # held while the call runs; given back by release
    probing: bool = False  # this call is the half-open circuit's one probe
    tunnel: SessionTunnel | None = None  # the handoff tunnel the call goes through


async def admit(snap: Snapshot, caller: Caller, name: str, route: Route, request_id: str, **found: Any) -> Decision:
    """Admission against shared state (isolation, breaker, limits), which takes the call's share of every
    limit when it admits it."""
    session = index_session(caller.agent_id, caller.session_key)
    admission = Admission(request_id, session, caller.agent_id, snap.agents[caller.agent_id], route.limits)
    verdict = await limit_store().admit(admission)
    if verdict.code:
        return Decision(route.upstream_slug, route, limits_denial(admission, verdict, name), **found)
    return Decision(route.upstream_slug, route, admission=admission, probing=verdict.probing, **found)


async def _decide(snap: Snapshot, caller: Caller, name: str, request_id: str) -> Decision:
    """The static decision over the snapshot, then admission."""
    denial, entry, upstream = snap.decide(caller.agent_id, name)
    if denial or entry is None:
        return Decision(upstream, entry.route if entry else None, denial)
    return await admit(snap, caller, name, entry.route, request_id)


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
    if denial := snap.permits(caller.agent_id, target, name, tool):
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
    if tunnel is not None:
        if name == return_tool_name():
            move = handoff_return(ctx, caller, snap, tunnel, arguments)
            return await _gateway_tool(caller, name, request_id, trace_id, arguments, move)
        return await _decide_tunnelled(snap, caller, tunnel, name, str(request_id))
    if triage := snap.triage.get(name):
        if denial := snap.triage_denial(caller.agent_id, name):
            return Decision(settings.GATEWAY_NAME, denial=denial)
        move = handoff_activate(ctx, caller, snap, triage, arguments)
        return await _gateway_tool(caller, name, request_id, trace_id, arguments, move)
    return await _decide(snap, caller, name, str(request_id))


def _state_unavailable(name: str) -> Denial:
    return Denial(
        "SESSION_STATE_UNAVAILABLE",
        f"The gateway cannot read this session's state right now, so {name!r} was not run. Retry after 1 second.",
        RETRY_LATER,
        1.0,
    )


async def _session_tunnel(caller: Caller) -> SessionTunnel | None:
    return await session_index().get(index_session(caller.agent_id, caller.session_key))


async def call_tool(ctx: ServerRequestContext, params: types.CallToolRequestParams) -> Any:
    with call_span(params.name, params.meta) as span:
        trace_id, caller, relay = trace_id_of(span), caller_of(ctx), AgentRelay(ctx)
        if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            return await _call_tool(ctx, params, trace_id, relay)
        # A 2026-07-28 agent: what an upstream asks comes back as input-required results (parking.py).
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
            rounds = {"requestState": state.get("s"), "inputResponses": responses_of(params)}
        if not relay.capabilities - {LOGGING}:  # nothing it could be asked: no need to park
            return await _call_tool(ctx, params, trace_id, relay, rounds)

        def run(parked: ParkedCall) -> Awaitable[dict[str, Any]]:
            return _call_tool(ctx, params, trace_id, parked, rounds)

        return await park(ctx, caller, params.name, upstream, relay.capabilities, run)


async def request_state_verified(
    caller: Caller, name: str, upstream: str, request_state: str, arguments: dict[str, Any], trace_id: str = ""
) -> dict[str, Any]:
    """A retry's verified requestState; a forged, foreign or expired one is refused and audited."""
    try:
        return state_load(caller, name, upstream, request_state)
    except InvalidRequestState as refused:
        DENIALS.labels("INVALID_REQUEST_STATE").inc()
        audit = request_audit(caller, name, uuid.uuid4(), arguments, upstream, "", trace_id)
        message = refused.error.message
        await record(kind="denied", outcome="denied", error_code="INVALID_REQUEST_STATE", error_detail=message, **audit)
        raise


async def _call_tool(
    ctx: ServerRequestContext,
    params: types.CallToolRequestParams,
    trace_id: str,
    relay: Relay,
    rounds: dict[str, Any] | None = None,
) -> dict[str, Any]:
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
    audit = request_audit(caller, params.name, request_id, arguments, decision.upstream, tool, trace_id)
    if tunnel is not None:
        audit["detail"] = {"domain": tunnel.domain, "tunnel_id": tunnel.tunnel_id, "token_id": tunnel.token_id}
    if denial:
        DENIALS.labels(denial.code).inc()
        await record(
            kind="denied",
            outcome="denied",
            error_code=denial.code,
            error_detail=denial.message,
            **with_payload(audit, arguments),
        )
        raise MCPError(denial.jsonrpc_code, denial.message, denial.data() | {"requestId": str(request_id)})
    assert route is not None and admission is not None
    try:
        await record(kind="approved", **with_payload(audit, arguments))  # before the upstream is touched
        outcome, duration_ms = await _run(route, arguments, audit, decision.tunnel, relay, rounds)
    except BaseException:  # audit refused, or the client left: the admission goes back all the same
        with anyio.CancelScope(shield=True):
            await limit_store().release(admission, "none", decision.probing)
        raise
    result = _for_model(params.name, outcome)
    if result.get("resultType") == "input_required":
        try:
            result = passed_through(caller, params.name, decision.upstream, result, relay.capabilities)
        except UndeclaredAsk as undeclared:  # the model reads why the call ended
            result = {"content": [{"type": "text", "text": undeclared.error.message}], "isError": True}
    failed = not outcome["ok"] or bool(result.get("isError"))
    status = ("timeout" if outcome.get("code") == "UPSTREAM_TIMEOUT" else "error") if failed else "ok"
    call_observe(upstream=decision.upstream, outcome=status, duration_ms=duration_ms)
    completion = record(
        kind="completed",
        duration_ms=duration_ms,
        response_bytes=len(json.dumps(result)),
        outcome=status,
        error_code=outcome.get("code", "TOOL_ERROR" if failed else ""),
        error_detail=outcome.get("detail") or (_error_text(outcome["result"]) if failed else ""),
        **audit,
    )
    release = limit_store().release(admission, health_of(outcome.get("code")), decision.probing)
    writes = [completion, release]
    if decision.tunnel:
        writes.append(database_async(tunnel_touch)(decision.tunnel.tunnel_id))
    # Independent writes, so none waits for another; shielded, so a client that leaves now loses none.
    with anyio.CancelScope(shield=True):
        await asyncio.gather(*writes)
    if decision.tunnel and outcome.get("code") == TUNNEL_GONE:
        await tunnel_gone(caller, decision.tunnel, TUNNEL_GONE)
        message = (
            f"The {decision.tunnel.domain} specialist's connection was lost, so the handoff has ended and your "
            "own tools are restored (call tools/list). The call may not have run."
        )
        raise MCPError(HANDOFF_FAILED, message, {"code": TUNNEL_GONE, "requestId": str(request_id)})
    if outcome.get("rpc_code") == MISSING_CLIENT_CAPABILITY:  # the agent's client, not its model, must act
        raise MCPError(MISSING_CLIENT_CAPABILITY, redact(outcome["message"]), outcome.get("rpc_data"))
    return finish(ctx, result)


def request_audit(
    caller: Caller,
    name: str,
    request_id: uuid.UUID,
    arguments: dict[str, Any],
    upstream: str,
    tool: str,
    trace_id: str,
) -> dict[str, Any]:
    return {
        "request_id": request_id,
        "trace_id": trace_id,
        "agent_id": caller.agent_id,
        "agent_name": caller.agent_name,
        "session_id": caller.session_id,
        "transport": caller.transport,
        "exposed_name": name,
        "arguments_sha256": canonical_sha256(arguments),
        "upstream": upstream,
        "tool": tool,
    }


def with_payload(audit: dict[str, Any], arguments: dict[str, Any]) -> dict[str, Any]:
    """The fields of a decision row, holding the arguments themselves where the operator keeps payloads."""
    if not settings.GATEWAY_AUDIT_PAYLOADS:
        return audit
    return audit | {"detail": audit.get("detail", {}) | {"arguments": arguments}}


async def _gateway_tool(
    caller: Caller,
    name: str,
    request_id: uuid.UUID,
    trace_id: str,
    arguments: dict[str, Any],
    move: Awaitable[dict[str, Any]],
) -> dict[str, Any]:
    """A handoff move (triage, return) under the same audit as any call: approved, then completed."""
    audit = request_audit(caller, name, request_id, arguments, settings.GATEWAY_NAME, name, trace_id)
    await record(kind="approved", **with_payload(audit, arguments))
    started = time.perf_counter()
    try:
        result = await move
    except HandoffRefused as refusal:
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
        raise MCPError(denial.jsonrpc_code, denial.message, denial.data() | {"requestId": str(request_id)}) from None
    duration_ms = (time.perf_counter() - started) * 1000
    await record(
        kind="completed", outcome="ok", duration_ms=duration_ms, response_bytes=len(json.dumps(result)), **audit
    )
    return result


async def _run(
    route: Route,
    arguments: dict[str, Any],
    audit: dict[str, Any],
    tunnel: SessionTunnel | None,
    relay: Relay,
    rounds: dict[str, Any] | None,
) -> tuple[Outcome, float]:
    """The outcome and its duration; a cancelled call (the client left) gets its completion row all the same."""
    started = time.perf_counter()
    try:
        outcome = await _execute(route, arguments, tunnel, relay, rounds)
    except anyio.get_cancelled_exc_class():
        with anyio.CancelScope(shield=True):
            await record(
                kind="completed",
                outcome="error",
                error_code="CANCELLED",
                error_detail=CANCELLED,
                duration_ms=(time.perf_counter() - started) * 1000,
                **audit,
            )
        raise
    return outcome, (time.perf_counter() - started) * 1000


async def list_tools(ctx: ServerRequestContext, params: types.PaginatedRequestParams | None) -> dict[str, Any]:
    caller = caller_of(ctx)
    try:
        tunnel = await _session_tunnel(caller)
    except SessionStateUnavailable:
        denial = _state_unavailable("tools/list")
        raise MCPError(denial.jsonrpc_code, denial.message, denial.data()) from None
    if tunnel is not None and tunnel.is_open:
        tools: list[Any] | tuple[Any, ...] = tunnel.definitions
    else:
        tools = (await snapshot.get()).visible_for(caller.agent_id)
    page, following = list_page("tools/list", tools, params.cursor if params else None)
    return finish(ctx, {"tools": page} | ({"nextCursor": following} if following else {}))
