"""The transport-free MCP layer: one SDK `Server` whose handlers route, decide, audit and execute.
Every transport (Streamable HTTP in both eras, WebSocket) feeds this same server."""

import json
import logging
import time
import uuid
from dataclasses import replace
from typing import Any

import anyio
from django.conf import settings
from mcp import types
from mcp.server import Server
from mcp.server.caching import CacheHint
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from audit.services import canonical_sha256
from audit.writer import AuditUnavailable, audit_writer
from handoff.caller import Caller
from handoff.snapshot import Route, Snapshot, snapshot
from policy.decisions import Denial, Target, policy_decide
from registry.executor import get_executor
from registry.naming import split_exposed_name
from registry.pool import Outcome, failure

logger = logging.getLogger(__name__)
AUDIT_UNAVAILABLE = -32002

INSTRUCTIONS = (
    "This is a gateway to several services. Tool names are '<service>{sep}<tool>'; "
    "call tools/list to see what you may use."
)


def caller_of(ctx: ServerRequestContext) -> Caller:
    """The caller the transport attached: a Caller itself (WebSocket) or on the HTTP request's scope."""
    request = ctx.request
    if isinstance(request, Caller):
        return request
    caller: Caller = request.scope["switchboard.caller"]
    session_id = request.headers.get("mcp-session-id")
    return replace(caller, session_id=session_id) if session_id else caller


def _plan(snap: Snapshot, caller: Caller, name: str) -> tuple[Denial | None, Route | None, str]:
    """The decision, the route when there is one, and the upstream the name points at (for the audit)."""
    entry = snap.tool_for(name)
    if entry:
        target = Target(name, entry.route.upstream_slug, entry.reachable, True)
    else:
        parts = split_exposed_name(name)
        slug = parts[0] if parts and parts[0] in snap.upstreams else None
        target = Target(name, slug, snap.upstreams.get(slug or "", False), False)
    denial = policy_decide(agent_enabled=caller.agent_id in snap.enabled_agents, target=target)
    return denial, entry.route if entry else None, target.upstream_slug or ""


async def _execute(route: Route, arguments: dict[str, Any]) -> Outcome:
    """The executor's outcome; if it fails in a way it did not foresee, an outcome all the same, so that
    every approved call gets its completion row."""
    try:
        return await get_executor().call_tool(
            upstream_id=route.upstream_id,
            revision=route.revision,
            tool=route.tool,
            arguments=arguments,
            timeout=route.timeout,
        )
    except Exception as exc:
        logger.exception("executor failed on %s/%s", route.upstream_slug, route.tool)
        return failure(
            "GATEWAY_ERROR", "The gateway failed while running this call; it may or may not have run.", repr(exc)
        )


async def _record(*, kind: str, **fields: Any) -> None:
    """Write the row or refuse to go on: a call never runs, nor is its result shown, unrecorded."""
    try:
        await audit_writer.record(kind=kind, **fields)
    except AuditUnavailable as exc:
        logger.error("audit write failed (%s row, request %s): %s", kind, fields.get("request_id"), exc)
        ran = "ran, but its result is withheld" if kind == "completed" else "was not run"
        message = f"The gateway could not record this call, so it {ran}. Try again shortly."
        raise MCPError(AUDIT_UNAVAILABLE, message, {"code": "AUDIT_UNAVAILABLE"}) from exc


def _finish(ctx: ServerRequestContext, result: dict[str, Any]) -> dict[str, Any]:
    """The SDK fills cache hints and validates, but a plain-dict result must carry its own 2026 `resultType`."""
    if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
        return result | {"resultType": "complete"}
    return result


def _error_result(name: str, outcome: Outcome) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": f"{name}: {outcome['message']}"}], "isError": True}


async def call_tool(ctx: ServerRequestContext, params: types.CallToolRequestParams) -> dict[str, Any]:
    caller = caller_of(ctx)
    arguments = params.arguments or {}
    audit = {
        "request_id": uuid.uuid4(),
        "agent_id": caller.agent_id,
        "agent_name": caller.agent_name,
        "session_id": caller.session_id,
        "transport": caller.transport,
        "exposed_name": params.name,
        "arguments_sha256": canonical_sha256(arguments),
    }
    denial, route, upstream = _plan(await snapshot.get(), caller, params.name)
    audit.update(upstream=upstream, tool=route.tool if route else "")
    if denial:
        await _record(kind="denied", outcome="denied", error_code=denial.code, error_detail=denial.message, **audit)
        data = {"code": denial.code, "requestId": str(audit["request_id"])}
        raise MCPError(denial.jsonrpc_code, denial.message, data)
    assert route is not None
    await _record(kind="approved", **audit)  # before the upstream is touched
    started = time.perf_counter()
    try:
        outcome = await _execute(route, arguments)
    except anyio.get_cancelled_exc_class():  # the client left or cancelled: the call's end is recorded all the same
        with anyio.CancelScope(shield=True):
            await _record(
                kind="completed",
                outcome="error",
                error_code="CANCELLED",
                error_detail="cancelled before the upstream answered",
                duration_ms=(time.perf_counter() - started) * 1000,
                **audit,
            )
        raise
    duration_ms = (time.perf_counter() - started) * 1000
    result = outcome["result"] if outcome["ok"] else _error_result(params.name, outcome)
    failed = not outcome["ok"] or bool(result.get("isError"))
    await _record(
        kind="completed",
        duration_ms=duration_ms,
        response_bytes=len(json.dumps(result)),
        outcome=("timeout" if outcome.get("code") == "UPSTREAM_TIMEOUT" else "error") if failed else "ok",
        error_code=outcome.get("code", "TOOL_ERROR" if failed else ""),
        error_detail=outcome.get("detail", ""),
        **audit,
    )
    return _finish(ctx, result)


async def list_tools(ctx: ServerRequestContext, params: types.PaginatedRequestParams | None) -> dict[str, Any]:
    caller_of(ctx)  # every request carries an authenticated caller; fail loudly if a transport forgot
    return _finish(ctx, {"tools": list((await snapshot.get()).visible)})


def build_server() -> Server:
    return Server(
        settings.GATEWAY_NAME,
        version="0.1.0",
        instructions=INSTRUCTIONS.format(sep=settings.GATEWAY_TOOL_SEPARATOR),
        # Lists are filtered per agent, and an admin's change must show at once: private, never fresh.
        cache_hints={"tools/list": CacheHint(ttl_ms=0, scope="private")},
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


server = build_server()
