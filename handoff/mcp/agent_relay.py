"""The agent's end of a relayed call (registry/upstreams/relay.py): progress and log messages go out on the call's
own stream, and an upstream's request to the client goes to the agent only if it declared the capability
for it. Log messages reach only agents that asked for them: a 2025-11-25 session that set a level with
`logging/setLevel`, a 2026-07-28 request that carries one in its `_meta`."""

from typing import Any

from mcp import types
from mcp.server.context import ServerRequestContext
from mcp.shared.jsonrpc_dispatcher import progress_token_from_params
from mcp.shared.message import ServerMessageMetadata

from handoff.mcp.caller import Caller, caller_of, legacy_agent
from handoff.mcp.list_changed import per_session, per_session_table
from handoff.protocol.tunnels import index_session
from registry.upstreams.relay import ASKS, LEGACY, LOGGING, RELAYED_CAPABILITIES, may_ask, unsupported

LOG_LEVEL_KEY = "io.modelcontextprotocol/logLevel"
LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")
# 2025-11-25 sessions that set a log level, and the level (the newest, bounded like the sessions).
_session_levels = per_session_table()


def _session(ctx: ServerRequestContext) -> str:
    caller = caller_of(ctx)
    return index_session(caller.agent_id, caller.session_key)


async def set_logging_level(ctx: ServerRequestContext, params: types.SetLevelRequestParams) -> types.EmptyResult:
    per_session(_session_levels, _session(ctx), params.level)
    return types.EmptyResult()


def session_level(caller: Caller) -> str | None:
    """The level a 2025-11-25 session set, for its record (handoff/endpoints/streamable_http/redis_sessions.py)."""
    return _session_levels.get(index_session(caller.agent_id, caller.session_key))


def session_level_restore(caller: Caller, level: str | None) -> None:
    """Take up the level a session set in another process."""
    if level in LEVELS:
        per_session(_session_levels, index_session(caller.agent_id, caller.session_key), level)


def log_level(ctx: ServerRequestContext) -> str | None:
    """The lowest level of log message the agent asked for on this request, if it asked."""
    if not legacy_agent(ctx):
        level = (ctx.meta or {}).get(LOG_LEVEL_KEY)
        return level if level in LEVELS else None
    return _session_levels.get(_session(ctx))


def declared(ctx: ServerRequestContext) -> frozenset[str]:
    """What the relay of this request's calls carries: the agent's client capabilities, logging, and LEGACY."""
    capabilities = ctx.session.client_capabilities
    names = {name for name in RELAYED_CAPABILITIES if capabilities and getattr(capabilities, name, None)}
    if names and legacy_agent(ctx):
        names.add(LEGACY)  # it can be asked on the call's stream, so upstreams may ask the push way
    return frozenset(names | ({LOGGING} if log_level(ctx) else set()))


async def log_to(ctx: ServerRequestContext, level: str, data: Any, logger: str | None) -> None:
    """A log message on the request's stream, if the agent asked for that level."""
    wanted = log_level(ctx)
    if wanted and level in LEVELS and LEVELS.index(level) >= LEVELS.index(wanted):
        await ctx.session.send_log_message(level, data, logger, related_request_id=ctx.request_id)


class AgentRelay:
    def __init__(self, ctx: ServerRequestContext) -> None:
        self.ctx = ctx
        self.capabilities = declared(ctx)
        # Nothing travels back for an agent that asked for no progress and declared and set nothing.
        self.wanted = bool(self.capabilities) or progress_token_from_params(ctx.params) is not None

    async def progress(self, progress: float, total: float | None, message: str | None) -> None:
        await self.ctx.session.report_progress(progress, total, message)  # a no-op unless the agent asked

    async def log(self, level: str, data: Any, logger: str | None) -> None:
        await log_to(self.ctx, level, data, logger)

    async def ask(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        if not may_ask(method, self.capabilities):
            raise unsupported(method)
        ask = ASKS[method]
        request = ask.request.model_validate({"method": method, "params": params})
        related = ServerMessageMetadata(related_request_id=self.ctx.request_id)  # on the call's own stream
        result = await self.ctx.session.send_request(request, ask.result, metadata=related)
        return result.model_dump(mode="json", by_alias=True, exclude_none=True)
