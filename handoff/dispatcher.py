"""The transport-free MCP layer: one SDK `Server` whose handlers route, decide, audit and execute.
Every transport (Streamable HTTP in both eras, WebSocket) feeds this same server."""

import asyncio
import json
import logging
import time
import uuid
from dataclasses import dataclass, replace
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
from handoff.snapshot import Route, snapshot
from policy.decisions import Denial
from policy.limits import Admission, health_of, limit_store, limits_denial
from policy.redaction import redact, redact_error_result
from registry.executor import get_executor
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


async def _decide(caller: Caller, name: str, request_id: str) -> Decision:
    """The static decision over the snapshot, then admission against shared state (isolation, breaker,
    limits), which takes the call's share of every limit when it admits it."""
    snap = await snapshot.get()
    denial, entry, upstream = snap.decide(caller.agent_id, name)
    if denial or entry is None:
        return Decision(upstream, entry.route if entry else None, denial)
    session = f"{caller.agent_id}:{caller.session_key}"
    admission = Admission(request_id, session, caller.agent_id, snap.agents[caller.agent_id], entry.route.limits)
    verdict = await limit_store().admit(admission)
    if verdict.code:
        return Decision(upstream, entry.route, limits_denial(admission, verdict, name))
    return Decision(upstream, entry.route, admission=admission, probing=verdict.probing)


async def call_tool(ctx: ServerRequestContext, params: types.CallToolRequestParams) -> dict[str, Any]:
    caller = caller_of(ctx)
    arguments = params.arguments or {}
    request_id = uuid.uuid4()
    decision = await _decide(caller, params.name, str(request_id))
    route, denial, admission = decision.route, decision.denial, decision.admission
    audit = {
        "request_id": request_id,
        "agent_id": caller.agent_id,
        "agent_name": caller.agent_name,
        "session_id": caller.session_id,
        "transport": caller.transport,
        "exposed_name": params.name,
        "arguments_sha256": canonical_sha256(arguments),
        "upstream": decision.upstream,
        "tool": route.tool if route else "",
    }
    if denial:
        await _record(kind="denied", outcome="denied", error_code=denial.code, error_detail=denial.message, **audit)
        raise MCPError(denial.jsonrpc_code, denial.message, denial.data() | {"requestId": str(request_id)})
    assert route is not None and admission is not None
    try:
        await _record(kind="approved", **audit)  # before the upstream is touched
        outcome, duration_ms = await _run(route, arguments, audit)
    except BaseException:  # audit refused, or the client left: the admission goes back all the same
        with anyio.CancelScope(shield=True):
            await limit_store().release(admission, "none", decision.probing)
        raise
    result = _for_model(params.name, outcome)
    failed = not outcome["ok"] or bool(result.get("isError"))
    completion = _record(
        kind="completed",
        duration_ms=duration_ms,
        response_bytes=len(json.dumps(result)),
        outcome=("timeout" if outcome.get("code") == "UPSTREAM_TIMEOUT" else "error") if failed else "ok",
        error_code=outcome.get("code", "TOOL_ERROR" if failed else ""),
        error_detail=outcome.get("detail") or (_error_text(outcome["result"]) if failed else ""),
        **audit,
    )
    release = limit_store().release(admission, health_of(outcome.get("code")), decision.probing)
    # Independent writes, so neither waits for the other; shielded, so a client that leaves now loses neither.
    with anyio.CancelScope(shield=True):
        await asyncio.gather(completion, release)
    return _finish(ctx, result)


async def _run(route: Route, arguments: dict[str, Any], audit: dict[str, Any]) -> tuple[Outcome, float]:
    """The outcome and its duration; a cancelled call (the client left) gets its completion row all the same."""
    started = time.perf_counter()
    try:
        outcome = await _execute(route, arguments)
    except anyio.get_cancelled_exc_class():
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
    return outcome, (time.perf_counter() - started) * 1000


async def list_tools(ctx: ServerRequestContext, params: types.PaginatedRequestParams | None) -> dict[str, Any]:
    caller = caller_of(ctx)
    return _finish(ctx, {"tools": list((await snapshot.get()).visible_for(caller.agent_id))})


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
