"""The transport-free MCP layer: one SDK `Server` whose handlers route, decide, audit and execute.
Every transport (Streamable HTTP in both eras, WebSocket) feeds this same server."""

import json
import time
import uuid
from dataclasses import replace
from typing import Any

from django.conf import settings
from mcp import types
from mcp.server import Server
from mcp.server.caching import CacheHint
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from audit.services import audit_record, canonical_sha256
from handoff.caller import Caller
from handoff.db import database_async
from policy.decisions import Denial, policy_decide
from registry.executor import get_executor
from registry.pool import Outcome
from registry.selectors import Route, catalog_list_visible, tool_route

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


@database_async
def _plan_and_record(caller: Caller, name: str, audit: dict[str, Any]) -> tuple[Denial | None, Route | None]:
    """Route, decide, and write the approval or denial, in one trip to the database.
    Fills in `audit` with the upstream and tool, for the completion row that shares it."""
    target, route, agent_enabled = tool_route(name=name, agent_id=caller.agent_id)
    denial = policy_decide(agent_enabled=agent_enabled, target=target)
    audit.update(upstream=target.upstream_slug or "", tool=route.tool if route else "")
    if denial:
        audit_record(kind="denied", outcome="denied", error_code=denial.code, error_detail=denial.message, **audit)
    else:
        audit_record(kind="approved", **audit)
    return denial, route


record_async = database_async(audit_record)


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
    denial, route = await _plan_and_record(caller, params.name, audit)
    if denial:
        data = {"code": denial.code, "requestId": str(audit["request_id"])}
        raise MCPError(denial.jsonrpc_code, denial.message, data)
    assert route is not None
    started = time.perf_counter()
    outcome = await get_executor().call_tool(
        upstream_id=route.upstream_id,
        revision=route.revision,
        tool=route.tool,
        arguments=arguments,
        timeout=route.timeout,
    )
    duration_ms = (time.perf_counter() - started) * 1000
    result = outcome["result"] if outcome["ok"] else _error_result(params.name, outcome)
    failed = not outcome["ok"] or bool(result.get("isError"))
    await record_async(
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
    tools = await database_async(catalog_list_visible)()
    return _finish(ctx, {"tools": tools})


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
