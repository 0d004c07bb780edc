"""tools/list and tools/call. A call runs through the pipeline (handoff/mcp/pipeline/); the SDK server
(server.py) calls these handlers for every transport."""

from typing import Any

from mcp import types
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError

from audit.telemetry import trace_id_of
from handoff.codemode.optional import own_tools
from handoff.mcp.caller import caller_of, request_span
from handoff.mcp.list_changed import view_listed
from handoff.mcp.paging import list_page
from handoff.mcp.pipeline.answer import finish
from handoff.mcp.pipeline.frame import agent_call
from handoff.mcp.pipeline.routing import state_unavailable
from handoff.mcp.session_views import tools_listed
from handoff.mcp.task_calls import tools_marked
from handoff.protocol.tunnels import SessionStateUnavailable, index_session, session_index
from handoff.snapshot import snapshot


async def call_tool(ctx: ServerRequestContext, params: types.CallToolRequestParams) -> Any:
    with request_span(ctx, "tools/call", tool=params.name) as span:
        return await agent_call(ctx, params, trace_id_of(span), own_tools())


async def list_tools(ctx: ServerRequestContext, params: types.PaginatedRequestParams | None) -> dict[str, Any]:
    with request_span(ctx, "tools/list"):
        return await _list_tools(ctx, params)


async def _list_tools(ctx: ServerRequestContext, params: types.PaginatedRequestParams | None) -> dict[str, Any]:
    caller = caller_of(ctx)
    try:
        tunnel = await session_index().get(index_session(caller.agent_id, caller.session_key))
    except SessionStateUnavailable:
        denial = state_unavailable("tools/list")
        raise MCPError(denial.jsonrpc_code, denial.message, denial.data()) from None
    if tunnel is not None and tunnel.is_open:
        tools: list[Any] | tuple[Any, ...] = tunnel.definitions
    else:
        snap = await snapshot.get()
        view = view_listed(caller, snap)
        tools = tools_marked(ctx, snap, tools_listed(snap=snap, view=view))
    page, following = list_page("tools/list", tools, params.cursor if params else None)
    fresh = {"ttlMs": snapshot.fresh_ms()}  # private (server.py): each caller's own list
    return finish(ctx, {"tools": page} | ({"nextCursor": following} if following else {}) | fresh)
